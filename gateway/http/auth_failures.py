"""Failed key attempts, counted per client address: guessing the master key is slowed, logged
and counted (`auth.max_failures` in `auth.failure_window_s`).

A wrong key costs a request one SHA-256, so nothing but this stops thousands of guesses a
second. Past the limit the address gets `429` with `Retry-After` for the rest of its window,
for every wrong key and for the master key itself, so a guess made meanwhile cannot tell a
right one from a wrong one. A virtual key still works from a blocked address (it cannot be
guessed: 256 random bits), so one client guessing behind a proxy or a NAT does not lock every
team out, only the master key.

Logged at WARNING without the key: each failure up to the limit, then the block once; the
refusals during a block are only counted (`gateway_auth_failures_total`).
"""

from __future__ import annotations

import logging
import time

from aiohttp import web

from gateway import metrics

log = logging.getLogger(__name__)

# Addresses remembered at most: past it, those whose window has ended are forgotten.
_ADDRESSES_MAX = 10_000


class FailedKeys:
    def __init__(self, max_failures: int, window_s: float) -> None:
        self.max_failures = max_failures
        self.window_s = window_s
        # Address -> [failures, when its window began (monotonic)].
        self._windows: dict[str, list[float]] = {}

    def blocked_for(self, address: str, now: float | None = None) -> float:
        """Seconds until `address` may try a key again (it has failed `max_failures` times in
        its window); 0 when it may now."""
        window = self._windows.get(address) if self._windows else None
        if window is None or window[0] < self.max_failures:
            return 0.0
        now = time.monotonic() if now is None else now
        return max(0.0, window[1] + self.window_s - now)

    def failed(self, address: str, now: float | None = None) -> float:
        """A wrong key from `address`: the seconds it is now blocked for (0: not yet)."""
        now = time.monotonic() if now is None else now
        window = self._windows.get(address)
        if window is None or window[1] + self.window_s <= now:
            if len(self._windows) >= _ADDRESSES_MAX:
                self._forget_ended(now)
            window = self._windows[address] = [0, now]
        window[0] += 1
        failures = int(window[0])
        if failures > self.max_failures:
            metrics.AUTH_FAILURES.labels("rate_limited").inc()
            return window[1] + self.window_s - now
        metrics.AUTH_FAILURES.labels("refused").inc()
        log.warning(
            "wrong API key from %s (%d of %d allowed in %g s)",
            address,
            failures,
            self.max_failures,
            self.window_s,
        )
        if failures == self.max_failures:
            log.warning(
                "key attempts from %s are refused with 429 for %.0f s",
                address,
                window[1] + self.window_s - now,
            )
        return 0.0

    def _forget_ended(self, now: float) -> None:
        ended = [a for a, (_, start) in self._windows.items() if start + self.window_s <= now]
        for address in ended:
            del self._windows[address]
        if len(self._windows) >= _ADDRESSES_MAX:  # all busy: a flood of addresses
            self._windows.clear()


FAILED_KEYS = web.AppKey("failed_keys", FailedKeys)
