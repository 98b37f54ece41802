"""`python -m bench.usage_report`: do the usage report over 90 days and its latency percentiles
answer within 200 ms, on SQLite and on PostgreSQL?

Seeds the usage rows of `--conversations` conversations as `bench.list_bench` makes them (1 to 3
turns each, an attempt's usage record a turn, one turn in 20 with a failed attempt before it;
40 teams, 1,000 users, 200 keys; about 190,000 rows at 100,000 conversations), moved in time so
that their 90 days end a minute ago, into a fresh SQLite file and a throwaway PostgreSQL (started
as the tests start theirs, or `--url`). The schema is the real one, made by the store's
migrations; rows go in through bulk SQL (`executemany`, `COPY`). PostgreSQL is ANALYZEd, as
autovacuum would; SQLite is not, as a gateway never does.

Then times `UsageStore.report` (the SQL, the rows made into the answer and the answer encoded
as the handler encodes it: all but the HTTP around it) over the last 90 days, by day, grouped by
user, team, key, model and deployment, and by user for one team's key; by user per hour over the
last 7 days and over 90. Each first as the first report after a deploy would run (which sums the
whole days it covers into usage_days, once), then `--runs` times after one more: prints the
first in milliseconds, p50 and p95, the CPU time this process spent on one, p50 (all of SQLite's
work; on a shared machine the steadier figure), and the rows. `--only reports` or `--only
latency` times one table.
Then the same for `UsageStore.latency` (`GET /v1/usage/latency`: time to first token and
duration percentiles) over 90 days by each grouping, over 30 and 7 days by model, and for one
team's key.
"""

from __future__ import annotations

import argparse
import gc
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg

from bench.list_bench import (
    SPAN_S,
    T0,
    USAGE_COLUMNS,
    _insert,
    _migrated,
    run_on_backends,
    seed,
)
from gateway.config import StoreConfig
from gateway.http.usage import json_answer
from gateway.metering.reports import UsageStore
from gateway.storage.backends import make_store

DAY = 86400
# (name, group_by, granularity, days, team)
CASES = [
    ("by user", "user", "day", 90, None),
    ("by team", "team", "day", 90, None),
    ("by key", "key", "day", 90, None),
    ("by model (alias)", "model", "day", 90, None),
    ("by deployment", "deployment", "day", 90, None),
    ("a team's key, by user", "user", "day", 90, "team3"),
    ("by user per hour, 7 days", "user", "hour", 7, None),
    ("by user per hour, 90 days", "user", "hour", 90, None),
]

# (name, group_by, days, team)
LATENCY_CASES = [
    ("by user", "user", 90, None),
    ("by team", "team", 90, None),
    ("by key", "key", 90, None),
    ("by model (alias)", "model", 90, None),
    ("by deployment", "deployment", 90, None),
    ("by model, 30 days", "model", 30, None),
    ("by model, 7 days", "model", 7, None),
    ("a team's key, by user", "user", 90, "team3"),
]
Result = tuple[str, float, float, float, float, int]


def usage_rows(conversations: int, now: float) -> list[tuple[Any, ...]]:
    """list_bench's usage rows, their 90 days ending a minute before `now`."""
    shift = now - 60 - (T0 + SPAN_S)
    at = USAGE_COLUMNS.index("created_at")
    rows = []
    for row in seed(conversations).usage:
        moved = list(row)
        moved[at] += shift
        rows.append(tuple(moved))
    return rows


async def fill_sqlite(path: Path, rows: list[tuple[Any, ...]]) -> None:
    await _migrated(f"sqlite:///{path}")
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("BEGIN")
    db.executemany(_insert("usage", USAGE_COLUMNS), rows)
    db.execute("COMMIT")
    db.close()


async def fill_postgres(url: str, rows: list[tuple[Any, ...]]) -> None:
    await _migrated(url)
    conn = await asyncpg.connect(url)
    await conn.copy_records_to_table("usage", records=rows, columns=list(USAGE_COLUMNS))
    await conn.execute("VACUUM ANALYZE")
    await conn.close()


