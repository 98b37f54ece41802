"""Rate limits and budgets shared by every replica through Redis (`limits.redis_url`).

The same limits, headers, errors and metrics as the in-process `Limiter`, but every window and
counter lives in Redis. One Lua script per admission checks every scope of the request and, only
if all pass, counts it in all of them: Redis runs a script alone, so two replicas can never both
take the last slot. Keys, per scope (`{prefix}{kind}:{id}:` then):

- `requests`: sorted set, one member per admitted request scored by its time; the requests of
  the last 60 s are the RPM window. Expires 61 s after the last admission.
- `tokens`: hash, second -> tokens taken in it (estimate at admission, the correction to the real
  count at settle, which may be negative); the seconds wholly older than 60 s are dropped, so the
  TPM window errs by under a second on the strict side. Expires 62 s after its last write.
- `leases`: sorted set of the requests in flight, scored by when their lease lapses (the
  concurrency count); `reserved`: hash, lease -> USD reserved for it. A replica refreshes its
  live leases every third of `lease_s` (default 30 s); a crashed replica's leases lapse within
  `lease_s`, freeing their slots and reservations.
- `spent:{period}:{start}`: USD settled in the budget's current period. Seeded once from the
  store's usage records through the `SpendLoader` (the script asks for a seed when the key is
  missing; `SET NX` so the first seed wins), then increased at settle; it expires an hour after
  its period ends (`total`: a week after its last use, then it is read from the store again).
  A settle never creates it, so it cannot hide the spend recorded before it.

Settling is synchronous for callers: the update runs as a task (kept, awaited by `flush()` and
`close()`), retried twice, idempotent through a short-lived `settled:{lease}` marker.

Redis unreachable at admission: the gateway fails open to this replica's own in-process limits
(the default without Redis), with a warning logged once per outage and
`gateway_limit_local_fallbacks_total` counting the admissions; a background probe pings Redis
every `probe_s` and shared limits resume when it answers. Refusing all traffic because Redis
blinked would be worse than each replica enforcing the limits alone for a while (up to N times
the limit across N replicas). Budget spend is re-read from the store at the start of each outage.

Keys of one admission span scopes, so this needs a single Redis (or a primary), not a cluster.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter
from redis.asyncio import Redis

from gateway import metrics
from gateway.errors import LimitExceeded
from gateway.metering.limits import (
    Budget,
    BudgetWatch,
    Lease,
    Limiter,
    Limits,
    ScopeState,
    SpendLoader,
    check_scope,
    period_start,
)
from gateway.redis_client import ERRORS, REDIS_ERRORS, connect

log = logging.getLogger(__name__)

LOCAL_FALLBACKS = Counter(
    "gateway_limit_local_fallbacks_total",
    "Admissions checked against this replica's own limits because Redis was unreachable.",
    registry=metrics.REGISTRY,
)

# KEYS: 5 per scope: requests, tokens, leases, reserved, spent.
# ARGV: lease id, tokens, cost, lease ms; then 7 per scope: rpm, tpm, max_concurrent, budget usd,
# hard ("1"/"0"), spend seed, spent key ms ("" where there is no such limit or seed).
# Returns {"seed", {scope indexes}} when a budget's spend must be read from the store first, else
# {"ok" | "refused", {per scope: requests, requests_reset, tokens, tokens_reset, in_flight,
# spent, reserved}}: what the scope held before this request.
_ADMIT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local id, tokens, cost, lease_ms = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local n = #KEYS / 5
local function f(x) return string.format('%.17g', x) end

local missing = {}
for i = 0, n - 1 do
  local a = 4 + i * 7
  if ARGV[a + 4] ~= '' then
    local spent = KEYS[i * 5 + 5]
    if ARGV[a + 6] ~= '' then
      redis.call('SET', spent, ARGV[a + 6], 'NX', 'PX', ARGV[a + 7])
    end
    if redis.call('EXISTS', spent) == 0 then missing[#missing + 1] = i end
  end
end
if #missing > 0 then return {'seed', missing} end

local views, refused = {}, false
for i = 0, n - 1 do
  local k, a = i * 5, 4 + i * 7
  local rpm, tpm = tonumber(ARGV[a + 1]), tonumber(ARGV[a + 2])
  local conc, usd = tonumber(ARGV[a + 3]), tonumber(ARGV[a + 4])

  redis.call('ZREMRANGEBYSCORE', KEYS[k + 1], '-inf', now - 60)
  local requests = redis.call('ZCARD', KEYS[k + 1])
  local oldest = redis.call('ZRANGE', KEYS[k + 1], 0, 0, 'WITHSCORES')
  local requests_reset = 0
  if oldest[2] then requests_reset = tonumber(oldest[2]) + 60 - now end

  local buckets = redis.call('HGETALL', KEYS[k + 2])
  local seconds, used = {}, 0
  for j = 1, #buckets, 2 do
    local s = tonumber(buckets[j])
    if s + 1 <= now - 60 then
      redis.call('HDEL', KEYS[k + 2], buckets[j])
    else
      local v = tonumber(buckets[j + 1])
      used = used + v
      seconds[#seconds + 1] = {s, v}
    end
  end
  local tokens_reset = 0
  if tpm then
    table.sort(seconds, function(x, y) return x[1] < y[1] end)
    local needed, freed = tokens - (tpm - used), 0
    tokens_reset = 60
    for _, e in ipairs(seconds) do
      freed = freed + e[2]
      if freed >= needed then
        tokens_reset = math.max(0, e[1] + 1 + 60 - now)
        break
      end
    end
  end

  local lapsed = redis.call('ZRANGEBYSCORE', KEYS[k + 3], '-inf', now)
  if #lapsed > 0 then
    for _, m in ipairs(lapsed) do redis.call('HDEL', KEYS[k + 4], m) end
    redis.call('ZREMRANGEBYSCORE', KEYS[k + 3], '-inf', now)
  end
  local in_flight = redis.call('ZCARD', KEYS[k + 3])
  local reserved = 0
  for _, v in ipairs(redis.call('HVALS', KEYS[k + 4])) do reserved = reserved + tonumber(v) end
  local spent = 0
  if usd then spent = tonumber(redis.call('GET', KEYS[k + 5]) or '0') end

  if (rpm and requests >= rpm) or (tpm and tokens > tpm - used)
      or (conc and in_flight >= conc)
      or (usd and ARGV[a + 5] == '1' and spent + reserved + cost > usd) then
    refused = true
  end
  views[#views + 1] = {
    f(requests), f(requests_reset), f(used), f(tokens_reset), f(in_flight), f(spent), f(reserved)
  }
end
if refused then return {'refused', views} end

for i = 0, n - 1 do
  local k = i * 5
  redis.call('ZADD', KEYS[k + 1], now, id)
  redis.call('PEXPIRE', KEYS[k + 1], 61000)
  if tokens ~= 0 then
    redis.call('HINCRBY', KEYS[k + 2], math.floor(now), ARGV[2])
    redis.call('PEXPIRE', KEYS[k + 2], 62000)
  end
  redis.call('ZADD', KEYS[k + 3], now + lease_ms / 1000, id)
  redis.call('PEXPIRE', KEYS[k + 3], lease_ms + 1000)
  if cost > 0 then
    redis.call('HSET', KEYS[k + 4], id, ARGV[3])
    redis.call('PEXPIRE', KEYS[k + 4], lease_ms + 1000)
  end
end
return {'ok', views}
"""

