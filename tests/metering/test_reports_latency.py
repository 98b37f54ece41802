"""Latency percentiles over whole days kept between reports (PostgreSQL's usage_latency_days,
SQLite's days in memory) say what the usage rows say: checked against the rows' values sorted
one by one, on a real SQLite file and a real PostgreSQL, after rows are written into, changed
in and removed from days already kept."""

from __future__ import annotations

import math
import random
from typing import Any

from gateway.metering.reports import UsageStore
from gateway.metering.usage import UsageRecord
from gateway.storage.db import Db
from gateway.storage.store import Store

DAY = 86400
START, END = 10.5 * DAY, 17.25 * DAY  # days 11 to 16 whole, part days at each end


def record(n: int, rng: random.Random, **extra: Any) -> UsageRecord:
    fields: dict[str, Any] = {
        "id": f"t{n}:1",
        "turn_id": f"t{n}",
        "conversation_id": "c",
        "team_id": rng.choice(["red", "blue", None]),
        "key_id": rng.choice(["k1", "k2"]),
        "user": rng.choice(["ann", "bob", None]),
        "alias": "m",
        "deployment": rng.choice(["d", "e", "f"]),
        "provider": "openai",
        "model": "x",
        "created_at": 10 * DAY + rng.random() * 8 * DAY,
        "status": "completed",
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "completion_delivered": 5,
        "reasoning_tokens": 0,
        "cached_tokens": 0,
        "usage_source": "provider",
        "cost_usd": 0.001,
        "ttft_ms": None if n % 5 == 0 else float(rng.randint(1, 900)),
        "duration_ms": float(rng.randint(100, 9000)),
    }
    return UsageRecord(**(fields | extra))


def expected(
    records: dict[str, UsageRecord], attribute: str, team: str | None = None
) -> list[dict[str, Any]]:
    """The report worked out from the records themselves."""
    values: dict[Any, tuple[list[float], list[float]]] = {}
    for r in records.values():
        if START <= r.created_at < END and (team is None or r.team_id == team):
            lists = values.setdefault(getattr(r, attribute), ([], []))
            if r.ttft_ms is not None:
                lists[0].append(r.ttft_ms)
            if r.duration_ms is not None:
                lists[1].append(r.duration_ms)
    out = []
    for group, (ttft, duration) in values.items():
        row: dict[str, Any] = {"group": group}
        for name, found in (("ttft_ms", sorted(ttft)), ("duration_ms", sorted(duration))):
            row[name] = {
                "count": len(found),
                **{
                    f"p{p}": found[math.ceil(p * len(found) / 100) - 1] if found else None
                    for p in (50, 95, 99)
                },
                "mean": round(sum(found) / len(found), 3) if found else None,
            }
        out.append(row)
    return sorted(out, key=lambda r: (r["group"] is None, str(r["group"])))


async def kept_days(store: Store) -> set[int]:
    """PostgreSQL: the days whose deployment values usage_latency_days holds."""

    async def op(db: Db) -> set[int]:
        rows = await db.fetch(
            "SELECT DISTINCT day FROM usage_latency_days WHERE dimension = 'latency:deployment'"
        )
        return {int(row[0]) // DAY for row in rows}

    return await store.run(op)


async def test_kept_days_answer_as_the_rows_do_after_late_writes(store: Store) -> None:
    rng = random.Random(7)
    usage = UsageStore(store)
    records = {f"t{n}:1": record(n, rng) for n in range(600)}
    for r in records.values():
        usage.write(r)
    await store.flush()
    span = {"start": START, "end": END, "timeout_s": 10}

    async def check() -> None:
        for group_by, attribute in (("deployment", "deployment"), ("user", "user")):
            rows = await usage.latency(group_by=group_by, team_id=None, **span)
            assert rows == expected(records, attribute), group_by
        rows = await usage.latency(group_by="key", team_id="red", **span)
        assert rows == expected(records, "key_id", team="red")

    await check()
    if store.dialect == "postgresql":  # the whole days of the range, each kept once
        assert await kept_days(store) == set(range(11, 17))
    assert await usage.latency(group_by="deployment", team_id=None, **span) == expected(
        records, "deployment"
    )

    # A row into a kept day, of a new group.
    late = record(900, rng, created_at=13.5 * DAY, deployment="g", duration_ms=1.0)
    records[late.id] = late
    usage.write(late)
    await store.flush()
    if store.dialect == "postgresql":  # the day dropped, to be kept again
        assert await kept_days(store) == set(range(11, 17)) - {13}
    await check()
    if store.dialect == "sqlite":
        return  # the gateway only adds rows to SQLite's table (gateway.storage.schema)
    # PostgreSQL's are changed by other replicas' spools and by hand: one moved from a kept
    # day to another, one gone.
    moved = next(r for r in records.values() if 14 * DAY <= r.created_at < 15 * DAY)
    gone = next(r for r in records.values() if 12 * DAY <= r.created_at < 13 * DAY)
    records[moved.id] = UsageRecord(**(moved.row() | {"created_at": 16.5 * DAY}))
    del records[gone.id]

    async def change(db: Db) -> None:
        await db.execute("UPDATE usage SET created_at = ? WHERE id = ?", 16.5 * DAY, moved.id)
        await db.execute("DELETE FROM usage WHERE id = ?", gone.id)

    await store.transact(change)
    assert await kept_days(store) == {11, 13, 15}
    await check()
    assert await kept_days(store) == set(range(11, 17))
