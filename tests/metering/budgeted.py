"""A team with a hard budget, on each backend, and 64 requests sent at it at once.

`backend` runs a test on SQLite with the in-process limiter, and on PostgreSQL with the limits
in Redis. `Held` holds every answer an upstream gives until the test has seen each request
decided (arrived upstream, or refused with 429), so that every admitted request is in flight
at once: the worst case for a reservation, reached without sleeping.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "master-key-for-tests-0123456789"
CONCURRENT = 64


@pytest.fixture(params=["sqlite", "postgresql+redis"])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The gateway sections of a backend: the store's URL and the limiter's Redis."""
    if request.param == "sqlite":
        return {}
    return {
        "store": {"url": request.getfixturevalue("pg_url")},
        "limits": {
            "redis_url": request.getfixturevalue("redis_url"),
            "redis_prefix": request.getfixturevalue("redis_prefix"),
        },
    }


async def budgeted_team(
    make_gateway: MakeGateway,
    models: list[dict[str, Any]],
    budget: dict[str, Any],
    **sections: Any,
) -> tuple[GatewayUnderTest, str]:
    """A gateway, a team `t` with `budget`, and a key of it."""
    gw = await make_gateway(models=models, auth={"master_key": MASTER}, **sections)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        team = {"id": "t", "name": "T", "limits": {"budget": budget}}
        async with session.post(gw.url + "/v1/gateway/teams", json=team) as r:
            assert r.status == 201, await r.text()
        async with session.post(gw.url + "/v1/gateway/keys", json={"team_id": "t"}) as r:
            assert r.status == 201, await r.text()
            secret: str = (await r.json())["key"]
    return gw, secret


async def spent(gw: GatewayUnderTest) -> float:
    """What the team's usage rows cost, once every write is in the store."""
    await gw.flush()
    return await gw.gateway.usage.spent("team", "t", 0.0)


class Held:
    """Counts each request as decided, and holds the upstream's answers until all are."""

    def __init__(self, total: int = CONCURRENT) -> None:
        self.total = total
        self.arrived = 0  # reached the upstream: admitted
        self.refused = 0  # answered 429 budget_exceeded
        self.decided = asyncio.Event()
        self.release = asyncio.Event()
        if total == 0:  # nothing to wait for: answers go at once
            self.release.set()

    def _check(self) -> None:
        if self.arrived + self.refused >= self.total:
            self.decided.set()

    async def arrive(self) -> None:
        """An upstream request: counted, then held until every request is decided."""
        self.arrived += 1
        self._check()
        await self.release.wait()

    def refuse(self) -> None:
        self.refused += 1
        self._check()

    async def run(self, send: Callable[[], Awaitable[None]], is_refusal: type[Exception]) -> None:
        """`total` sends at once; each either completes or raises `is_refusal` (a 429)."""

        async def one() -> str:
            try:
                await send()
            except is_refusal as error:
                assert getattr(error, "status_code", 429) == 429, error
                self.refuse()
                return "refused"
            return "ok"

        tasks = [asyncio.create_task(one()) for _ in range(self.total)]
        try:
            await asyncio.wait_for(self.decided.wait(), 60)
        finally:
            self.release.set()
        outcomes = await asyncio.gather(*tasks)
        assert outcomes.count("ok") == self.arrived
