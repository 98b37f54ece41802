"""Latency percentiles (`GET /v1/usage/latency`) on both stores, and the usage CSV's names,
totals and file name."""

from __future__ import annotations

import csv
import io
import math
from typing import Any

import aiohttp

from gateway.metering.reports import UsageStore
from gateway.metering.reports_latency import SortedDays, latency_rows
from gateway.metering.usage import UsageRecord
from gateway.storage.store import Store
from tests.conftest import MakeGateway

MASTER = "master-key-for-tests-0123456789"
QUESTION = [{"role": "user", "content": "Count to three, please."}]
DAY = 86400


def record(n: int, **extra: Any) -> UsageRecord:
    fields: dict[str, Any] = {
        "id": f"t{n}:1",
        "turn_id": f"t{n}",
        "conversation_id": "c",
        "team_id": "red",
        "key_id": "k",
        "user": None,
        "alias": "m",
        "deployment": "d",
        "provider": "openai",
        "model": "x",
        "created_at": 10 * DAY + n,
        "status": "completed",
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "completion_delivered": 5,
        "reasoning_tokens": 0,
        "cached_tokens": 0,
        "usage_source": "provider",
        "cost_usd": 0.001,
        "ttft_ms": None,
        "duration_ms": None,
    }
    return UsageRecord(**(fields | extra))


def nearest_rank(values: list[float], p: int) -> float:
    ordered = sorted(values)
    return ordered[math.ceil(p * len(ordered) / 100) - 1]


async def test_percentiles_are_nearest_rank_on_both_stores(store: Store) -> None:
    usage = UsageStore(store)
    # Deployment d: 200 attempts, durations 1..200 ms in a shuffled order, every 4th without a
    # first token (an error before one); e: three attempts of another team; one outside the
    # range.
    durations = [float((n * 37) % 200 + 1) for n in range(200)]
    for n, duration in enumerate(durations):
        ttft = None if n % 4 == 0 else duration / 2
        usage.write(record(n, duration_ms=duration, ttft_ms=ttft))
    for n, duration in enumerate([30.0, 10.0, 20.0]):
        usage.write(record(1000 + n, deployment="e", team_id="blue", duration_ms=duration))
    usage.write(record(2000, created_at=20 * DAY, duration_ms=99999.0, ttft_ms=99999.0))
    await store.flush()

    rows = await usage.latency(
        group_by="deployment", start=0, end=20 * DAY, team_id=None, timeout_s=10
    )
    assert [r["group"] for r in rows] == ["d", "e"]
    d, e = rows
    ttfts = [v / 2 for n, v in enumerate(durations) if n % 4]
    assert d["duration_ms"]["count"] == 200 and d["ttft_ms"]["count"] == 150
    for p in (50, 95, 99):
        assert d["duration_ms"][f"p{p}"] == nearest_rank(durations, p)
        assert d["ttft_ms"][f"p{p}"] == nearest_rank(ttfts, p)
    assert d["duration_ms"]["mean"] == 100.5
    assert e["duration_ms"] == {"count": 3, "p50": 20.0, "p95": 30.0, "p99": 30.0, "mean": 20.0}
    assert e["ttft_ms"] == {"count": 0, "p50": None, "p95": None, "p99": None, "mean": None}

    rows = await usage.latency(group_by="team", start=0, end=20 * DAY, team_id="blue", timeout_s=10)
    assert [(r["group"], r["duration_ms"]["count"]) for r in rows] == [("blue", 3)]

    # A small part of the time the table covers (SQLite reads it through the time index, the
    # whole range above in one pass over the table): attempts 50 to 149 of d alone.
    rows = await usage.latency(
        group_by="deployment", start=10 * DAY + 50, end=10 * DAY + 150, team_id=None, timeout_s=10
    )
    part = durations[50:150]
    assert [(r["group"], r["duration_ms"]["count"]) for r in rows] == [("d", 100)]
    for p in (50, 95, 99):
        assert rows[0]["duration_ms"][f"p{p}"] == nearest_rank(part, p)


