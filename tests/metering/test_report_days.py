"""Usage reports by day read whole days from their sums in usage_days, and say exactly what the
usage rows say: checked against the rows counted one by one, on a real SQLite file and a real
PostgreSQL, with turns whose attempts cross midnight and the report's ends, API calls, a row
written into a day already summed, and a store migrated from the version before."""

from __future__ import annotations

import math
import random
import time
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from gateway.config import StoreConfig
from gateway.metering.reports import COLUMNS, GROUPS, UsageStore
from gateway.metering.usage import UsageRecord
from gateway.storage import schema
from gateway.storage.backends import make_store
from gateway.storage.db import Dialect
from gateway.storage.store import Store

DAY = 86400
NOW = time.time()
TODAY = math.floor(NOW / DAY) * DAY
BASE = TODAY - 8 * DAY  # eight days ago: filled by a report; yesterday and today never are
ATTRIBUTE = {"team": "team_id", "key": "key_id", "user": "user", "model": "alias"}


def make_records(seed: int = 5) -> list[UsageRecord]:
    """Turns of one to eleven attempts (the failed ones first) over nine days to now, some
    across each midnight; and API calls, some with the same request id."""
    rng = random.Random(seed)
    records: list[UsageRecord] = []
    starts = [BASE + rng.random() * (NOW - 3600 - BASE) for _ in range(300)]
    starts += [BASE + n * DAY - 5 for n in range(1, 9)]  # a turn across each midnight
    for n, at in enumerate(starts):
        team = rng.choice(["t1", "t2", None])
        attempts = rng.choice([1, 1, 1, 2, 2, 3, 11]) if n < 300 else 2
        gap = 10 if n >= 300 else rng.choice([1, 30, 900])
        for number in range(1, attempts + 1):
            status = "error" if number < attempts else rng.choice(["completed", "interrupted"])
            records.append(
                record(
                    f"turn{n}:{number}",
                    f"turn{n}",
                    at + (number - 1) * gap,
                    rng,
                    team=team,
                    key=f"k-{team}-{n % 2}",
                    user=["u1", "u2", None][n % 3],
                    status=status,
                )
            )
    for n in range(40):
        at = BASE + rng.random() * (NOW - 3600 - BASE)
        request_id = rng.choice(["req-a", "req-b", f"req-{n}"])  # a client's, which repeat
        records.append(
            record(f"call_{n:04d}:1", request_id, at, rng, team="t1", key="k-t1-0", user="u1")
        )
    return records


def record(
    id_: str,
    turn: str,
    at: float,
    rng: random.Random,
    *,
    team: str | None,
    key: str,
    user: str | None,
    status: str = "completed",
) -> UsageRecord:
    prompt = rng.randint(0, 50)
    completion = 0 if status == "error" else rng.randint(0, 30)
    return UsageRecord(
        id=id_,
        turn_id=turn,
        conversation_id="" if id_.startswith("call") else f"c-{turn}",
        team_id=team,
        key_id=key,
        user=user,
        alias=rng.choice(["m1", "m2"]),
        deployment=rng.choice(["d1", "d2", "d3"]),
        provider="openai",
        model="x",
        created_at=at,
        status=status,
        prompt_tokens=prompt,
        completion_tokens=completion,
        completion_delivered=completion,
        reasoning_tokens=rng.randint(0, 3),
        cached_tokens=rng.randint(0, 3),
        usage_source=rng.choice(["provider", "provider", "estimated"]),
        cost_usd=None if rng.random() < 0.2 else rng.randint(1, 1000) / 1e5,
        ttft_ms=None,
        duration_ms=None,
        cache_write_5m_tokens=rng.randint(0, 2),
        cache_write_1h_tokens=rng.randint(0, 2),
    )


