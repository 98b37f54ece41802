"""A database slower than the durability bound (a lock held, a backlog): what it has not taken
is copied to the spool, so a turn whose client is answered is durable on this machine whatever
the database does, and everything still lands once, in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.config import StoreConfig
from gateway.storage import store as store_module
from gateway.storage.backends import make_store
from gateway.storage.backlog import Mark
from gateway.storage.db import Db
from gateway.storage.payload import DeferredPayload
from gateway.storage.records import Conversation, NewEvent, TurnStart
from gateway.storage.store import Store
from gateway.storage.writes import USAGE_COLUMNS, Write

MakeStore = Callable[[], Awaitable[Store]]


@pytest.fixture(autouse=True)
def short_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_module, "_ACK_WAIT_S", 0.05)


@pytest.fixture(params=["sqlite", "sqlite-no-journal", "postgresql"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeStore]:
    """The same instance each call (a restart); those a test `crash`es are never closed."""
    url = (
        request.getfixturevalue("pg_url")
        if request.param == "postgresql"
        else f"sqlite:///{tmp_path}/store.db"
    )
    journal = request.param == "sqlite"
    made: list[Store] = []

    async def start() -> Store:
        config = StoreConfig(url=url, spool_path=str(tmp_path / "spool"), journal=journal)
        store = make_store(config, "me")
        await store.start()
        made.append(store)
        return store

    yield start
    for release in held:  # a test that failed while holding commits
        release.set()
    held.clear()
    for store in reversed(made):
        if store not in crashed:
            await store.close()
    crashed.clear()


crashed: list[Store] = []
held: list[asyncio.Event] = []


def hold(store: Store, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The database takes no batch until the event is set (a table locked, a slow disk), and
    a long answer is queued first, which the journal cannot take (it is encoded only as the
    database stores it): turns behind it wait for a commit that does not come."""
    release = asyncio.Event()
    held.append(release)
    applied = store.backend.apply

    async def held_back(writes: list[Write]) -> None:
        await release.wait()
        await applied(writes)

    monkeypatch.setattr(store.backend, "apply", held_back)
    store.create_conversation(Conversation("long", 1.0))
    store.append(NewEvent("long", "t", "assistant/message", DeferredPayload({"content": ["x"]})))
    return release


async def crash(store: Store) -> None:
    """The process dies: nothing more reaches the database, and the store is never closed."""
    crashed.append(store)
    for task in asyncio.all_tasks():
        if task.get_name().startswith("store-"):  # its writer, and the spool's replay
            task.cancel()
    await store.backend.close()


def a_stream_starts(store: Store, cid: str) -> Mark:
    """A streamed turn's start and input, as the recorder submits them: its mark."""
    store.create_conversation(Conversation(cid, 1.0))
    store.start_turn(TurnStart(f"t-{cid}", cid, 1.0, {"model": "m"}))
    store.append(NewEvent(cid, f"t-{cid}", "user/message", {"content": f"question {cid}"}))
    return store.mark()


async def test_a_turn_the_database_holds_back_is_in_the_spool_when_its_client_is_answered(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make()
    hold(store, monkeypatch)
    mark = a_stream_starts(store, "held")
    assert not store.durable(mark)
    async with asyncio.timeout(5):
        await store.durable_enough()  # what a stream does before its client's first byte
    assert store.durable(mark)
    await crash(store)
    again = await make()  # the same instance, restarted: the spool replayed
    assert [e.payload["content"] for e in await again.events("held")] == ["question held"]
    assert [e.payload["content"] for e in await again.events("long")] == [["x"]]


async def test_writes_copied_to_the_spool_and_committed_too_land_once_in_order(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await make()
    release = hold(store, monkeypatch)
    a_stream_starts(store, "c")
    estimate = {
        **dict.fromkeys(USAGE_COLUMNS),
        **dict.fromkeys(("prompt_tokens", "completion_tokens", "completion_delivered"), 0),
        **dict.fromkeys(("reasoning_tokens", "cached_tokens", "created_at"), 0),
        **{"id": "u1", "turn_id": "t-c", "conversation_id": "c", "status": "ok"},
        **{"deployment": "d", "provider": "p", "model": "m", "usage_source": "estimated"},
        "prompt_tokens": 3,
    }
    store.write("usage", estimate)
    await store.durable_enough()  # the bound passes: copied to the spool, then answered
    assert store.spooling
    # The turn goes on meanwhile: its final usage replaces the estimate, then its end.
    store.write("usage", {**estimate, "prompt_tokens": 7, "completion_tokens": 5})
    store.append(NewEvent("c", "t-c", "assistant/message", {"content": ["answer"]}))
    store.append(NewEvent("c", "t-c", "turn/end", {"status": "completed"}))
    release.set()  # the held batch commits, and the spool replays its copy of it
    await store.flush()
    async with asyncio.timeout(10):
        while store.spooling:
            await asyncio.sleep(0.01)
    events = await store.events("c")
    assert [(e.seq, e.type) for e in events] == [
        (1, "user/message"),
        (2, "assistant/message"),
        (3, "turn/end"),
    ]

    async def usage(db: Db) -> list[tuple[int, int]]:
        rows = await db.fetch("SELECT prompt_tokens, completion_tokens FROM usage WHERE id = 'u1'")
        return [tuple(r) for r in rows]

    assert await store.run(usage) == [(7, 5)]  # the final count, not the estimate replayed


async def test_a_store_that_keeps_up_copies_nothing_to_the_spool(
    make: MakeStore, tmp_path: Path
) -> None:
    store = await make()
    mark = a_stream_starts(store, "quick")
    await store.durable_enough()
    assert store.durable(mark) and not store.spooling
    assert not any(p.stat().st_size for p in (tmp_path / "spool").glob("*.log"))
