"""Rate limits and budgets in Redis: two RedisLimiters on one real Redis are two replicas."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import aiohttp
import openai
import pytest

from gateway.errors import BudgetExceeded, LimitExceeded
from gateway.metering.limits import Budget, Lease, Limits
from gateway.metering.redis_limits import RedisLimiter
from gateway.metrics import REGISTRY
from tests.conftest import GatewayUnderTest, MakeGateway

if TYPE_CHECKING:
    from tests.redis_server import RedisServer


MakeLimiter = Callable[..., RedisLimiter]
# Dyadic amounts, so that sums of them are exact in binary floating point.
COST = 2.0**-10  # ~0.001 USD
BUDGET = Limits(budget=Budget(usd=0.01, period="day"))


def sample(name: str, **labels: str) -> float:
    """A metric's value, as /metrics exports it (0 before its first update)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


async def no_spend(kind: str, ident: str, since: float) -> float:
    return 0.0


@pytest.fixture
async def replicas(redis_url: str, redis_prefix: str) -> AsyncIterator[MakeLimiter]:
    made: list[RedisLimiter] = []

    def make(spend: Any = no_spend, url: str = redis_url, **options: Any) -> RedisLimiter:
        made.append(RedisLimiter(url, spend, prefix=redis_prefix, **options))
        return made[-1]

    yield make
    for limiter in made:
        if limiter.redis.connection_pool is not None:
            await limiter.close()


async def outcomes(*admissions: Any) -> tuple[list[Lease], list[LimitExceeded]]:
    results = await asyncio.gather(*admissions, return_exceptions=True)
    for result in results:
        if not isinstance(result, Lease | LimitExceeded):
            raise result
    return (
        [r for r in results if isinstance(r, Lease)],
        [r for r in results if isinstance(r, LimitExceeded)],
    )