# KEYS: the settled marker, then 4 per scope: tokens, leases, reserved, spent.
# ARGV: lease id, token correction, real cost; then per scope the spent key's ms ("" no budget).
_SETTLE = """
if not redis.call('SET', KEYS[1], '1', 'NX', 'PX', 10000) then return 0 end
local t = redis.call('TIME')
local second = tonumber(t[1])
local id, delta, cost = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
for i = 0, (#KEYS - 1) / 4 - 1 do
  local k = 1 + i * 4
  redis.call('ZREM', KEYS[k + 2], id)
  redis.call('HDEL', KEYS[k + 3], id)
  if delta ~= 0 then
    redis.call('HINCRBY', KEYS[k + 1], second, ARGV[2])
    redis.call('PEXPIRE', KEYS[k + 1], 62000)
  end
  local ms = ARGV[4 + i]
  if ms ~= '' and cost > 0 and redis.call('EXISTS', KEYS[k + 4]) == 1 then
    redis.call('INCRBYFLOAT', KEYS[k + 4], ARGV[3])
    redis.call('PEXPIRE', KEYS[k + 4], ms)
  end
end
return 1
"""

# KEYS: pairs of (leases, reserved); ARGV: lease ms, then the lease id of each pair.
_REFRESH = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local ms = tonumber(ARGV[1])
for i = 1, #KEYS / 2 do
  redis.call('ZADD', KEYS[2 * i - 1], 'XX', now + ms / 1000, ARGV[i + 1])
  redis.call('PEXPIRE', KEYS[2 * i - 1], ms + 1000)
  redis.call('PEXPIRE', KEYS[2 * i], ms + 1000)