async def measure(
    url: str, now: float, args: argparse.Namespace
) -> tuple[list[Result], list[Result]]:
    store = make_store(StoreConfig(url=url, spool_path=tempfile.mkdtemp()), "bench")
    await store.start()
    reports, latencies = [], []
    try:
        usage = UsageStore(store)
        for name, group_by, granularity, days, team in CASES if "reports" in args.only else []:

            async def report(
                group_by: str = group_by, granularity: str = granularity, days: int = days,
                team: str | None = team,
            ) -> list[dict[str, Any]]:  # fmt: skip
                return await usage.report(
                    group_by=group_by,
                    start=now - days * DAY,
                    end=now,
                    granularity=granularity,
                    team_id=team,
                )

            reports.append(await timed(name, report, args.runs))
        for name, group_by, days, team in LATENCY_CASES if "latency" in args.only else []:

            async def latency(
                group_by: str = group_by, days: int = days, team: str | None = team
            ) -> list[dict[str, Any]]:
                return await usage.latency(
                    group_by=group_by, start=now - days * DAY, end=now, team_id=team,
                    timeout_s=60,
                )  # fmt: skip

            latencies.append(await timed(name, latency, args.runs))
    finally:
        await store.close()
    return reports, latencies


async def timed(
    name: str, read: Callable[[], Awaitable[list[dict[str, Any]]]], runs: int
) -> Result:
    """The first read in ms (as the first after a deploy), then p50 and p95 of `runs` after one
    more, and the rows it answered."""
    start = time.perf_counter()
    rows = await read()
    json_answer({"data": rows})
    first = (time.perf_counter() - start) * 1000
    await read()  # warm-up
    times, cpu = [], []
    for _ in range(runs):
        start, used = time.perf_counter(), time.process_time()
        json_answer({"data": await read()})
        times.append((time.perf_counter() - start) * 1000)
        cpu.append((time.process_time() - used) * 1000)
    times.sort()
    p95 = times[min(len(times) - 1, round(0.95 * (len(times) - 1)))]
    return name, first, statistics.median(times), p95, statistics.median(cpu), len(rows)


def show(name: str, results: tuple[list[Result], list[Result]]) -> None:
    reports, latencies = results
    for title, rows in (("usage report", reports), ("latency percentiles", latencies)):
        print(f"\n{name}, {title}: ms, first / p50 / p95 / this process's CPU, p50 (rows)")
        for case, first, p50, p95, cpu, count in rows:
            print(f"  {case:28} {first:8.1f} {p50:8.1f} {p95:8.1f} {cpu:8.1f}   ({count:,})")


async def main(args: argparse.Namespace, pg_url: str | None) -> None:
    now = time.time()
    started = time.perf_counter()
    rows = usage_rows(args.conversations, now)
    print(f"made {len(rows):,} usage rows in {time.perf_counter() - started:.0f} s")
    with tempfile.TemporaryDirectory(prefix="gw-usage-") as where:
        path = Path(where) / "gateway.db"
        if "sqlite" in args.backends:
            started = time.perf_counter()
            await fill_sqlite(path, rows)
            print(f"SQLite filled in {time.perf_counter() - started:.0f} s")
        if pg_url is not None:
            started = time.perf_counter()
            await fill_postgres(pg_url, rows)
            print(f"PostgreSQL filled in {time.perf_counter() - started:.0f} s")
        # Let go before timing: a gateway holds no seed, and its 190,000 tuples, walked by
        # each of the garbage collector's full collections, added a third to a report's CPU.
        del rows
        gc.collect()
        if "sqlite" in args.backends:
            show("SQLite", await measure(f"sqlite:///{path}", now, args))
        if pg_url is not None:
            show("PostgreSQL", await measure(pg_url, now, args))


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--only", default="reports,latency", help="which tables: reports, latency or both"
    )


if __name__ == "__main__":
    run_on_backends(__doc__, main, "gw-usage-", options)
