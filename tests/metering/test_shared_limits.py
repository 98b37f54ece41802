"""The limiter `serve --workers N` shares: one `Limiter` behind a Unix socket, admitted through
by every worker. Here the server and two workers' limiters run in one event loop; the test of
real worker processes is tests/metering/test_workers_budget.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gateway.errors import BudgetExceeded, LimitExceeded
from gateway.metering.limits import Limits
from gateway.metering.shared_limits import LimitServer, SharedLimiter
from gateway.metrics import REGISTRY

BUDGET = Limits.model_validate({"budget": {"usd": 1.0, "period": "total"}})


class Spend:
    """A worker's spend loader: what the usage records say, and who was asked."""

    def __init__(self, value: float) -> None:
        self.value = value
        self.asked: list[tuple[str, str, float]] = []

    async def __call__(self, kind: str, ident: str, since: float) -> float:
        self.asked.append((kind, ident, since))
        return self.value


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[LimitServer]:
    server = LimitServer(str(tmp_path / "limits.sock"))
    await server.start()
    yield server
    await server.close()


async def test_two_workers_share_one_budget_and_one_rpm(server: LimitServer) -> None:
    spend_a, spend_b = Spend(0.25), Spend(0.25)
    a, b = SharedLimiter(server.path, spend_a), SharedLimiter(server.path, spend_b)
    try:
        scopes = [("team", "t", BUDGET)]
        # 0.25 spent (read once, from the worker that asked first) + 3 x 0.25 fits 1.0 USD.
        leases = await asyncio.gather(
            a.admit(scopes, 10, 0.25), b.admit(scopes, 10, 0.25), a.admit(scopes, 10, 0.25)
        )
        assert len(spend_a.asked) + len(spend_b.asked) == 1
        with pytest.raises(BudgetExceeded):
            await b.admit(scopes, 10, 0.25)
        held = server.limiter.held("team", "t")
        assert (held.in_flight, held.reserved, held.spent) == (3, 0.75, 0.25)
        # Settled cheaper than reserved: the room comes back, to either worker.
        leases[0].settle(0.05, 8)
        leases[1].settle(0.05, 8)
        lease = await b.admit(scopes, 10, 0.25)
        lease.settle(0.25, 10)
        leases[2].settle(0.2, 10)
        await wait_for(lambda: server.limiter.held("team", "t").in_flight == 0)
        assert server.limiter.held("team", "t").spent == pytest.approx(0.8)

        rpm = [("key", "k", Limits(rpm=3))]
        for limiter in (a, b, a):
            await limiter.admit(rpm, 0, 0.0)
        with pytest.raises(LimitExceeded) as refused:
            await b.admit(rpm, 0, 0.0)
        assert refused.value.headers["x-ratelimit-remaining-requests"] == "0"
        assert "Retry-After" in refused.value.headers
    finally:
        await a.close()
        await b.close()


async def test_a_worker_that_goes_away_frees_its_leases(server: LimitServer) -> None:
    a, b = SharedLimiter(server.path, Spend(0.0)), SharedLimiter(server.path, Spend(0.0))
    try:
        scopes = [("team", "t", Limits.model_validate({"max_concurrent": 2}))]
        await a.admit(scopes, 5, 0.0)
        await a.admit(scopes, 5, 0.0)
        with pytest.raises(LimitExceeded):
            await b.admit(scopes, 5, 0.0)
        await a.close()  # as a worker that crashed: its requests never settle
        await wait_for(lambda: server.limiter.held("team", "t").in_flight == 0)
        await b.admit(scopes, 5, 0.0)
    finally:
        await b.close()


async def test_without_the_supervisor_a_worker_keeps_its_own_limits(tmp_path: Path) -> None:
    limiter = SharedLimiter(str(tmp_path / "nobody.sock"), Spend(0.0))
    before = fallbacks()
    try:
        scopes = [("key", "k", Limits(rpm=1))]
        await limiter.admit(scopes, 0, 0.0)
        with pytest.raises(LimitExceeded):
            await limiter.admit(scopes, 0, 0.0)
        assert fallbacks() == before + 2
    finally:
        await limiter.close()


def fallbacks() -> float:
    return REGISTRY.get_sample_value("gateway_limit_shared_fallbacks_total") or 0.0


async def wait_for(condition: Callable[[], bool]) -> None:
    """Until the supervisor has read the settles written to it (they have no answer)."""
    async with asyncio.timeout(5):
        while not condition():
            await asyncio.sleep(0.005)
