"""Writes are taken by the store's writer in fair turns by lane (gateway.storage.backlog): a
team's flood of writes does not hold another team's turn until the flood is committed, and
each lane's writes, each conversation's, keep the order they were submitted in."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from gateway.config import StoreConfig
from gateway.storage.backends import make_store
from gateway.storage.backlog import Backlog
from gateway.storage.records import Conversation, NewEvent, TurnStart
from gateway.storage.store import Store
from gateway.storage.writes import Write

MakeStore = Callable[[], Awaitable[Store]]


def event(text: str, size: int = 0) -> Write:
    return Write("event", {"type": "user/message", "payload": '"' + text + "x" * size + '"'})


def texts(writes: list[Write]) -> list[str]:
    return [w.row["payload"].strip('"').rstrip("x") for w in writes]


def filled(*lanes: tuple[object, list[str]]) -> Backlog:
    backlog = Backlog()
    number = 0
    for lane, names in lanes:
        for name in names:
            backlog.add(number, lane, event(name))
            number += 1
    return backlog


# -- the backlog ---------------------------------------------------------------------------


def test_each_lane_gets_its_share_of_a_batch_in_its_own_order() -> None:
    backlog = filled(("a", [f"a{n}" for n in range(10)]), ("b", ["b0", "b1"]))
    batch = texts(backlog.take(6, 1 << 20))
    assert sorted(batch) == ["a0", "a1", "a2", "a3", "b0", "b1"]
    assert [t for t in batch if t[0] == "a"] == ["a0", "a1", "a2", "a3"]
    assert batch.index("b0") < batch.index("b1")
    backlog.done(6)
    assert texts(backlog.take(6, 1 << 20)) == ["a4", "a5", "a6", "a7", "a8", "a9"]


def test_a_batch_is_bounded_by_the_json_it_carries_and_each_lane_still_gets_one() -> None:
    backlog = Backlog()
    for n in range(4):
        backlog.add(n, "a", event(f"a{n}", size=1000))
    backlog.add(4, "b", event("b0", size=1000))
    assert sorted(texts(backlog.take(100, 2000))) == ["a0", "b0"]


def test_a_write_of_no_lane_is_taken_after_everything_before_it_and_before_everything_after() -> (
    None
):
    backlog = Backlog()
    for number, (lane, name) in enumerate(
        [("a", "a0"), ("a", "a1"), ("b", "b0"), (None, "barrier"), ("b", "b1"), ("a", "a2")]
    ):
        backlog.add(number, lane, event(name))
    order = []
    while len(backlog):
        batch = backlog.take(2, 1 << 20)
        order += texts(batch)
        backlog.done(len(batch))
    assert set(order[:3]) == {"a0", "a1", "b0"} and order.index("a0") < order.index("a1")
    assert order[3] == "barrier" and set(order[4:]) == {"b1", "a2"}


def test_what_is_handled_and_what_is_not_is_told_by_lane_and_in_order() -> None:
    backlog = filled(("a", ["a0", "a1", "a2", "a3"]), ("b", ["b0"]))  # numbered 0-3, 4
    backlog.take(2, 1 << 20)  # a0 and b0: an equal share
    assert not backlog.settled("b", 5) and backlog.oldest() == 0
    backlog.done(2)
    assert backlog.settled("b", 5) and not backlog.settled("a", 3) and backlog.settled("a", 1)
    assert backlog.oldest() == 1 and backlog.count("a") == 3 and backlog.behind == 3
    assert texts(backlog.unhandled(2)) == ["a2", "a3"]


def test_writes_not_handled_go_back_to_be_taken_first_in_their_order() -> None:
    backlog = filled(("a", ["a0", "a1", "a2"]), ("b", ["b0", "b1"]))
    assert texts(backlog.take(4, 1 << 20)) == ["a0", "a1", "b0", "b1"]
    backlog.done(1)  # the first handled; the spool's disk refused the rest
    assert texts(backlog.unhandled()) == ["a1", "a2", "b0", "b1"] and backlog.oldest() == 1
    again = texts(backlog.take(10, 1 << 20))
    assert sorted(again) == ["a1", "a2", "b0", "b1"]
    assert [t for t in again if t[0] == "a"] == ["a1", "a2"]
    assert [t for t in again if t[0] == "b"] == ["b0", "b1"]


# -- the store -----------------------------------------------------------------------------


@pytest.fixture(params=["sqlite-no-journal", "postgresql"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeStore]:
    """A store whose turns wait for the database's commit (a journal would answer for them
    before it)."""
    url = (
        request.getfixturevalue("pg_url")
        if request.param == "postgresql"
        else f"sqlite:///{tmp_path}/store.db"
    )
    made: list[Store] = []

    async def start() -> Store:
        config = StoreConfig(url=url, spool_path=str(tmp_path / "spool"), journal=False)
        store = make_store(config, "me")
        await store.start()
        made.append(store)
        return store

    yield start
    for store in reversed(made):
        await store.close()


def a_turn(store: Store, team: str | None, cid: str, messages: int, key: str | None = None) -> None:
    """A turn of `team` whose request holds `messages` messages (an agent's long history)."""
    store.create_conversation(Conversation(cid, 1.0, team_id=team, key_id=key))
    store.start_turn(TurnStart(f"t-{cid}", cid, 1.0, {}, team_id=team, key_id=key))
    for n in range(messages):
        store.append(NewEvent(cid, f"t-{cid}", "user/message", {"content": f"{team} {n}"}))


async def test_a_team_s_turn_is_committed_ahead_of_another_team_s_flood(
    make: MakeStore,
) -> None:
    store = await make()
    flood, other = contextvars.copy_context(), contextvars.copy_context()
    flood.run(a_turn, store, "a", "flood", 2000)  # four batches of writes and more
    flood_mark = flood.run(store.mark)
    other.run(a_turn, store, "b", "other", 1)
    behind_when_answered = []

    async def answered() -> None:
        await store.durable_enough()
        behind_when_answered.append(store.pending_writes())

    async with asyncio.timeout(30):
        await asyncio.create_task(answered(), context=other)
    # Durable in the database, while most of the flood is still to be written.
    assert behind_when_answered[0] > 1000 and not store.durable(flood_mark)
    committed = await store.backend.run(
        lambda db: db.fetchval("SELECT count(*) FROM events WHERE conversation_id = 'other'")
    )
    assert committed == 1
    await store.flush()
    assert store.durable(flood_mark)
    flooded = [e.payload["content"] for e in await store.events("flood")]
    assert flooded == [f"a {n}" for n in range(2000)]
    assert [e.payload["content"] for e in await store.events("other")] == ["b 0"]


def test_a_lane_whose_last_write_passes_its_share_of_the_budget_is_emptied_cleanly() -> None:
    backlog = Backlog()
    backlog.add(0, "a", event("a0", size=1000))
    backlog.add(1, "a", event("a1", size=1000))
    assert texts(backlog.take(10, 1500)) == ["a0", "a1"]
    backlog.done(2)
    assert len(backlog) == 0 and backlog.oldest() is None and backlog.settled("a", 2)


def test_a_lane_alone_is_taken_a_batch_at_a_time() -> None:
    backlog = Backlog()
    for n in range(10):
        backlog.add(n, "a", event(f"a{n}"))
    assert texts(backlog.take(4, 1 << 20)) == ["a0", "a1", "a2", "a3"]


def test_writes_of_no_lane_alone_are_one_queue() -> None:
    """Open mode: no keys, no teams, every write a barrier, taken in order."""
    backlog = filled((None, [f"w{n}" for n in range(5)]))
    assert texts(backlog.take(3, 1 << 20)) == ["w0", "w1", "w2"]
    backlog.done(3)
    backlog.add(5, "a", event("a0"))
    backlog.add(6, None, event("w5"))
    assert texts(backlog.take(10, 1 << 20)) == ["w3", "w4", "a0", "w5"]


def test_the_oldest_write_not_handled_is_found_behind_a_failed_batch_put_back() -> None:
    """The database refused a batch that held a later write of another lane than an older one
    still queued: nothing before the older one may count as handled."""
    backlog = Backlog()
    backlog.add(0, "a", event("a0", size=10))
    backlog.add(1, "a", event("a1", size=10))
    backlog.add(2, "b", event("b0", size=10))
    assert texts(backlog.take(512, 1)) == ["a0"]  # the budget: one write, then b's turn
    backlog.done(1)
    assert texts(backlog.take(512, 1)) == ["b0"]
    backlog.done(0)  # refused: it goes back
    assert backlog.oldest() == 1 and not backlog.settled("a", 2)
    assert texts(backlog.unhandled()) == ["a1", "b0"]


def test_what_is_not_handled_comes_in_the_order_it_was_submitted_across_lanes() -> None:
    backlog = filled(("a", ["a0"]), ("b", ["b0"]), ("a", ["a1"]))  # numbered a0 0, b0 1, a1 2
    batch = backlog.take(512, 1 << 20)
    assert texts(batch) == ["a0", "a1", "b0"]  # lane after lane
    assert texts(backlog.unhandled()) == ["a0", "b0", "a1"]  # as submitted (the journal's order)


async def answered_while_flooded(store: Store, request: contextvars.Context) -> int:
    """`durable_enough` in a request's context, with another team's flood queued before its
    writes: the writes still to be written when it returned."""
    behind = []

    async def answered() -> None:
        await store.durable_enough()
        behind.append(store.pending_writes())

    async with asyncio.timeout(30):
        await asyncio.create_task(answered(), context=request)
    return behind[0]


async def test_a_turn_waits_for_a_write_of_no_lane_it_submitted(make: MakeStore) -> None:
    """A write after a turn's end (a lane of none: it orders with every write) is durable
    before the turn's client is answered, flood or not."""
    store = await make()
    contextvars.copy_context().run(a_turn, store, "a", "flood", 2000)
    request = contextvars.copy_context()
    request.run(a_turn, store, "b", "other", 1)
    request.run(store.append, NewEvent("other", "t-other", "turn/end", {"status": "completed"}))
    request.run(store.append, NewEvent("other", "t-other", "conversation/note", {"note": "x"}))
    await answered_while_flooded(store, request)
    noted = await store.backend.run(
        lambda db: db.fetchval(
            "SELECT count(*) FROM events WHERE conversation_id = 'other' AND type = ?",
            "conversation/note",
        )
    )
    assert noted == 1


async def test_a_stored_response_of_a_key_of_no_team_keeps_its_turn_s_lane(
    make: MakeStore,
) -> None:
    """Its row names no team and no key: it goes in its turn's lane, not behind the flood."""
    store = await make()
    contextvars.copy_context().run(a_turn, store, "a", "flood", 2000)
    request = contextvars.copy_context()
    request.run(a_turn, store, None, "keyed", 1, key="key_k")
    row = {"id": "resp_1", "turn_id": "t-keyed", "conversation_id": "keyed", "team_id": None}
    row |= {"created_at": 1.0, "request": "{}", "previous_response_id": None, "store": 1}
    request.run(store.write, "response", row)
    assert await answered_while_flooded(store, request) > 1000


def test_a_lane_alone_is_taken_within_the_budget_too() -> None:
    backlog = Backlog()
    for n in range(3):
        backlog.add(n, "a", event(f"a{n}", size=1000))
    assert texts(backlog.take(512, 2000)) == ["a0", "a1"]
    backlog.done(2)
    assert texts(backlog.take(512, 2000)) == ["a2"]