async def eventually(condition: Callable[[], Any], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not await condition():
            await asyncio.sleep(0.02)


async def test_requests_per_minute_hold_across_replicas(replicas: MakeLimiter) -> None:
    a, b = replicas(), replicas()
    scopes = [("key", "k", Limits(rpm=3))]
    first = await a.admit(scopes, 0, 0.0)
    assert first.headers["x-ratelimit-limit-requests"] == "3"
    assert first.headers["x-ratelimit-remaining-requests"] == "2"
    second = await b.admit(scopes, 0, 0.0)
    assert second.headers["x-ratelimit-remaining-requests"] == "1"
    await a.admit(scopes, 0, 0.0)
    for replica in (a, b):
        with pytest.raises(LimitExceeded) as caught:
            await replica.admit(scopes, 0, 0.0)
        error = caught.value
        assert error.status == 429 and error.code == "rate_limit_exceeded"
        assert "3 requests per minute" in error.message
        assert 1 <= int(error.headers["Retry-After"]) <= 60
        assert error.headers["x-ratelimit-remaining-requests"] == "0"


async def test_two_replicas_never_both_take_the_last_slot(replicas: MakeLimiter) -> None:
    a, b = replicas(), replicas()
    scopes = [("team", "t", Limits(rpm=7))]
    admitted, refused = await outcomes(*(r.admit(scopes, 0, 0.0) for r in [a, b] * 20))
    assert len(admitted) == 7 and len(refused) == 33
    assert {lease.limiter for lease in admitted} == {a, b}


async def test_concurrency_holds_across_replicas(replicas: MakeLimiter) -> None:
    a, b = replicas(), replicas()
    scopes = [("key", "k", Limits(max_concurrent=2))]
    held = [await a.admit(scopes, 0, 0.0), await b.admit(scopes, 0, 0.0)]
    for replica in (a, b):
        with pytest.raises(LimitExceeded, match="2 concurrent requests"):
            await replica.admit(scopes, 0, 0.0)
    held[0].release()  # on replica a: the slot frees for b
    await a.flush()
    held.append(await b.admit(scopes, 0, 0.0))
    with pytest.raises(LimitExceeded):
        await a.admit(scopes, 0, 0.0)


async def test_key_and_team_scopes_are_checked_together(replicas: MakeLimiter) -> None:
    a, b = replicas(), replicas()
    team = ("team", "t", Limits(rpm=2))
    await a.admit([("key", "k1", Limits(rpm=5)), team], 0, 0.0)
    await b.admit([("key", "k2", Limits(rpm=5)), team], 0, 0.0)
    with pytest.raises(LimitExceeded, match="for this team"):
        await a.admit([("key", "k1", Limits(rpm=5)), team], 0, 0.0)
    # The refused request counted nowhere: k1 still has 4 of its 5 left.
    lease = await a.admit([("key", "k1", Limits(rpm=5))], 0, 0.0)
    assert lease.headers["x-ratelimit-remaining-requests"] == "3"


async def test_hard_budget_holds_under_50_concurrent_admissions(replicas: MakeLimiter) -> None:
    loads: list[str] = []

    async def spend(kind: str, ident: str, since: float) -> float:
        loads.append(ident)
        await asyncio.sleep(0.01)  # the other replica's admissions arrive meanwhile
        return 4 * COST  # spent earlier today, according to the usage records

    a, b = replicas(spend), replicas(spend)
    scopes = [("team", "t", BUDGET)]
    admitted, refused = await outcomes(*(r.admit(scopes, 100, COST) for r in [a, b] * 25))
    # 0.01 USD holds 10 requests of COST: 4 spent before, 6 reserved now, never a 7th.
    assert len(admitted) == 6 and len(refused) == 44
    assert all(isinstance(e, BudgetExceeded) and e.code == "budget_exceeded" for e in refused)
    assert "reserved by requests in flight" in refused[0].message
    assert 1 <= len(loads) <= 2  # at most one read of the records per replica, SET NX keeps one
    for lease in admitted:
        lease.settle(COST / 2, 50)  # each cost half its estimate
    await a.flush()
    await b.flush()
    # 4 + 6 * 0.5 = 7 spent: room for 3 more, however the requests are spread.
    admitted, refused = await outcomes(*(r.admit(scopes, 100, COST) for r in [a, b] * 5))
    assert len(admitted) == 3 and len(refused) == 7


async def test_the_first_seed_of_spend_wins(replicas: MakeLimiter) -> None:
    calls: list[str] = []

    def loader(amount: float) -> Any:
        async def spend(kind: str, ident: str, since: float) -> float:
            calls.append(f"{amount}")
            return amount

        return spend

    a, b = replicas(loader(8 * COST)), replicas(loader(0.0))
    scopes = [("key", "k", BUDGET)]
    await a.admit(scopes, 0, COST)
    await b.admit(scopes, 0, COST)  # b finds a's seed in Redis: it reads no records
    assert calls == [f"{8 * COST}"]
    with pytest.raises(BudgetExceeded):
        await b.admit(scopes, 0, COST)


async def test_soft_budget_warns_on_every_replica(replicas: MakeLimiter) -> None:
    a, b = replicas(), replicas()
    scopes = [("key", "k", Limits(budget=Budget(usd=COST, period="total", mode="soft")))]
    lease = await a.admit(scopes, 0, COST)
    assert "X-Gateway-Budget-Warning" not in lease.headers
    lease.settle(COST, 10)
    await a.flush()
    warned = await b.admit(scopes, 0, COST)
    assert (
        "budget of 0.000976562 USD per total is spent" in warned.headers["X-Gateway-Budget-Warning"]
    )


async def test_settle_corrects_tokens_and_spend(replicas: MakeLimiter) -> None:
    a, b = replicas(), replicas()
    scopes = [("key", "k", Limits(tpm=1000, budget=Budget(usd=8 * COST, period="month")))]
    lease = await a.admit(scopes, 600, 4 * COST)
    assert lease.headers["x-ratelimit-remaining-tokens"] == "400"
    with pytest.raises(LimitExceeded, match="1000 tokens per minute") as caught:
        await b.admit(scopes, 600, COST)
    assert caught.value.headers["x-ratelimit-remaining-tokens"] == "0"
    with pytest.raises(BudgetExceeded):
        await b.admit(scopes, 100, 5 * COST)  # 4 reserved + 5 > 8
    lease.settle(2 * COST, 100)  # the real count and cost
    await a.flush()
    second = await b.admit(scopes, 600, 5 * COST)  # 100 + 600 tokens; 2 spent + 5 reserved
    assert second.headers["x-ratelimit-remaining-tokens"] == "300"
    with pytest.raises(LimitExceeded, match="tokens per minute"):
        await a.admit(scopes, 400, 0.0)
    with pytest.raises(BudgetExceeded, match=r"0\.001953 USD used"):
        await a.admit(scopes, 300, 2 * COST)  # 2 + 5 + 2 > 8
    second.release()  # ended before it was metered: nothing spent, its tokens given back
    await b.flush()
    await a.admit(scopes, 900, 6 * COST)


async def test_a_crashed_replicas_lease_lapses(replicas: MakeLimiter) -> None:
    a, b = replicas(lease_s=0.5), replicas(lease_s=0.5)
    scopes = [("key", "k", Limits(max_concurrent=1))]
    await a.admit(scopes, 0, 0.0)
    # While a lives it keeps its lease, well past lease_s.
    deadline = time.monotonic() + 1.2
    while time.monotonic() < deadline:
        with pytest.raises(LimitExceeded):
            await b.admit(scopes, 0, 0.0)
        await asyncio.sleep(0.1)
    await a.close()  # a stops without settling: nobody keeps its lease alive

    async def b_admitted() -> bool:
        try:
            await b.admit(scopes, 0, 0.0)
            return True
        except LimitExceeded:
            return False

    started = time.monotonic()
    await eventually(b_admitted, timeout=3)
    assert time.monotonic() - started < 1.0


async def test_redis_down_fails_open_to_local_limits(
    replicas: MakeLimiter,
    caplog: pytest.LogCaptureFixture,
    unused_tcp_port: int,
    start_redis: Callable[[int], RedisServer],
) -> None:
    port = unused_tcp_port  # nothing listens there
    limiter = replicas(url=f"redis://127.0.0.1:{port}/0", probe_s=0.05)
    fallbacks = sample("gateway_limit_local_fallbacks_total")
    errors = sample("gateway_redis_errors_total", operation="admit")
    scopes = [("key", "k", Limits(rpm=2))]
    with caplog.at_level(logging.WARNING, logger="gateway.metering.redis_limits"):
        started = time.monotonic()
        first = await limiter.admit(scopes, 0, 0.0)
        await limiter.admit(scopes, 0, 0.0)
        assert time.monotonic() - started < 2
        # This replica's own limits still apply meanwhile.
        with pytest.raises(LimitExceeded):
            await limiter.admit(scopes, 0, 0.0)
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    first.settle(0.0, 0)
    assert sample("gateway_limit_local_fallbacks_total") == fallbacks + 3
    assert sample("gateway_redis_errors_total", operation="admit") == errors + 1
    warnings = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert len(warnings) == 1 and limiter.down

    # Redis comes up: the probe notices, and the limits are shared again.
    server = start_redis(port)

    async def up() -> bool:
        return not limiter.down

    await eventually(up)
    other = replicas(url=server.url)
    shared = [("key", "shared", Limits(rpm=1))]
    await limiter.admit(shared, 0, 0.0)
    with pytest.raises(LimitExceeded):
        await other.admit(shared, 0, 0.0)


async def test_no_limits_no_redis_call(replicas: MakeLimiter, unused_tcp_port: int) -> None:
    limiter = replicas(url=f"redis://127.0.0.1:{unused_tcp_port}/0")
    lease = await limiter.admit([], 0, 0.0)
    lease.settle(0.1, 10)
    assert not limiter.down


# End to end: two gateways (replicas) sharing one Redis and one store.

MASTER = "master-key-for-tests-0123456789"
HELLO = [{"role": "user", "content": "Hello"}]


async def two_gateways(
    make_gateway: MakeGateway, redis_url: str, redis_prefix: str
) -> tuple[GatewayUnderTest, GatewayUnderTest]:
    sections = {
        "auth": {"master_key": MASTER},
        "limits": {"redis_url": redis_url, "redis_prefix": redis_prefix},
    }
    return await make_gateway(**sections), await make_gateway(**sections)


async def test_rpm_holds_across_two_gateways(
    make_gateway: MakeGateway, redis_url: str, redis_prefix: str
) -> None:
    one, two = await two_gateways(make_gateway, redis_url, redis_prefix)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        async with session.post(one.url + "/v1/gateway/teams", json={"id": "t", "name": "T"}) as r:
            assert r.status == 201, await r.text()
        key = {"team_id": "t", "limits": {"rpm": 3}}
        async with session.post(one.url + "/v1/gateway/keys", json=key) as r:
            assert r.status == 201, await r.text()
            secret: str = (await r.json())["key"]
    apis = [one.client(api_key=secret), two.client(api_key=secret)]
    answer = await apis[0].chat.completions.with_raw_response.create(model="demo", messages=HELLO)
    assert answer.headers["x-ratelimit-remaining-requests"] == "2"
    answer = await apis[1].chat.completions.with_raw_response.create(model="demo", messages=HELLO)
    assert answer.headers["x-ratelimit-remaining-requests"] == "1"
    await apis[1].chat.completions.create(model="demo", messages=HELLO)
    for api in apis:
        with pytest.raises(openai.RateLimitError) as caught:
            await api.chat.completions.create(model="demo", messages=HELLO)
        assert caught.value.code == "rate_limit_exceeded"
        assert int(caught.value.response.headers["Retry-After"]) >= 1
