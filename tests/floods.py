"""A gateway process with two teams, and what another team sees while one team floods it.

The gateway runs as `gateway serve` in a subprocess (tests.test_process), so its event loop is
its own: the flood and the probes run in the test's process and measure only the gateway.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from tests.test_cli import free_port
from tests.test_process import start

MASTER = "sk-flood-master-0123456789"


@dataclass
class Teams:
    """A gateway process and a key of each of two teams, `a` and `b`."""

    url: str
    keys: dict[str, str]
    session: aiohttp.ClientSession

    def headers(self, team: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[team]}"}


@asynccontextmanager
async def two_teams(tmp_path: Path, config: str) -> AsyncIterator[Teams]:
    """`gateway serve` on `config` (YAML after the master key), with teams `a` and `b`."""
    path = tmp_path / "gw.yaml"
    path.write_text(f"auth: {{master_key: '{MASTER}'}}\n{config}")
    port = free_port()
    process = await start(path, port)
    url = f"http://127.0.0.1:{port}"
    admin = {"Authorization": f"Bearer {MASTER}"}
    try:
        async with aiohttp.ClientSession() as session:
            keys = {}
            for team in ("a", "b"):
                made = {"name": team, "id": team}
                async with session.post(url + "/v1/gateway/teams", json=made, headers=admin) as r:
                    assert r.status == 201, await r.text()
                key = {"team_id": team}
                async with session.post(url + "/v1/gateway/keys", json=key, headers=admin) as r:
                    keys[team] = (await r.json())["key"]
            yield Teams(url, keys, session)
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)


@dataclass
class Seen:
    """How long each probe took while the flood ran, in seconds."""

    times: dict[str, list[float]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])

    def worst(self, name: str) -> float:
        return max(self.times[name])


async def timed(call: Callable[[], Awaitable[None]]) -> float:
    began = time.perf_counter()
    await call()
    return time.perf_counter() - began


async def while_flooding(
    flood: list[Coroutine[Any, Any, Any]], probes: dict[str, Callable[[], Awaitable[None]]]
) -> tuple[list[Any], Seen]:
    """Run the flood's requests at once and, until the last is answered, each probe again and
    again (one at a time each, as a client would): the flood's results and the probes' times."""
    tasks = [asyncio.ensure_future(request) for request in flood]
    seen = Seen({name: [] for name in probes})

    async def probe(name: str, call: Callable[[], Awaitable[None]]) -> None:
        while not all(task.done() for task in tasks) or not seen.times[name]:
            seen.times[name].append(await timed(call))

    await asyncio.gather(*(probe(name, call) for name, call in probes.items()))
    return [await task for task in tasks], seen


def live(teams: Teams) -> Callable[[], Awaitable[None]]:
    async def call() -> None:
        async with teams.session.get(teams.url + "/health/live") as response:
            assert response.status == 200
            await response.read()

    return call
