"""The store contract, on a real SQLite file."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.conversations.events import Conversation, NewEvent, TurnStart
from gateway.conversations.sqlite import SQLiteStore
from gateway.conversations.store import history_path


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteStore]:
    s = SQLiteStore(tmp_path / "sub" / "store.db")
    await s.start()
    yield s
    await s.close()


def event(cid: str, kind: str = "user/message", turn: str = "t1", **payload: object) -> NewEvent:
    return NewEvent(cid, turn, kind, dict(payload))


async def test_appends_get_increasing_seqs_and_reads_see_earlier_writes(store: SQLiteStore) -> None:
    store.create_conversation(Conversation("c1", 1.0))
    for i in range(5):
        store.append(event("c1", n=i))
    events = await store.events("c1")  # no flush needed: reads are ordered after writes
    assert [(e.seq, e.payload["n"]) for e in events] == [(1, 0), (2, 1), (3, 2), (4, 3), (5, 4)]
    assert [e.seq for e in await store.events("c1", up_to_seq=3)] == [1, 2, 3]


async def test_a_branch_continues_after_its_parent_seq(store: SQLiteStore) -> None:
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


async def test_turn_end_closes_the_turn(store: SQLiteStore) -> None:
    store.create_conversation(Conversation("c", 1.0))
    store.start_turn(TurnStart("t1", "c", 1.0, {"model": "demo"}))
    store.append(event("c"))
    assert await store.turn_ended("t1") is False
    store.append(event("c", "turn/end", status="completed"))
    assert await store.turn_ended("t1") is True
    assert await store.turn_ended("unknown") is False


async def test_one_bad_operation_does_not_sink_its_batch(store: SQLiteStore) -> None:
    store.create_conversation(Conversation("c", 1.0))
    store.start_turn(TurnStart("dup", "c", 1.0, {}))
    store.append(event("c", n=1))
    store.start_turn(TurnStart("dup", "c", 1.0, {}))  # primary key violation
    store.append(event("c", n=2))
    assert [e.payload["n"] for e in await store.events("c")] == [1, 2]


async def test_it_is_a_wal_file_that_survives_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    first = SQLiteStore(path)
    await first.start()
    first.create_conversation(Conversation("c", 1.0))
    first.append(event("c", text="kept"))
    await first.close()
    second = SQLiteStore(path)
    await second.start()
    assert [e.payload for e in await second.events("c")] == [{"text": "kept"}]
    second.append(event("c", text="next"))
    assert [e.seq for e in await second.events("c")] == [1, 2]
    await second.close()
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_writes_never_block_the_event_loop(store: SQLiteStore) -> None:
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
    assert ticks > 1  # the loop kept running while the thread wrote


async def test_ping(store: SQLiteStore) -> None:
    await store.ping()
