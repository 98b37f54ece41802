"""An attempt's deadline, moved on every upstream read without touching the event loop's timers.

The idle timeout restarts with every chunk, and a stream has dozens of them a second:
rescheduling an `asyncio.Timeout` each time cancels one timer handle and pushes another onto
the loop's heap, twice a chunk (once when the chunk arrives, once around the write to the
client). Here `set()` only stores the new time; one timer handle is kept at the earliest time
the deadline could pass, and when it fires it either expires the timeout (the deadline has
passed) or moves itself to the deadline as it now stands.
"""

from __future__ import annotations

import asyncio


class Deadline:
    """A deadline for the body of an `asyncio.timeout(None)` context: `timeout` is expired,
    cancelling what that context awaits, once the time last `set()` has passed."""

    __slots__ = ("_handle", "_loop", "_wake_at", "timeout", "when")

    def __init__(self, timeout: asyncio.Timeout, loop: asyncio.AbstractEventLoop) -> None:
        self.timeout = timeout
        self._loop = loop
        self.when: float | None = None  # None: no deadline, for now
        self._handle: asyncio.TimerHandle | None = None
        self._wake_at = 0.0  # when `_handle` fires

    def set(self, when: float | None) -> None:
        """The deadline is now `when` (loop time), or none while `when` is None."""
        self.when = when
        if when is not None and (self._handle is None or when < self._wake_at):
            self._arm(when)

    def expire(self) -> None:
        """Expire now, whatever the deadline (an explicit cancel)."""
        self.close()
        self.when = self._loop.time()
        self.timeout.reschedule(self.when)

    def close(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self, when: float) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._wake_at = when
        self._handle = self._loop.call_at(when, self._fire)

    def _fire(self) -> None:
        self._handle = None
        when = self.when
        if when is None or self.timeout.expired():
            return  # no deadline now (the next set() arms one), or expired already
        if when <= self._loop.time():
            self.timeout.reschedule(when)  # in the past: the timeout expires at once
        else:
            self._arm(when)
