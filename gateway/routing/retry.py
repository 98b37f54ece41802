"""Which deployment to try next, and how long to wait first.

Each try moves to the least-tried deployment of the plan, in plan order; trying one again
waits an exponential backoff with jitter, or the upstream's Retry-After when that is longer (a
Retry-After beyond the cap takes the deployment out of this request). Attempts and total time
are bounded by the alias's `retry` config. The caller decides whether an error may be retried at
all (only before the client has received anything).
"""

from __future__ import annotations

import asyncio
import random
import time

from gateway import metrics
from gateway.errors import UpstreamError, UpstreamHTTPError
from gateway.routing.router import Alias, Deployment


class RetryPlan:
    def __init__(self, alias: Alias, plan: list[Deployment]) -> None:
        self._alias = alias
        self._plan = plan
        self._retry = alias.retry
        self._started = time.monotonic()
        self._tries: dict[str, int] = {}
        self._errors: dict[str, UpstreamError] = {}
        self._skip: set[str] = set()
        self.attempts = 0
        self.last_error: UpstreamError | None = None

    def failed(self, deployment: Deployment, error: UpstreamError) -> None:
        # Kept without its traceback, whose frames (the relay's, with this plan in them) would
        # hold the request's whole object graph in a cycle once the request is answered.
        self._errors[deployment.name] = self.last_error = error.with_traceback(None)

    async def next(self) -> Deployment | None:
        """The deployment to try now (after any wait), or None when the budget is spent."""
        if self.last_error is not None and not self.last_error.retryable:
            return None
        if not self.attempts and self._plan and self._retry.max_attempts > 0:
            # The first try of every request: the plan's best, no wait (what the loop picks).
            first = self._plan[0]
            self._tries[first.name] = self.attempts = 1
            return first
        while self.attempts < self._retry.max_attempts:
            candidates = [d for d in self._plan if d.name not in self._skip]
            if not candidates:
                return None
            fewest = min(self._tries.get(d.name, 0) for d in candidates)
            deployment = next(d for d in candidates if self._tries.get(d.name, 0) == fewest)
            elapsed = time.monotonic() - self._started
            if fewest:
                wait = self._backoff(fewest, self._errors.get(deployment.name))
                if wait is None:
                    self._skip.add(deployment.name)
                    continue
                if elapsed + wait > self._retry.max_total_s:
                    return None
                await asyncio.sleep(wait)
            elif self.last_error is not None and elapsed > self._retry.max_total_s:
                return None
            self._tries[deployment.name] = fewest + 1
            self.attempts += 1
            if self.last_error is not None:
                metrics.RETRIES.labels(self._alias.name, self.last_error.label).inc()
            return deployment
        return None

    def _backoff(self, tries: int, error: UpstreamError | None) -> float | None:
        retry = self._retry
        wait: float = min(retry.max_backoff_s, retry.backoff_s * 2.0 ** (tries - 1))
        wait *= 0.5 + random.random() / 2  # jitter: retries from many clients do not align
        if isinstance(error, UpstreamHTTPError) and error.retry_after is not None:
            if error.retry_after > retry.retry_after_cap_s:
                return None
            wait = max(wait, error.retry_after)
        return wait