def reference(
    records: list[UsageRecord],
    group_by: str,
    start: float,
    end: float,
    bucket: int,
    team_id: str | None,
) -> dict[tuple[str, Any], dict[str, Any]]:
    """The report counted row by row (docs/api.md, "Usage reports"): a turn's request where
    its last attempt in the report is; an API call a request of its own."""
    attribute = ATTRIBUTE.get(group_by, group_by)
    chosen = [
        r
        for r in records
        if start <= r.created_at < end and (team_id is None or r.team_id == team_id)
    ]
    turns: dict[Any, list[tuple[int, UsageRecord]]] = {}
    for r in chosen:
        number = r.id[len(r.turn_id) + 1 :]
        if r.id.startswith(r.turn_id + ":") and number.isdigit():
            turns.setdefault(r.turn_id, []).append((int(number), r))
        else:
            turns[("call", r.id)] = [(1, r)]
    out: dict[tuple[str, Any], dict[str, Any]] = {}

    def row(r: UsageRecord) -> dict[str, Any]:
        period = datetime.fromtimestamp(math.floor(r.created_at / bucket) * bucket, UTC)
        key = (period.isoformat(), getattr(r, attribute))
        return out.setdefault(key, dict.fromkeys(COLUMNS[2:-1], 0) | {"cost_usd": None})

    for attempts in turns.values():
        for _, r in attempts:
            o = row(r)
            o["attempts"] += 1
            o["failed_attempts"] += r.status == "error"
            for name in ("prompt_tokens", "completion_tokens", "completion_delivered"):
                o[name] += getattr(r, name)
            for name in ("reasoning_tokens", "cached_tokens"):
                o[name] += getattr(r, name)
            o["cache_write_5m_tokens"] += r.cache_write_5m_tokens
            o["cache_write_1h_tokens"] += r.cache_write_1h_tokens
            if r.cost_usd is None:
                o["unpriced_prompt_tokens"] += r.prompt_tokens
                o["unpriced_completion_tokens"] += r.completion_tokens
            else:
                o["cost_usd"] = (o["cost_usd"] or 0) + r.cost_usd
        last = max(attempts, key=lambda a: a[0])[1]
        o = row(last)
        o["requests"] += 1
        o["interrupted"] += last.status == "interrupted"
        o["errors"] += last.status == "error"
        o["estimated"] += any(
            r.usage_source != "provider" and r.prompt_tokens + r.completion_tokens > 0
            for _, r in attempts
        )
        o["unpriced_requests"] += any(r.cost_usd is None for _, r in attempts)
    return out


def assert_same(rows: list[dict[str, Any]], expected: dict[tuple[str, Any], Any]) -> None:
    got = {(r["period_start"], r["group"]): r for r in rows}
    assert len(got) == len(rows)  # a row a period and group
    assert all(list(r) == COLUMNS for r in rows)  # the answer's fields, in the documented order
    assert set(got) == set(expected)
    for key, want in expected.items():
        have = {name: got[key][name] for name in want}
        cost = have.pop("cost_usd")
        want = dict(want)
        want_cost = want.pop("cost_usd")
        assert have == want, key
        assert (cost is None) == (want_cost is None), key
        if cost is not None:
            assert cost == pytest.approx(want_cost, rel=1e-9), key
    periods = [r["period_start"] for r in rows]
    assert periods == sorted(periods)