async def test_whole_days_kept_between_reports_take_in_later_rows(store: Store) -> None:
    """A report over whole days answers as one that read every row, when rows have come since
    into a day it read before, into the part days at its ends, or none."""
    usage = UsageStore(store)
    written: list[float] = []  # d's times
    ids = iter(range(1000, 2000))

    def attempts(day: float, count: int, deployment: str = "d") -> None:
        for n in (next(ids) for _ in range(count)):
            at = day * DAY + (n * 7919) % (DAY // 2)
            duration = float((n * 37) % 500 + 1)
            usage.write(
                record(n, created_at=at, deployment=deployment, duration_ms=duration, ttft_ms=n % 9)
            )
            if deployment == "d":
                written.append(at)

    def in_span() -> int:
        return sum(10.5 * DAY <= at < 15.5 * DAY for at in written)

    for day in range(10, 16):
        attempts(day, 40)
    await store.flush()
    # Days 11 to 14 whole, a part of days 10 and 15 at the ends.
    span = {"start": 10.5 * DAY, "end": 15.5 * DAY, "team_id": None, "timeout_s": 10}

    async def same_as_read_afresh(group_by: str = "deployment") -> list[dict[str, Any]]:
        kept = await usage.latency(group_by=group_by, **span)
        assert kept == await UsageStore(store).latency(group_by=group_by, **span)
        return kept

    first = await same_as_read_afresh()
    assert first[0]["duration_ms"]["count"] == in_span()
    attempts(12, 30, deployment="e")  # late rows into a day read before, of a new group
    attempts(12.2, 25)
    attempts(15, 5)  # into the end
    await store.flush()
    later = await same_as_read_afresh()
    assert [r["group"] for r in later] == ["d", "e"]
    assert later[1]["duration_ms"]["count"] == 30
    assert later[0]["duration_ms"]["count"] == in_span() == first[0]["duration_ms"]["count"] + 30
    assert later[0]["duration_ms"] != first[0]["duration_ms"]
    assert await same_as_read_afresh() == later  # nothing new
    await same_as_read_afresh("model")  # another grouping, kept apart


async def test_days_past_the_limit_are_read_again(store: Store) -> None:
    usage = UsageStore(store)
    for n in range(60):
        usage.write(record(n, created_at=(10 + n % 6) * DAY + n, duration_ms=float(n)))
    await store.flush()
    span = {"column": "deployment", "team_id": None, "timeout_s": 10}
    whole = {"start": 10 * DAY, "end": 16 * DAY}
    few = SortedDays(limit=25)  # two days' values: each day has 10 attempts, 20 values
    rows = await latency_rows(store, few, **whole, **span)
    assert rows == await latency_rows(store, SortedDays(), **whole, **span)
    assert rows[0]["duration_ms"]["count"] == 60
    assert await latency_rows(store, few, **whole, **span) == rows


async def test_a_range_of_centuries_keeps_only_the_days_with_rows(store: Store) -> None:
    usage = UsageStore(store)
    for n in range(30):
        usage.write(record(n, created_at=(10 + n % 3) * DAY + n, duration_ms=float(n)))
    await store.flush()
    days = SortedDays()
    span = {"column": "deployment", "team_id": None, "timeout_s": 10}
    rows = await latency_rows(store, days, start=0, end=1e12, **span)
    assert rows[0]["duration_ms"]["count"] == 30
    assert rows[0]["duration_ms"]["p99"] == 29.0
    # SQLite keeps days 10 to 12, not the 11 million of the range (PostgreSQL keeps none).
    assert len(days) == (3 if store.dialect == "sqlite" else 0)
    assert await latency_rows(store, SortedDays(), start=0, end=0, **span) == []


async def test_a_report_split_by_team_adds_up_to_each_teams_own(store: Store) -> None:
    usage = UsageStore(store)
    # A turn retried across midnight (counted once, at its last attempt), in each of two
    # teams and with no team (the master key's); one attempt with no alias.
    for n, team in enumerate(["red", "blue", None]):
        usage.write(record(n, team_id=team, created_at=11 * DAY - 10, status="error"))
        usage.write(record(n, id=f"t{n}:2", team_id=team, created_at=11 * DAY + 10))
    usage.write(record(9, team_id="red", alias=None))
    await store.flush()
    for granularity in ("day", "hour"):
        span = {"start": 0, "end": 20 * DAY, "granularity": granularity}
        split = await usage.report_by_team(group_by="model", **span)
        for team in ("red", "blue"):
            own = await usage.report(group_by="model", team_id=team, **span)
            mine = [{k: v for k, v in r.items() if k != "team_id"} for r in split]
            theirs = [r for r, s in zip(mine, split, strict=True) if s["team_id"] == team]
            assert sorted(theirs, key=str) == sorted(own, key=str)
        whole = await usage.report(group_by="model", team_id=None, **span)
        for name in ("requests", "attempts", "failed_attempts", "prompt_tokens"):
            assert sum(r[name] for r in split) == sum(r[name] for r in whole), name
        assert {(r["team_id"], r["group"]) for r in split} == {
            ("red", "m"),
            ("red", None),
            ("blue", "m"),
            (None, "m"),
        }


async def test_latency_and_csv_over_http(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(auth={"master_key": MASTER})
    admin = {"Authorization": f"Bearer {MASTER}"}
    keys: dict[str, str] = {}
    async with aiohttp.ClientSession(headers=admin) as session:
        for team, name in (("red", "Red team"), ("blue", "=Blue")):
            await session.post(gw.url + "/v1/gateway/teams", json={"id": team, "name": name})
            body = {"team_id": team, "name": f"{team}-laptop"}
            async with session.post(gw.url + "/v1/gateway/keys", json=body) as r:
                made = await r.json()
                keys[team] = made["key"]
                keys[team + "_id"] = made["id"]
    for team, count in (("red", 2), ("blue", 1)):
        for _ in range(count):
            await gw.client(api_key=keys[team]).chat.completions.create(
                model="demo", messages=QUESTION
            )
    await gw.flush()

    async def get(key: str, path: str) -> tuple[int, Any, Any]:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
            async with session.get(gw.url + path) as r:
                text = await r.text()
                body = text if r.content_type != "application/json" else await r.json()
                return r.status, body, r.headers

    status, body, _ = await get(MASTER, "/v1/usage/latency?group_by=team")
    assert status == 200 and body["group_by"] == "team"
    by_team = {r["group"]: r for r in body["data"]}
    assert by_team["red"]["duration_ms"]["count"] == 2
    assert by_team["red"]["ttft_ms"]["p50"] > 0
    assert by_team["red"]["duration_ms"]["p99"] >= by_team["red"]["duration_ms"]["p50"]
    # A team key reads its own team's, whatever it asks for.
    _, body, _ = await get(keys["blue"], "/v1/usage/latency?group_by=team&team_id=red")
    assert [r["group"] for r in body["data"]] == ["blue"]
    status, body, _ = await get(MASTER, "/v1/usage/latency?group_by=tag:x")
    assert status == 400 and body["error"]["param"] == "group_by"

    # The CSV: names and team beside each key, a total, and its range in the file name.
    query = f"?group_by=key&granularity=day&from={10 * DAY}&to={12 * DAY}&format=csv"
    _, text, headers = await get(MASTER, "/v1/usage" + query.replace(f"{10 * DAY}", "0"))
    assert headers["Content-Disposition"] == (
        'attachment; filename="usage-by-key-1970-01-01_1970-01-12.csv"'
    )
    now = await get(MASTER, "/v1/usage?group_by=key&format=csv")
    rows = list(csv.DictReader(io.StringIO(now[1])))
    by_key = {r["group"]: r for r in rows[:-1]}
    assert by_key[keys["red_id"]]["group_name"] == "red-laptop"
    assert by_key[keys["red_id"]]["team_id"] == "red"
    assert by_key[keys["red_id"]]["team_name"] == "Red team"
    assert by_key[keys["blue_id"]]["team_name"] == "'=Blue"  # inert in a spreadsheet
    total = rows[-1]
    assert total["period_start"] == "total" and total["requests"] == "3"
    assert float(total["cost_usd"] or 0) == sum(float(r["cost_usd"] or 0) for r in rows[:-1])
    # Every team's report by model: each team's rows apart, by name.
    _, text, _ = await get(MASTER, "/v1/usage?group_by=model&format=csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["group"], r["team_id"], r["team_name"], r["requests"]) for r in rows] == [
        ("demo", "blue", "'=Blue", "1"),
        ("demo", "red", "Red team", "2"),
        ("", "", "", "3"),
    ]
    # A team's report names its team on every row.
    _, text, _ = await get(keys["red"], "/v1/usage?group_by=model&format=csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert {(r["team_id"], r["team_name"]) for r in rows} == {("red", "Red team")}
    assert [r["group"] for r in rows] == ["demo", ""]

    _, _, headers = await get(MASTER, f"/v1/usage/requests?from={DAY + 3600}&to={2 * DAY}")
    assert headers["Content-Disposition"] == (
        'attachment; filename="usage-requests-1970-01-02T0100Z_1970-01-03T0000Z.csv"'
    )
