"""Deployment cooldowns shared by every replica through Redis (`limits.redis_url`).

When a deployment starts cooling on one replica (`DeploymentHealth.on_cooldown`), the replica
writes `{prefix}cooldown:{deployment}` = a random token, expiring when the cooldown ends (a
script keeps the longer of two cooldowns). Every replica reads all those keys every
`interval_s` (0.5 s) in one script call, token and remaining time (PTTL) together, and applies
the cooldowns of the others to its own `DeploymentHealth` (`cool_until`). Remaining time rather
than a wall-clock deadline: replicas' clocks may disagree, Redis's TTL countdown does not. A
replica whose probe succeeds deletes the key if it still holds the token it knows (never a newer
cooldown another replica started since); the others then end the cooldown they took from it, and
each probes the deployment with one request.

Polling rather than pub/sub: one round trip per replica every half second is nothing for Redis,
a poll catches up by itself after a dropped connection (pub/sub loses what was published
meanwhile, so it needs a resync poll anyway), and it needs no dedicated connection. A cooldown
reaches the other replicas within `interval_s`; until then they may send it a few more requests,
as they would without sharing.

Redis unreachable: each replica keeps its own cooldowns, as without Redis; a warning is logged
once per outage and `gateway_redis_errors_total` counts the failed calls.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Coroutine, Iterable
from typing import Any

from redis.asyncio import Redis

from gateway.redis_client import ERRORS, REDIS_ERRORS, connect
from gateway.routing.health import DeploymentHealth

log = logging.getLogger(__name__)

# KEYS[1]: the cooldown key; ARGV: token, ms. The longer cooldown wins.
_PUBLISH = """
local ms = tonumber(ARGV[2])
if redis.call('PTTL', KEYS[1]) < ms then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ms)
  return 1
end
return 0
"""

# KEYS[1]: the cooldown key; ARGV[1]: the token it must still hold.
_CLEAR = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# KEYS: every cooldown key. Returns {token or '', PTTL (-2: none)} for each.
_READ = """
local out = {}
for i, key in ipairs(KEYS) do
  out[i] = {redis.call('GET', key) or '', redis.call('PTTL', key)}
end
return out
"""

# A shared cooldown this close to the local one is the same cooldown (the local one, published).
_SLACK_S = 0.05


class CooldownSync:
    def __init__(
        self,
        redis: str | Redis,
        prefix: str,
        deployments: Iterable[DeploymentHealth],
        *,
        interval_s: float = 0.5,
    ) -> None:
        self._owns_client = isinstance(redis, str)
        self.redis = connect(redis) if isinstance(redis, str) else redis
        self._prefix = prefix
        self._interval_s = interval_s
        self._health = {h.name: h for h in deployments}
        self._keys = [self._key(name) for name in self._health]
        self._publish = self.redis.register_script(_PUBLISH)
        self._clear = self.redis.register_script(_CLEAR)
        self._read = self.redis.register_script(_READ)
        self._known: dict[str, str] = {}  # per deployment: the token last published or read
        self._mine: dict[str, str] = {}  # per deployment: the token this replica published last
        self._applied: dict[str, float] = {}  # per deployment: another replica's cooldown end
        self._pending: set[asyncio.Task[None]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._failing = False
        self._closing = False

    def track(self, deployments: Iterable[DeploymentHealth]) -> None:
        """Share these deployments' cooldowns from now on, instead of the ones before (the
        deployments of a reloaded config)."""
        self._health = {h.name: h for h in deployments}
        self._keys = [self._key(name) for name in self._health]
        if self._poller is not None:
            for health in self._health.values():
                health.on_cooldown = self._changed

    def _key(self, deployment: str) -> str:
        return f"{self._prefix}cooldown:{deployment}"

    def start(self) -> None:
        for health in self._health.values():
            health.on_cooldown = self._changed
        self._poller = asyncio.get_running_loop().create_task(self._poll())

    def _changed(self, health: DeploymentHealth, cooling: bool) -> None:
        """This replica started a cooldown (publish it) or a probe ended one (clear it)."""
        self._applied.pop(health.name, None)
        if cooling:
            ms = max(1, int((health.cooling_until - time.monotonic()) * 1000))
            token = self._known[health.name] = self._mine[health.name] = os.urandom(8).hex()
            self._spawn("cooldown_publish", self._publish, health.name, [token, str(ms)])
        elif (known := self._known.get(health.name)) is not None:
            self._spawn("cooldown_clear", self._clear, health.name, [known])

    def _spawn(self, operation: str, script: Any, deployment: str, args: list[str]) -> None:
        task = asyncio.get_running_loop().create_task(
            self._call(operation, script(keys=[self._key(deployment)], args=args))
        )
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _call(self, operation: str, call: Coroutine[Any, Any, Any]) -> None:
        try:
            await call
        except ERRORS as error:
            self._failed(operation, error)

    async def sync(self) -> None:
        """Read every shared cooldown once and apply the other replicas' here."""
        healths, keys = self._health, self._keys  # as they were asked for: a reload may swap
        if not keys:
            return
        reply: Any = await self._read(keys=keys)
        now = time.monotonic()
        for (name, health), (token, pttl) in zip(healths.items(), reply, strict=True):
            if int(pttl) > 0:
                self._known[name] = token
                if token == self._mine.get(name):
                    continue  # this replica's own cooldown, already in force here
                until = now + int(pttl) / 1000
                if health.state != "cooling" or health.cooling_until < until - _SLACK_S:
                    health.cool_until(until, now)
                    self._applied[name] = until
            elif (
                (applied := self._applied.pop(name, None)) is not None
                and health.state == "cooling"
                and health.cooling_until == applied
            ):
                health.cool_until(now, now)  # another replica's probe ended it early

    async def _poll(self) -> None:
        while True:
            try:
                await self.sync()
            except ERRORS as error:
                self._failed("cooldown_poll", error)
            else:
                if self._failing:
                    self._failing = False
                    log.warning("Redis answers again: deployment cooldowns are shared again")
            if self._closing:
                return  # redis-py may swallow the cancellation of a command under way
            await asyncio.sleep(self._interval_s)

    def _failed(self, operation: str, error: BaseException) -> None:
        REDIS_ERRORS.labels(operation).inc()
        if not self._failing:
            self._failing = True
            log.warning(
                "Redis unreachable (%s: %r): deployment cooldowns stay local until it answers",
                operation,
                error,
            )

    async def flush(self) -> None:
        """Wait for the publishes and clears under way."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def close(self) -> None:
        self._closing = True
        for health in self._health.values():
            if health.on_cooldown == self._changed:
                health.on_cooldown = None
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)
        await self.flush()
        if self._owns_client:
            await self.redis.aclose()
