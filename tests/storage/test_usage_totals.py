"""A conversation's usage totals (what the list sorts and filters by) stay equal to its usage
records summed, to the last bit, however they are written: new records added one by one, a
record rewritten (a drained stream's usage replacing its estimate), a batch replayed, records
of several conversations and attempts in one batch; on both stores."""

from __future__ import annotations

import random
from typing import Any

from gateway.storage import schema
from gateway.storage.records import TURN_END, Conversation, NewEvent, TurnStart
from gateway.storage.store import Store
from tests.conversations.test_listing import usage_row

T0 = 1_700_000_000.0
TOTALS = (
    "attempts",
    "failed_attempts",
    "cost_usd",
    "unpriced_attempts",
    "prompt_tokens",
    "completion_tokens",
    "completion_delivered",
    "ttft_ms",
    "duration_ms",
)
# The totals as SQL makes them from the records, for the comparison.
SUMMED = (
    "SELECT COUNT(*), COALESCE(SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END), 0),"
    " SUM(cost_usd), COALESCE(SUM(CASE WHEN cost_usd IS NULL THEN 1 ELSE 0 END), 0),"
    " COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0),"
    " COALESCE(SUM(completion_delivered), 0), AVG(ttft_ms), SUM(duration_ms)"
    " FROM usage WHERE conversation_id = ?"
)


async def kept_and_summed(store: Store, cid: str) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The totals on the conversation's row and its last activity; the same made from its
    usage records and turns."""

    async def read(db: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
        columns = ", ".join((*TOTALS, "updated_at"))
        kept = await db.fetchrow(f"SELECT {columns} FROM conversations WHERE id = ?", cid)
        summed = await db.fetchrow(SUMMED, cid)
        latest = await db.fetchval(
            "SELECT MAX(COALESCE(ended_at, started_at)) FROM turns WHERE conversation_id = ?", cid
        )
        return tuple(kept), (*summed, latest)

    return await store.run(read)


def attempt(turn: str, cid: str, n: int, rng: random.Random) -> dict[str, Any]:
    return usage_row(
        turn,
        cid,
        n,
        status=rng.choice(["completed", "completed", "error", "interrupted"]),
        cost=rng.choice([None, rng.random() / 7, rng.random() * 3]),
        ttft=rng.choice([None, rng.random() * 900, 123.456]),
        duration=rng.choice([None, rng.random() * 5000]),
        prompt=rng.randrange(0, 5000),
        completion=rng.choice([None, rng.randrange(0, 900)]),
    )


async def test_totals_equal_the_records_summed_however_written(store: Store) -> None:
    rng = random.Random(7)
    cids = ["c1", "c2", "c3"]
    for cid in cids:
        store.create_conversation(Conversation(cid, T0, team_id="A", key_id="kA1"))
    written: list[dict[str, Any]] = []
    for t in range(40):
        cid = rng.choice(cids)
        turn = f"t{t}"
        store.start_turn(TurnStart(turn, cid, T0 + t, {"model": "m1"}, "A", "kA1"))
        for n in range(1, rng.randrange(2, 4)):  # a retry or a fallback: several attempts
            row = attempt(turn, cid, n, rng)
            store.write("usage", row)
            written.append(row)
        if t % 3 == 0:  # an end, which is the conversation's latest activity then
            store.append(
                NewEvent(cid, turn, TURN_END, {"status": "completed"}, created_at=T0 + t + 0.5)
            )
        if t % 5 == 2:  # a record in a batch of its own: no activity comes with it
            await store.flush()
            row = attempt(turn, cid, 9, rng)
            store.write("usage", row)
            written.append(row)
        if t % 7 == 3:
            # A drained stream's usage replacing an earlier estimate of the same attempt.
            again = {**rng.choice(written), "completion_tokens": 777, "cost_usd": 0.3}
            store.write("usage", again)
        if t % 11 == 5:
            await store.flush()  # batches of every size, and one write alone
        if t % 13 == 4:
            for row in written[-3:]:  # a replay of what was written already
                store.write("usage", row)
    await store.flush()
    for cid in cids:
        kept, summed = await kept_and_summed(store, cid)
        assert kept == summed, cid


async def test_a_store_made_before_the_sums_gets_them_when_migrated(store: Store) -> None:
    """The migration that adds the time to first token's sum and count fills them from the
    records already there (a row of before it has the columns' defaults), so the next record
    added keeps the average right."""
    [sums] = [m for m in schema.MIGRATIONS[store.backend.dialect] if m.name.startswith("time to")]
    store.create_conversation(Conversation("c1", T0, team_id="A", key_id="kA1"))
    store.start_turn(TurnStart("t1", "c1", T0, {"model": "m1"}, "A", "kA1"))
    store.write("usage", usage_row("t1", "c1", 1, ttft=100.0, cost=0.5))
    store.write("usage", usage_row("t1", "c1", 2, ttft=None, cost=0.25))
    await store.flush()

    async def as_before_then_migrated(db: Any) -> None:
        await db.execute("UPDATE conversations SET ttft_sum_ms = NULL, ttft_attempts = 0")
        await db.execute(sums.statements[-1])  # the migration's filling of them

    await store.transact(as_before_then_migrated)
    store.start_turn(TurnStart("t2", "c1", T0 + 1, {"model": "m1"}, "A", "kA1"))
    store.write("usage", usage_row("t2", "c1", 1, ttft=300.0, cost=0.125))
    await store.flush()
    kept, summed = await kept_and_summed(store, "c1")
    assert kept == summed
    assert kept[TOTALS.index("ttft_ms")] == 200.0
    assert kept[-1] == T0 + 1
