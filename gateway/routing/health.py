"""Per-deployment live state: requests in flight, time to first token, cooldowns.

A deployment that fails `failures` times within `window_s` is skipped for `cooldown_s`; then
one request probes it (half-open). The probe's success makes it healthy again; its failure
starts another cooldown. Only faults that say something about the deployment count (5xx, 429,
timeouts, connection errors), never the client's own mistakes or disconnects.

With Redis, `gateway.routing.cooldowns` shares cooldowns between replicas: `on_cooldown` tells
it when this replica starts or ends one, and `cool_until` applies another replica's.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway import metrics
from gateway.config import CooldownConfig

State = Literal["healthy", "cooling", "half_open"]

_EWMA_ALPHA = 0.3


@dataclass
class DeploymentHealth:
    name: str
    cooldown: CooldownConfig
    max_concurrency: int | None = None
    state: State = "healthy"
    in_flight: int = 0
    cooling_until: float = 0.0
    probing: bool = False
    ttft_ms: float | None = None  # moving average of time to first token
    successes: int = 0
    failures_total: int = 0
    last_error: str | None = None
    _failures: deque[float] = field(default_factory=deque)
    # Called with True when this replica starts a cooldown, False when a probe ends one.
    on_cooldown: Callable[[DeploymentHealth, bool], None] | None = field(
        default=None, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        # At 0 from the start: the first cooldown is then an increase to the alert rule.
        metrics.DEPLOYMENT_TRANSITIONS.labels(self.name, "cooling")

    def available(self, now: float | None = None) -> bool:
        now = time.monotonic() if now is None else now
        if self.state == "cooling" and now >= self.cooling_until:
            self._move("half_open")
        if self.state == "cooling":
            return False
        if self.state == "half_open" and self.probing:
            return False
        return self.max_concurrency is None or self.in_flight < self.max_concurrency

    def acquire(self) -> None:
        self.in_flight += 1
        metrics.DEPLOYMENT_IN_FLIGHT.labels(self.name).inc()
        if self.state == "half_open":
            self.probing = True

    def release(self) -> None:
        self.in_flight -= 1
        metrics.DEPLOYMENT_IN_FLIGHT.labels(self.name).dec()

    def succeeded(self, ttft_ms: float | None) -> None:
        self.successes += 1
        if ttft_ms is not None:
            self.ttft_ms = (
                ttft_ms
                if self.ttft_ms is None
                else self.ttft_ms + _EWMA_ALPHA * (ttft_ms - self.ttft_ms)
            )
        if self.state != "healthy":
            self._failures.clear()
            self._move("healthy")
            if self.on_cooldown is not None:
                self.on_cooldown(self, False)
        self.probing = False

    def failed(self, label: str, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        self.failures_total += 1
        self.last_error = label
        self.probing = False
        if self.state == "half_open":
            self._cool(now)
            return
        self._failures.append(now)
        while self._failures and self._failures[0] < now - self.cooldown.window_s:
            self._failures.popleft()
        if len(self._failures) >= self.cooldown.failures:
            self._cool(now)

    def _cool(self, now: float) -> None:
        self.cooling_until = now + self.cooldown.cooldown_s
        self._failures.clear()
        self._move("cooling")
        if self.on_cooldown is not None:
            self.on_cooldown(self, True)

    def cool_until(self, until: float, now: float | None = None) -> None:
        """Another replica's cooldown: skip this deployment until `until` (this process's
        monotonic clock); a time already past ends a cooldown (then one request probes)."""
        now = time.monotonic() if now is None else now
        if until > now:
            self.cooling_until = until
            self._failures.clear()
            self._move("cooling")
        elif self.state == "cooling":
            self.cooling_until = until

    def _move(self, state: State) -> None:
        if state == self.state:
            return
        self.state = state
        metrics.DEPLOYMENT_TRANSITIONS.labels(self.name, state).inc()
        for known in ("healthy", "cooling", "half_open"):
            metrics.DEPLOYMENT_STATE.labels(self.name, known).set(1 if known == state else 0)

    def snapshot(self) -> dict[str, Any]:
        now = time.monotonic()
        self.available(now)  # let an expired cooldown show as half-open
        return {
            "state": self.state,
            "in_flight": self.in_flight,
            "cooldown_remaining_s": round(max(0.0, self.cooling_until - now), 3)
            if self.state == "cooling"
            else 0.0,
            "ttft_ms": None if self.ttft_ms is None else round(self.ttft_ms, 2),
            "successes": self.successes,
            "failures": self.failures_total,
            "recent_failures": len(self._failures),
            "last_error": self.last_error,
        }
