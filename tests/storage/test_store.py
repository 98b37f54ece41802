"""The store contract: the same behaviour on a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.config import StoreConfig
from gateway.conversations.path import history_path
from gateway.storage import schema
from gateway.storage.backends import make_store
from gateway.storage.db import Db
from gateway.storage.records import Conversation, NewEvent, TurnStart
from gateway.storage.store import SchemaBehind, Store
from gateway.storage.writes import Write

MakeStore = Callable[..., Awaitable[Store]]


@pytest.fixture(params=["sqlite", "postgresql"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeStore]:
    url = (
        f"sqlite:///{tmp_path}/sub/store.db"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    made: list[Store] = []

    async def start(owner: str = "test", **options: object) -> Store:
        config = StoreConfig(url=url, spool_path=str(tmp_path / "spool"), **options)  # type: ignore[arg-type]
        store = make_store(config, owner)
        await store.start()
        made.append(store)
        return store

    yield start
    for store in reversed(made):  # closing again a store the test closed changes nothing
        await store.close()


@pytest.fixture
async def store(make: MakeStore) -> Store:
    return await make()


def event(cid: str, kind: str = "user/message", turn: str = "t1", **payload: object) -> NewEvent:
    return NewEvent(cid, turn, kind, dict(payload))


async def test_appends_get_increasing_seqs_and_reads_see_earlier_writes(store: Store) -> None:
    store.create_conversation(Conversation("c1", 1.0))
    for i in range(5):
        store.append(event("c1", n=i))
    events = await store.events("c1")  # no flush needed: reads are ordered after writes
    assert [(e.seq, e.payload["n"]) for e in events] == [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
    assert [e.seq for e in await store.events("c1", up_to_seq=3)] == [1, 2, 3]


async def test_a_branch_continues_after_its_parent_seq(store: Store) -> None:
    store.create_conversation(Conversation("p", 1.0))
    for i in range(4):
        store.append(event("p", n=i))
    store.create_conversation(Conversation("b", 2.0, parent_id="p", parent_seq=2))
    store.append(event("b", n="own"))
    store.append(event("p", n="parent goes on"))
    path = await history_path(store, "b")
    assert [(e.conversation_id, e.seq) for e in path] == [("p", 1), ("p", 2), ("b", 3)]
    assert [e.seq for e in await history_path(store, "p")] == [1, 2, 3, 4, 5]
    with pytest.raises(KeyError):
        await history_path(store, "missing")


async def test_turn_end_closes_the_turn(store: Store) -> None:
    store.create_conversation(Conversation("c", 1.0))
    store.start_turn(TurnStart("t1", "c", 1.0, {"model": "demo"}))
    store.append(event("c"))
    assert await store.turn_ended("t1") is False
    store.append(event("c", "turn/end", status="completed"))
    assert await store.turn_ended("t1") is True
    assert await store.turn_ended("unknown") is False


async def test_after_a_turns_end_reads_what_follows_its_last_message(store: Store) -> None:
    store.create_conversation(Conversation("c", 1.0))
    for n, turn in enumerate(["t1", "t2", "t3"]):
        store.start_turn(TurnStart(turn, "c", 1.0 + n, {}))
        store.append(event("c", turn=turn, n=f"{turn} question"))
        store.append(event("c", "assistant/message", turn=turn, n=f"{turn} answer"))
        end = event("c", "turn/end", turn=turn, status="completed")
        end.fingerprint = f"after {turn}"
        store.append(end)
    seq, after = await store.after_end("c", "after t2", limit=3) or (0, [])
    assert seq == 5  # t2's answer; its end, then t3's question and answer follow
    assert [(e.seq, e.turn_id, e.type) for e in after] == [
        (6, "t2", "turn/end"), (7, "t3", "user/message"), (8, "t3", "assistant/message")
    ]  # fmt: skip
    assert after[1].payload == {"n": "t3 question"}
    last = await store.after_end("c", "after t3", limit=3)
    assert last is not None and last[0] == 8 and [e.seq for e in last[1]] == [9]
    assert await store.after_end("c", "after nothing", limit=3) is None
    assert await store.after_end("other", "after t2", limit=3) is None


async def test_a_write_applied_twice_lands_once(store: Store) -> None:
    """What makes spool replay exactly-once: every write is keyed."""
    store.create_conversation(Conversation("c", 1.0))
    store.create_conversation(Conversation("c", 1.0))
    store.start_turn(TurnStart("t", "c", 1.0, {}))
    store.start_turn(TurnStart("t", "c", 1.0, {}))
    once = event("c", n=1)
    store.append(once)
    store.append(once)
    store.append(event("c", n=2))
    assert [(e.seq, e.payload["n"]) for e in await store.events("c")] == [(1, 1), (2, 2)]


async def test_one_bad_write_does_not_sink_its_batch(store: Store) -> None:
    store.create_conversation(Conversation("c", 1.0))
    store.append(event("c", n=1))
    store.write("usage", {"id": "u1"})  # NOT NULL columns missing: refused by the database
    store.append(event("c", n=2))
    assert [e.payload["n"] for e in await store.events("c")] == [1, 2]


async def test_a_write_from_before_a_column_existed_lands_with_it_null(store: Store) -> None:
    """A spooled or journaled row written by an older gateway lacks the columns added since
    (a turn's `owner`, its team and key): it lands, those NULL, beside rows that have them."""
    store.create_conversation(Conversation("c", 1.0))
    await store.flush()
    old = {"id": "old", "conversation_id": "c", "started_at": 1.0, "request": "{}"}
    new = {**old, "id": "new", "team_id": "t", "key_id": "k", "owner": "test"}
    await store.backend.apply([Write("turn", old), Write("turn", new)])  # one batch

    async def turns(db: Db) -> list[tuple[object, ...]]:
        rows = await db.fetch("SELECT id, team_id, owner FROM turns ORDER BY id")
        return [tuple(row) for row in rows]

    assert await store.backend.run(turns) == [("new", "t", "test"), ("old", None, None)]


async def test_a_batch_ends_the_turns_it_starts_and_the_turns_stored_before_it(
    store: Store,
) -> None:
    """A turn whose start and end share a commit is inserted ended, so it is never an open
    turn; an end whose turn was stored by an earlier commit, or is written again (a replay),
    ends that turn all the same."""
    store.create_conversation(Conversation("c", 1.0))
    store.start_turn(TurnStart("earlier", "c", 1.0, {}))
    store.start_turn(TurnStart("replayed", "c", 1.0, {}))
    await store.flush()

    def start(turn: str) -> Write:
        row = {"id": turn, "conversation_id": "c", "started_at": 2.0, "request": "{}"}
        return Write("turn", {**row, "team_id": None, "key_id": None, "owner": "test"})

    def end(turn: str, status: str) -> Write:
        payload = f'{{"status":"{status}"}}'
        row = {"conversation_id": "c", "turn_id": turn, "type": "turn/end", "created_at": 3.0}
        return Write("event", {**row, "payload": payload, "uid": f"end-{turn}", "status": status})

    batch = [start("both"), start("replayed"), start("open"), end("both", "completed")]
    batch += [end("earlier", "aborted"), end("replayed", "error")]
    await store.backend.apply(batch)  # one batch, one transaction

    async def turns(db: Db) -> list[tuple[object, ...]]:
        rows = await db.fetch("SELECT id, ended_at, status FROM turns ORDER BY id")
        return [tuple(row) for row in rows]

    assert await store.backend.run(turns) == [
        ("both", 3.0, "completed"),
        ("earlier", 3.0, "aborted"),
        ("open", None, None),
        ("replayed", 3.0, "error"),
    ]
    assert await store.claim_orphaned_turns(own=True, stale_before=0.0) == [("open", "c", None)]


async def test_it_survives_a_restart(make: MakeStore) -> None:
    first = await make()
    first.create_conversation(Conversation("c", 1.0))
    first.append(event("c", text="kept"))
    await first.close()
    second = await make()
    assert [e.payload for e in await second.events("c")] == [{"text": "kept"}]
    second.append(event("c", text="next"))
    assert [e.seq for e in await second.events("c")] == [1, 2]


async def test_sqlite_is_a_wal_file(tmp_path: Path) -> None:
    store = make_store(
        StoreConfig(url=f"sqlite:///{tmp_path}/s.db", spool_path=str(tmp_path / "spool")), "t"
    )
    await store.start()
    await store.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_writes_never_block_the_event_loop(store: Store) -> None:
    store.create_conversation(Conversation("c", 1.0))
    loop = asyncio.get_running_loop()
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = loop.create_task(ticker())
    for i in range(2000):
        store.append(event("c", n=i))
    await store.flush()
    task.cancel()
    assert len(await store.events("c")) == 2000
    assert ticks > 1  # the loop kept running while the writer wrote


async def test_migrations_are_versioned_and_idempotent(store: Store) -> None:
    async def version(db: Db) -> int:
        return await schema.current_version(db)

    assert await store.run(version) == schema.latest(store.dialect)
    assert await store.transact(schema.migrate) == []  # nothing left to apply


async def test_a_store_behind_its_migrations_refuses_to_start(
    make: MakeStore, tmp_path: Path
) -> None:
    first = await make()

    async def rewind(db: Db) -> None:
        await db.execute("DELETE FROM schema_migrations WHERE version > 0")

    await first.run(rewind)
    await first.close()
    with pytest.raises(SchemaBehind, match="gateway migrate"):
        await make(migrate_on_start=False)


async def test_orphaned_turns_are_claimed_once(make: MakeStore) -> None:
    """A restarted process claims its previous life's open turns; a live replica's are left
    alone until its heartbeat stops."""
    me = await make(owner="a")
    other = await make(owner="b")
    await me.heartbeat(1.0)
    await other.heartbeat(1.0)
    me.create_conversation(Conversation("c", 1.0))
    me.start_turn(TurnStart("mine", "c", 1.0, {}))
    other.start_turn(TurnStart("theirs", "c", 2.0, {}))
    await me.flush()
    await other.flush()
    assert await me.claim_orphaned_turns(own=True, stale_before=0.0) == [("mine", "c", None)]
    assert await me.claim_orphaned_turns(own=True, stale_before=0.0) == [("mine", "c", None)]
    minute_ago = time.time() - 60
    assert await me.claim_orphaned_turns(own=False, stale_before=minute_ago) == []

    async def b_stops_beating(db: Db) -> None:
        await db.execute("UPDATE instances SET heartbeat_at = 1 WHERE id = 'b'")

    await me.run(b_stops_beating)
    third = await make(owner="c")
    claims = await asyncio.gather(
        me.claim_orphaned_turns(own=False, stale_before=minute_ago),
        third.claim_orphaned_turns(own=False, stale_before=minute_ago),
    )
    assert sorted(claims, key=len) == [[], [("theirs", "c", None)]]


async def test_durable_enough_returns_once_the_writes_before_it_are_committed(
    make: MakeStore,
) -> None:
    store = await make(journal=False)  # (with a journal: once they are in it, test_journal.py)
    store.create_conversation(Conversation("d", 1.0))
    store.append(event("d", n=1))
    await store.durable_enough()
    # The write is in the database, not only in the queue.
    assert store.pending_writes() == 0
    assert [e.payload["n"] for e in await store.events("d")] == [1]


async def test_durable_enough_answers_anyway_when_the_store_hangs(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.storage import store as store_module

    store = await make(journal=False)

    monkeypatch.setattr(store_module, "_ACK_WAIT_S", 0.05)
    release = asyncio.Event()
    applied = store.backend.apply

    async def hanging(writes: list[object]) -> None:
        await release.wait()
        await applied(writes)  # type: ignore[arg-type]

    monkeypatch.setattr(store.backend, "apply", hanging)
    store.create_conversation(Conversation("h", 1.0))
    waits = [asyncio.create_task(store.durable_enough()) for _ in range(3)]
    _, pending = await asyncio.wait(waits, timeout=10)
    assert not pending  # the cap released every waiter, though nothing was committed
    assert store.pending_writes() > 0
    release.set()
    await store.flush()
    assert await store.get_conversation("h") is not None  # and nothing was lost


async def _held_back(store: Store, committed: Callable[[], bool]) -> None:
    """The writer, woken by the queued writes, holds them back for more (the gather in
    gateway/storage/store.py): after turns of the loop enough to write them, none is committed
    and all still wait."""
    queued = store.queue_depth()
    assert queued > 0
    for _ in range(20):
        await asyncio.sleep(0)
    assert store.queue_depth() == queued and not committed()


async def test_a_turn_that_ends_quickly_is_one_commit(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    batches: list[int] = []
    applied = store.backend.apply

    async def counting(writes: list[object]) -> None:
        batches.append(len(writes))
        await applied(writes)  # type: ignore[arg-type]

    monkeypatch.setattr(store.backend, "apply", counting)
    store.create_conversation(Conversation("q", 1.0))
    store.start_turn(TurnStart("tq", "q", 1.0, {}))
    store.append(event("q", turn="tq", n=1))
    await _held_back(store, lambda: bool(batches))  # nobody needs the start durable yet
    store.append(event("q", "turn/end", turn="tq", status="completed"))
    await store.durable_enough()  # the end is waited on (or journaled): then all goes together
    assert [e.type for e in await store.events("q")] == ["user/message", "turn/end"]
    assert batches == [4]


async def test_writes_nobody_waits_for_are_committed_within_a_moment(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gateway.storage import store as store_module

    monkeypatch.setattr(store_module, "_GATHER_S", 0.01)
    committed = asyncio.Event()
    applied = store.backend.apply

    async def noting(writes: list[object]) -> None:
        await applied(writes)  # type: ignore[arg-type]
        committed.set()

    monkeypatch.setattr(store.backend, "apply", noting)
    store.create_conversation(Conversation("w", 1.0))
    await _held_back(store, committed.is_set)
    async with asyncio.timeout(5):
        await committed.wait()  # no read, no durability wait, no close: the gather ran out
    assert store.pending_writes() == 0