async def query(store: Store, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    async def op(db: Any) -> list[tuple[Any, ...]]:
        return list(await db.fetch(sql, *args))

    return await store.run(op)


async def _write_as_before(store: Store, records: list[UsageRecord]) -> None:
    """The records in the columns the usage table had at the version before (a later
    migration may add some, which the store's own writes fill)."""

    async def op(db: Any) -> None:
        if db.dialect == "sqlite":
            have = {row[1] for row in await db.fetch("PRAGMA table_info(usage)")}
        else:
            have = {
                row[0]
                for row in await db.fetch(
                    "SELECT column_name FROM information_schema.columns"
                    " WHERE table_name = 'usage' AND table_schema = current_schema()"
                )
            }
        columns = [c for c in records[0].row() if c in have]
        names = ", ".join(f'"{c}"' for c in columns)
        marks = ", ".join("?" for _ in columns)
        await db.executemany(
            f"INSERT INTO usage ({names}) VALUES ({marks})",
            [tuple(r.row()[c] for c in columns) for r in records],
        )

    await store.transact(op)


# (start, end) of reports: every day, whole days amid (each end cutting a turn at midnight),
# and ends at no midnight.
SPANS = [
    (BASE - DAY, TODAY + DAY),
    (BASE + 2 * DAY, BASE + 5 * DAY),
    (BASE + 3 * 3600 + 0.5, NOW - 1800),
]


async def test_reports_by_day_say_what_the_rows_say(store: Store) -> None:
    records = make_records()
    usage = UsageStore(store)
    for r in records:
        usage.write(r)
    await store.flush()
    for group_by in GROUPS:
        for team_id in (None, "t1"):
            for start, end in SPANS:
                for granularity, bucket in (("day", DAY), ("hour", 3600)):
                    rows = await usage.report(
                        group_by=group_by,
                        start=start,
                        end=end,
                        granularity=granularity,
                        team_id=team_id,
                    )
                    expected = reference(records, group_by, start, end, bucket, team_id)
                    assert_same(rows, expected)
    # The days before yesterday were read from their sums, for each grouping, per team and
    # for all teams, and by hour for all teams; yesterday and today from their rows.
    filled = await query(store, "SELECT DISTINCT day, dimension FROM usage_days_done")
    days = {day for day, _ in filled}
    # (A day more when midnight passed since the module was imported: yesterday is summable.)
    passed = (math.floor(time.time() / DAY) * DAY - TODAY) // DAY
    assert days == {BASE - DAY + n * DAY for n in range(8 + passed)}
    dimensions = {dimension for _, dimension in filled}
    assert dimensions == {
        *GROUPS,
        *(name + "*" for name in GROUPS),
        *(f"hour:{name}*" for name in GROUPS),
        "turns",
    }
    hours = await query(store, "SELECT DISTINCT day FROM usage_hours")
    assert {day for (day,) in hours} == days - {BASE - DAY}  # that one holds no rows
    spanning = await query(store, "SELECT day, turn_id FROM usage_days_turns")
    assert (BASE + DAY, "turn300") in spanning  # its second attempt, after midnight


async def test_a_row_written_into_a_summed_day_is_counted(store: Store) -> None:
    records = make_records(seed=9)
    usage = UsageStore(store)
    for r in records:
        usage.write(r)
    await store.flush()
    span = (BASE, TODAY + DAY)

    async def check(group_by: str = "user") -> None:
        for granularity, bucket in (("day", DAY), ("hour", 3600)):
            rows = await usage.report(
                group_by=group_by, start=span[0], end=span[1], granularity=granularity, team_id=None
            )
            assert_same(rows, reference(records, group_by, *span, bucket, None))

    await check()
    day = BASE + 2 * DAY
    assert await query(store, "SELECT 1 FROM usage_days_done WHERE day = ?", day)
    rng = random.Random(3)
    # A new turn, written late into a summed day (a spool's replay), and a turn of that day
    # given an attempt on the next day.
    late = record("late:1", "late", day + 100, rng, team="t2", key="k-t2-0", user="u9")
    first = next(
        r
        for r in records
        if r.id.startswith("turn") and r.id.endswith(":1") and day < r.created_at < day + DAY
    )
    more = record(
        first.turn_id + ":12",
        first.turn_id,
        day + DAY + 50,
        rng,
        team=first.team_id,
        key=first.key_id or "",
        user=first.user,
    )
    written = [late, more]
    stale = {day, day + DAY}
    if store.dialect == "postgresql":
        # And a drained stream's usage replacing an attempt's estimate, which on SQLite only a
        # replay does to an old row (and no day is summed while writes wait to be replayed).
        replaced = next(r for r in records if BASE + 4 * DAY < r.created_at < BASE + 5 * DAY)
        index = records.index(replaced)
        records[index] = UsageRecord(**(replaced.row() | {"prompt_tokens": 999, "cost_usd": None}))
        written.append(records[index])
        stale.add(BASE + 4 * DAY)
    for r in written:
        usage.write(r)
    records += [late, more]
    await store.flush()
    for group_by in GROUPS:
        await check(group_by)
    # Dropped and summed again.
    assert stale <= {d for (d,) in await query(store, "SELECT day FROM usage_days_done")}
    assert stale <= {d for (d,) in await query(store, "SELECT day FROM usage_hours")}


async def test_sqlite_sums_no_day_while_writes_wait_or_other_processes_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = StoreConfig(url=f"sqlite:///{tmp_path}/store.db", spool_path=str(tmp_path / "s"))
    store = make_store(config, "test")
    await store.start()
    try:
        records = make_records(seed=13)
        usage = UsageStore(store)
        for r in records:
            usage.write(r)
        await store.flush()
        span = (BASE, TODAY + DAY)
        expected = reference(records, "key", *span, DAY, None)

        async def report() -> list[dict[str, Any]]:
            return await usage.report(
                group_by="key", start=span[0], end=span[1], granularity="day", team_id=None
            )

        monkeypatch.setattr(store, "spooled_bytes", lambda: 1)
        assert_same(await report(), expected)
        assert await query(store, "SELECT COUNT(*) FROM usage_days_done") == [(0,)]
        monkeypatch.undo()
        assert_same(await report(), expected)
        assert await query(store, "SELECT COUNT(*) FROM usage_days_done") != [(0,)]
        # Another worker's replay could change an old row in place, unseen: the sums are not
        # read (here, made wrong to show it).
        await store.transact(
            lambda db: db.execute("UPDATE usage_days SET requests = requests + 1000")
        )
        monkeypatch.setenv("GATEWAY_WORKER", "1")
        assert store.shared
        assert_same(await report(), expected)
    finally:
        await store.close()


# The report as it was before usage_days (commit be2edf4): what a store migrated from the version
# before must still read.
def _report_before(dialect: str, group_by: str, bucket: int) -> str:
    column = GROUPS[group_by]
    floor = "FLOOR" if dialect == "postgresql" else ""
    period = f"CAST({floor}(created_at / {bucket}) AS BIGINT) * {bucket}"
    last = "u.attempt = t.last"
    return (
        f"WITH u AS (SELECT {period} AS period, {column} AS grp, turn_id, status,"
        " usage_source, cost_usd, prompt_tokens, completion_tokens,"
        " completion_delivered, reasoning_tokens, cached_tokens,"
        " COALESCE(cache_write_5m_tokens, 0) AS write_5m,"
        " COALESCE(cache_write_1h_tokens, 0) AS write_1h,"
        " CAST(SUBSTR(id, LENGTH(turn_id) + 2) AS INTEGER) AS attempt"
        " FROM usage WHERE created_at >= ? AND created_at < ?),"
        " t AS (SELECT turn_id, MAX(attempt) AS last,"
        " MAX(CASE WHEN cost_usd IS NULL THEN 1 ELSE 0 END) AS unpriced,"
        " MAX(CASE WHEN usage_source <> 'provider'"
        " AND prompt_tokens + completion_tokens > 0 THEN 1 ELSE 0 END) AS estimated"
        " FROM u GROUP BY turn_id)"
        " SELECT u.period, u.grp,"
        f" SUM(CASE WHEN {last} THEN 1 ELSE 0 END),"
        " COUNT(*),"
        " SUM(CASE WHEN u.status = 'error' THEN 1 ELSE 0 END),"
        f" SUM(CASE WHEN {last} AND u.status = 'interrupted' THEN 1 ELSE 0 END),"
        f" SUM(CASE WHEN {last} AND u.status = 'error' THEN 1 ELSE 0 END),"
        " SUM(u.prompt_tokens), SUM(u.completion_tokens), SUM(u.completion_delivered),"
        " SUM(u.reasoning_tokens), SUM(u.cached_tokens), SUM(u.write_5m),"
        " SUM(u.write_1h),"
        f" SUM(CASE WHEN {last} THEN t.estimated ELSE 0 END),"
        f" SUM(CASE WHEN {last} THEN t.unpriced ELSE 0 END),"
        " SUM(CASE WHEN u.cost_usd IS NULL THEN u.prompt_tokens ELSE 0 END),"
        " SUM(CASE WHEN u.cost_usd IS NULL THEN u.completion_tokens ELSE 0 END),"
        " SUM(u.cost_usd)"
        " FROM u JOIN t ON t.turn_id = u.turn_id"
        " GROUP BY u.period, u.grp ORDER BY u.period, u.grp"
    )


def _as_before(rows: list[Any]) -> list[dict[str, Any]]:
    """As the report before made its records."""
    out = []
    for row in rows:
        values = [int(v) if isinstance(v, Decimal) else v for v in row]
        record = dict(zip(COLUMNS, values, strict=True))
        record["period_start"] = datetime.fromtimestamp(row[0], UTC).isoformat()
        record["cost_usd"] = round(row[-1], 10) if row[-1] is not None else None
        out.append(record)
    return out


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_store_migrated_reports_what_it_reported_before(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = (
        f"sqlite:///{tmp_path}/gateway.db"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    config = StoreConfig(url=url, spool_path=str(tmp_path / "spool"))
    dialect: Dialect = "sqlite" if backend == "sqlite" else "postgresql"
    # Turns only: the report before read an API call's id as an attempt's number, which
    # PostgreSQL refused.
    records = [r for r in make_records(seed=11) if not r.id.startswith("call")]
    reports = [
        (group_by, start, end, bucket)
        for group_by in ("user", "deployment")
        for start, end in SPANS
        for bucket in (DAY, 3600)
    ]
    current = schema.MIGRATIONS
    monkeypatch.setattr(schema, "MIGRATIONS", {**current, dialect: current[dialect][:-1]})
    store = make_store(config, "test")
    await store.start()  # at the version before
    await _write_as_before(store, records)
    before = []
    for group_by, start, end, bucket in reports:
        rows = await query(store, _report_before(dialect, group_by, bucket), start, end)
        before.append(_as_before(rows))
    await store.close()

    monkeypatch.setattr(schema, "MIGRATIONS", current)
    store = make_store(config, "test")
    await store.start()  # migrates
    try:
        usage = UsageStore(store)
        for (group_by, start, end, bucket), was in zip(reports, before, strict=True):
            now = await usage.report(
                group_by=group_by,
                start=start,
                end=end,
                granularity="day" if bucket == DAY else "hour",
                team_id=None,
            )
            assert [(r["period_start"], r["group"]) for r in now] == [
                (r["period_start"], r["group"]) for r in was
            ]
            for new, old in zip(now, was, strict=True):
                assert {k: v for k, v in new.items() if k != "cost_usd"} == {
                    k: v for k, v in old.items() if k != "cost_usd"
                }, (group_by, start, end, bucket)
                assert (new["cost_usd"] is None) == (old["cost_usd"] is None)
                if new["cost_usd"] is not None:
                    assert new["cost_usd"] == pytest.approx(old["cost_usd"], rel=1e-9)
        assert await query(store, "SELECT COUNT(*) FROM usage_days") != [(0,)]
    finally:
        await store.close()
