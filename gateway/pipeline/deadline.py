"""An attempt's deadlines, kept as numbers: one watchdog timer per event loop serves them all.

Every attempt has a deadline (the first token's, the idle gap's, the total's), and the idle one
moves with every upstream chunk, dozens of times a second. A timer per attempt would cost a
timer handle and its cancel on every chunk (docs/decisions.md, "One watchdog for every
deadline"); here `set()` only stores the time. The loop's one `Watchdog`, ticking while any
attempt is under way, cancels the task of an attempt whose deadline has passed: on time for a
deadline it saw at its last tick, at most `TICK_S` late for one moved earlier since. The relay
turns that cancellation into a timeout (`took_back`), as `asyncio.timeout` does: only when no
one else cancelled the task as well.

`AttemptClock` says which of an attempt's three deadlines applies now.
"""

from __future__ import annotations

import asyncio

from gateway.errors import UpstreamTimeout

TICK_S = 0.05  # the longest a watchdog sleeps while it watches anything


class Watchdog:
    """The deadlines under way on one event loop, and the one timer that checks them."""

    __slots__ = ("_handle", "_live", "loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._live: set[Deadline] = set()
        self._handle: asyncio.TimerHandle | None = None

    def watch(self, task: asyncio.Task[object]) -> Deadline:
        """A deadline for `task`, none set yet."""
        deadline = Deadline(self, task)
        self._live.add(deadline)
        if self._handle is None:
            self._handle = self.loop.call_at(self.loop.time() + TICK_S, self._tick)
        return deadline

    def watching(self) -> int:
        return len(self._live)

    def _tick(self) -> None:
        self._handle = None
        now = self.loop.time()
        soonest = now + TICK_S
        for deadline in list(self._live):
            when = deadline.when
            if when is None:
                continue
            if when <= now:
                deadline.expire()
            elif when < soonest:
                soonest = when
        if self._live:  # idle while nothing is under way: no timer at all
            self._handle = self.loop.call_at(soonest, self._tick)


_watchdog: Watchdog | None = None


def watchdog(loop: asyncio.AbstractEventLoop) -> Watchdog:
    """The watchdog of `loop` (a new one when the loop changed, as between tests: a deadline
    keeps the watchdog it was made by, whose timer runs on its own loop)."""
    global _watchdog
    current = _watchdog
    if current is None or current.loop is not loop:
        current = _watchdog = Watchdog(loop)
    return current


class Deadline:
    """When an attempt's task is cancelled: the time last `set()` (loop time; None: none for
    now), or at once on `expire()`."""

    __slots__ = ("_task", "_watchdog", "expired", "when")

    def __init__(self, watchdog: Watchdog, task: asyncio.Task[object]) -> None:
        self._watchdog = watchdog
        self._task: asyncio.Task[object] | None = task
        self.when: float | None = None
        self.expired = False

    def set(self, when: float | None) -> None:
        self.when = when

    def expire(self) -> None:
        """Cancel the task now, whatever the deadline (the watchdog's call; an explicit cancel
        from another connection). Once: a second cancel would read as someone else's."""
        if self.expired or self._task is None:
            return
        self.expired = True
        self._watchdog._live.discard(self)
        self._task.cancel()

    def took_back(self) -> bool:
        """On a CancelledError in the attempt: whether it is this deadline's alone (it expired,
        and nothing else, such as the client going away, asked the task to cancel). Its own
        cancel request is withdrawn either way, once."""
        task = self._task
        if not self.expired or task is None:
            return False
        self._task = None
        return task.uncancel() == 0

    def close(self) -> None:
        """The attempt is over: no longer watched (an expiry it never saw is withdrawn)."""
        self._watchdog._live.discard(self)
        if self.expired and self._task is not None:
            self._task.uncancel()
        self._task = None


class AttemptClock:
    """An attempt's deadlines: the first token's until content arrives (`holding`), then the
    idle gap's, each within the total's."""

    __slots__ = ("first_token", "holding", "idle_s", "loop", "timer", "total")

    def __init__(
        self,
        timer: Deadline,
        loop: asyncio.AbstractEventLoop,
        *,
        first_token_s: float,
        idle_s: float,
        total_s: float,
    ) -> None:
        self.timer = timer
        self.loop = loop
        start = loop.time()
        self.first_token = start + first_token_s
        self.total = start + total_s
        self.idle_s = idle_s
        self.holding = True  # nothing has reached the client yet: a failure can be retried

    def arm(self) -> None:
        """Before each wait on the upstream: the deadline as of now."""
        phase = self.first_token if self.holding else self.loop.time() + self.idle_s
        self.timer.set(min(phase, self.total))

    def pause(self) -> None:
        """While a write waits on a slow client: that is not an idle upstream."""
        self.timer.set(None)

    def timeout_error(self) -> UpstreamTimeout:
        if self.loop.time() >= self.total:
            return UpstreamTimeout("the upstream request exceeded its total timeout", phase="total")
        if self.holding:
            return UpstreamTimeout(
                "the upstream sent no content before the first-token timeout", phase="first_token"
            )
        return UpstreamTimeout("the upstream sent nothing within the idle timeout", phase="idle")
