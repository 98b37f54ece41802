"""Searches bounded in time, beside the store's writer: a team's flood of slow searches is
answered `503 search_timeout` within `store.search_timeout_s`, and another team's list and
`/health/live` do not wait for it, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.config import StoreConfig
from gateway.conversations.listing import ListQuery, list_conversations
from gateway.storage.backends import make_store
from gateway.storage.db import ReadTimeout
from tests.conversations.search_seed import EVERYTHING, seed_postgres, seed_sqlite
from tests.floods import Teams, live, two_teams, while_flooding

# Conversations of team a: unbounded, a search for every word took 2.5 s on SQLite, 0.7 s on
# PostgreSQL (which seeds slower).
SEEDED = {"sqlite": 5_000, "postgresql": 2_500}
TIMEOUT_S = 0.3
FLOOD = 8


async def _seeded(request: pytest.FixtureRequest, tmp_path: Path, count: int) -> str:
    if request.param == "sqlite":
        path = tmp_path / "gw.db"
        await seed_sqlite(path, count, "a")
        return f"sqlite:///{path}"
    pg_url: str = request.getfixturevalue("pg_url")
    await seed_postgres(pg_url, count, "a")
    return pg_url


@pytest.fixture(params=["sqlite", "postgresql"])
async def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return await _seeded(request, tmp_path, SEEDED[request.param])


@pytest.fixture(params=["sqlite", "postgresql"])
async def small_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return await _seeded(request, tmp_path, 1_000)


async def test_a_flood_of_slow_searches_holds_no_other_team(tmp_path: Path, url: str) -> None:
    config = (
        f"store: {{url: '{url}', search_timeout_s: {TIMEOUT_S}}}\n"
        "models: [{name: demo, deployments: [{provider: demo}]}]\n"
    )
    async with two_teams(tmp_path, config) as teams:

        async def search() -> tuple[int, str | None, float]:
            began = time.perf_counter()
            async with teams.session.get(
                teams.url + "/v1/conversations",
                params={"q": EVERYTHING},
                headers=teams.headers("a"),
            ) as response:
                body = await response.json()
                code = body["error"]["code"] if response.status != 200 else None
                return response.status, code, time.perf_counter() - began

        async def other_team() -> None:
            await _list(teams, "b")

        answers, seen = await while_flooding(
            [search() for _ in range(FLOOD)], {"other": other_team, "live": live(teams)}
        )
        # Unbounded, each of these searches ran for about a second, one after another on
        # SQLite's one thread, holding every other read and write behind them. Bounded, each
        # is answered within its time: stopped, or (a warm cache) done.
        outcomes = {(status, code) for status, code, _ in answers}
        assert (503, "search_timeout") in outcomes, answers
        assert outcomes <= {(503, "search_timeout"), (200, None)}, answers
        assert max(took for _, _, took in answers) < TIMEOUT_S + 1.5, answers
        assert seen.median("other") < 0.1, seen.times
        assert seen.worst("other") < 0.5, seen.times
        assert seen.median("live") < 0.05, seen.times
        assert seen.worst("live") < 0.25, seen.times
        # A search that fits its time is answered as before.
        async with teams.session.get(
            teams.url + "/v1/conversations", params={"q": "w7 nothere"}, headers=teams.headers("a")
        ) as response:
            assert response.status == 200 and (await response.json())["data"] == []


async def _list(teams: Teams, team: str) -> None:
    async with teams.session.get(
        teams.url + "/v1/conversations", headers=teams.headers(team)
    ) as response:
        assert response.status == 200
        await response.read()


async def test_a_read_past_its_deadline_is_stopped_and_its_connection_reused(
    small_url: str, tmp_path: Path
) -> None:
    store = make_store(StoreConfig(url=small_url, spool_path=str(tmp_path / "spool")), "t")
    await store.start()
    try:
        began = time.perf_counter()
        with pytest.raises(ReadTimeout):
            await list_conversations(store, ListQuery(q=EVERYTHING), 0.02)
        assert time.perf_counter() - began < 0.02 + 0.5
        page = await list_conversations(store, ListQuery(q="w1", limit=3), 5)
        assert len(page.data) == 3
    finally:
        await store.close()