end
return 1
"""

_TOTAL_TTL_S = 7 * 86400.0
# From a period's start, a moment inside the next period.
_INTO_NEXT_S = {"day": 1.5 * 86400, "week": 7.5 * 86400, "month": 32 * 86400}
_REFRESH_BATCH = 200
# A spend read this recent seeds a missing key as well as a new read would.
_SEED_REUSE_S = 5.0


def _spent_ttl_ms(period: str, now: float) -> int:
    if period == "total":
        return int(_TOTAL_TTL_S * 1000)
    end = period_start(period, period_start(period, now) + _INTO_NEXT_S[period])
    return int((end - now + 3600) * 1000)


def _failed(future: asyncio.Future[float]) -> bool:
    return future.done() and (future.cancelled() or future.exception() is not None)


def _opt(value: int | float | None) -> str:
    return "" if value is None else repr(value)


@dataclass
class RedisLease(Lease):
    """A lease counted in Redis: `id` names it in the scopes' sets."""

    id: str = ""


class RedisLimiter(Limiter):
    def __init__(
        self,
        redis: str | Redis,
        spend: SpendLoader,
        *,
        watch: BudgetWatch | None = None,
        prefix: str = "gw:",
        lease_s: float = 30.0,
        probe_s: float = 1.0,
    ) -> None:
        super().__init__(spend, watch)  # the in-process state serves while Redis is unreachable
        self.redis = connect(redis) if isinstance(redis, str) else redis
        self._prefix = prefix
        self._lease_ms = int(lease_s * 1000)
        self._probe_s = probe_s
        self._admit = self.redis.register_script(_ADMIT)
        self._settle_script = self.redis.register_script(_SETTLE)
        self._refresh = self.redis.register_script(_REFRESH)
        self._live: dict[str, RedisLease] = {}
        self._pending: set[asyncio.Task[None]] = set()
        # Spend read from the records per (kind, id, period start): when, and the read.
        self._loading: dict[tuple[str, str, float], tuple[float, asyncio.Future[float]]] = {}
        self._heartbeat: asyncio.Task[None] | None = None
        self._probe: asyncio.Task[None] | None = None
        self.down = False
        self._closed = False

    def _base(self, kind: str, ident: str) -> str:
        return f"{self._prefix}{kind}:{ident}:"

    @staticmethod
    def _spent_key(base: str, budget: Budget | None, now: float) -> str:
        if budget is None:
            return base + "spent"  # unused by the scripts, but KEYS must name a key
        return f"{base}spent:{budget.period}:{int(period_start(budget.period, now))}"

    async def admit(self, scopes: list[tuple[str, str, Limits]], tokens: int, cost: float) -> Lease:
        if not scopes or self.down:
            if scopes:
                LOCAL_FALLBACKS.inc()
            return await super().admit(scopes, tokens, cost)
        now = time.time()
        lease = RedisLease(self, scopes, tokens, cost, id=os.urandom(9).hex())
        keys: list[str] = []
        for kind, ident, limits in scopes:
            base = self._base(kind, ident)
            keys += [base + "requests", base + "tokens", base + "leases", base + "reserved"]
            keys.append(self._spent_key(base, limits.budget, now))
        seeds: dict[int, float] = {}
        for _ in range(3):
            args = [lease.id, str(tokens), repr(float(cost)), str(self._lease_ms)]
            for i, (_kind, _ident, limits) in enumerate(scopes):
                budget = limits.budget
                args += [_opt(limits.rpm), _opt(limits.tpm), _opt(limits.max_concurrent)]
                args += [
                    "" if budget is None else repr(budget.usd),
                    "1" if budget is not None and budget.mode == "hard" else "0",
                    repr(seeds[i]) if i in seeds else "",
                    "" if budget is None else str(_spent_ttl_ms(budget.period, now)),
                ]
            try:
                reply: Any = await self._admit(keys=keys, args=args)
            except ERRORS as error:
                self._lost("admit", error)
                LOCAL_FALLBACKS.inc()
                return await super().admit(scopes, tokens, cost)
            if reply[0] != "seed":
                return self._decide(lease, reply[0], reply[1])
            missing = [int(i) for i in reply[1]]
            loaded = await asyncio.gather(*(self._load(scopes[i], now) for i in missing))
            seeds.update(zip(missing, loaded, strict=True))
        raise RuntimeError("the budget spend keys kept disappearing from Redis")

    def _decide(self, lease: RedisLease, status: str, views: list[list[str]]) -> Lease:
        states = [
            ScopeState(
                requests=int(float(v[0])),
                requests_reset=float(v[1]),
                tokens=int(float(v[2])),
                tokens_reset=float(v[3]),
                in_flight=int(float(v[4])),
                spent=float(v[5]),
                reserved=float(v[6]),
            )
            for v in views
        ]
        if status == "ok":
            self._live[lease.id] = lease
            if self._heartbeat is None or self._heartbeat.done():
                self._heartbeat = asyncio.get_running_loop().create_task(self._refresh_leases())
        try:
            for (kind, ident, limits), state in zip(lease.scopes, states, strict=True):
                check_scope(
                    kind, limits, lease.tokens, lease.cost, state, lease.headers, ident, self.watch
                )
        except LimitExceeded:
            if status == "ok":  # the script and check_scope compare the same numbers; never
                lease.release()
            raise
        if status != "ok":
            raise LimitExceeded("Rate limit reached.")  # as above: never
        return lease

    async def _load(self, scope: tuple[str, str, Limits], now: float) -> float:
        """The scope's spend this period from the usage records. One read serves the requests
        that find the key missing together (their replies come back over some milliseconds)."""
        kind, ident, limits = scope
        assert limits.budget is not None
        start = period_start(limits.budget.period, now)
        key = (kind, ident, start)
        at = time.monotonic()
        loading = self._loading.get(key)
        if loading is None or loading[0] < at - _SEED_REUSE_S or _failed(loading[1]):
            if len(self._loading) > 1000:
                self._loading = {
                    k: v for k, v in self._loading.items() if v[0] >= at - _SEED_REUSE_S
                }
            loading = self._loading[key] = (at, asyncio.ensure_future(self._spend(*key)))
        return await asyncio.shield(loading[1])

    def _settle(self, lease: Lease, cost: float | None, tokens: int | None) -> None:
        if not isinstance(lease, RedisLease):
            super()._settle(lease, cost, tokens)  # admitted locally while Redis was down
            return
        self._live.pop(lease.id, None)
        task = asyncio.get_running_loop().create_task(self._settle_remote(lease, cost, tokens))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _settle_remote(
        self, lease: RedisLease, cost: float | None, tokens: int | None
    ) -> None:
        now = time.time()
        keys = [f"{self._prefix}settled:{lease.id}"]
        delta = 0 if tokens is None else tokens - lease.tokens
        args = [lease.id, str(delta), repr(float(cost or 0.0))]
        for kind, ident, limits in lease.scopes:
            base = self._base(kind, ident)
            keys += [base + "tokens", base + "leases", base + "reserved"]
            keys.append(self._spent_key(base, limits.budget, now))
            budget = limits.budget
            args.append("" if budget is None else str(_spent_ttl_ms(budget.period, now)))
        for attempt in range(3):
            try:
                await self._settle_script(keys=keys, args=args)
                return
            except ERRORS as error:
                REDIS_ERRORS.labels("settle").inc()
                if attempt == 2:
                    log.warning(
                        "could not settle a lease in Redis (%s): its slot and reservation lapse"
                        " within %.0f s; its spend is in the usage records",
                        error,
                        self._lease_ms / 1000,
                    )
                    return
                await asyncio.sleep(0.2 * (attempt + 1))

    async def _refresh_leases(self) -> None:
        """Keep this replica's leases alive while their requests run."""
        # redis-py may swallow the cancellation of a command under way: hence `_closed`.
        while not self._closed:
            await asyncio.sleep(self._lease_ms / 3000)
            leases = list(self._live.values())
            for at in range(0, len(leases), _REFRESH_BATCH):
                keys: list[str] = []
                args = [str(self._lease_ms)]
                for lease in leases[at : at + _REFRESH_BATCH]:
                    for kind, ident, _ in lease.scopes:
                        base = self._base(kind, ident)
                        keys += [base + "leases", base + "reserved"]
                        args.append(lease.id)
                try:
                    await self._refresh(keys=keys, args=args)
                except ERRORS as error:
                    self._lost("refresh", error)
                    break

    def _lost(self, operation: str, error: BaseException) -> None:
        REDIS_ERRORS.labels(operation).inc()
        if self.down:
            return
        self.down = True
        log.warning(
            "Redis unreachable (%s: %r): rate limits and budgets fall back to this replica's"
            " own counts until it answers again",
            operation,
            error,
        )
        # What this replica knew of budget spend is stale by now: read it again from the store.
        for scope in self._scopes.values():
            scope.budget_period = None
        self._probe = asyncio.get_running_loop().create_task(self._wait_for_redis())

    async def _wait_for_redis(self) -> None:
        while not self._closed:
            await asyncio.sleep(self._probe_s)
            try:
                await self.redis.ping()
            except ERRORS:
                REDIS_ERRORS.labels("probe").inc()
                continue
            self.down = False
            log.warning("Redis answers again: rate limits and budgets are shared again")
            return

    async def flush(self) -> None:
        """Wait for the settles under way."""
        while self._pending:
            await asyncio.gather(*self._pending, return_exceptions=True)

    async def close(self) -> None:
        """Finish the settles under way and close the client. Leases still live lapse."""
        if self._closed:
            return
        self._closed = True
        tasks = [t for t in (self._heartbeat, self._probe) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.flush()
        await self.redis.aclose()
