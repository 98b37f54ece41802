"""The journal (gateway.storage.journal): on a SQLite store, a turn is durable once its writes
are in the journal, before the database commits them; what a crash leaves there is in the
database before the next start serves anything; and the journal keeps only what the database
does not have yet."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gateway.config import StoreConfig
from gateway.storage import journal as journal_module
from gateway.storage.backends import make_backend, make_store
from gateway.storage.journal import Journal
from gateway.storage.payload import DeferredPayload
from gateway.storage.records import Conversation, NewEvent, TurnStart
from gateway.storage.spool import Spool
from gateway.storage.store import Store
from gateway.storage.writes import Write

MakeStore = Callable[..., Awaitable[Store]]
Crash = Callable[[Store], Awaitable[None]]


@dataclass
class Made:
    stores: list[Store] = field(default_factory=list)
    crashed: list[Store] = field(default_factory=list)  # never to be closed


@pytest.fixture
def made() -> Made:
    return Made()


@pytest.fixture
async def make(tmp_path: Path, made: Made) -> AsyncIterator[MakeStore]:
    async def start(owner: str = "me", journal: Journal | None = None, **options: object) -> Store:
        """The store `make_store` makes (with `journal`: that one, which the test holds)."""
        config = StoreConfig(
            url=f"sqlite:///{tmp_path}/store.db",
            spool_path=str(tmp_path / "spool"),
            **options,  # type: ignore[arg-type]
        )
        if journal is None:
            store = make_store(config, owner)
        else:
            store = Store(
                make_backend(config), Spool(config.spool_path, owner), owner=owner, journal=journal
            )
        await store.start()
        made.stores.append(store)
        return store

    yield start
    for store in reversed(made.stores):  # closing again a store the test closed changes nothing
        if not any(store is crashed for crashed in made.crashed):
            await store.close()


@pytest.fixture
def crash(made: Made) -> Crash:
    async def crash(store: Store) -> None:
        """The process dies while the database holds its commits back (`hold_commits`): nothing
        more reaches the database, and the store is never closed."""
        made.crashed.append(store)
        await store.backend.close()

    return crash


def hold_commits(store: Store, monkeypatch: pytest.MonkeyPatch) -> asyncio.Event:
    """The database takes no batch until the event is set (a slow disk, a long checkpoint)."""
    release = asyncio.Event()
    applied = store.backend.apply

    async def held(writes: list[Write]) -> None:
        await release.wait()
        await applied(writes)

    monkeypatch.setattr(store.backend, "apply", held)
    return release


def a_turn(store: Store, cid: str, text: str = "hi") -> None:
    store.create_conversation(Conversation(cid, 1.0))
    store.start_turn(TurnStart(f"t-{cid}", cid, 1.0, {}))
    store.append(NewEvent(cid, f"t-{cid}", "user/message", {"content": text}))
    store.append(NewEvent(cid, f"t-{cid}", "assistant/message", {"content": [text]}))
    store.append(NewEvent(cid, f"t-{cid}", "turn/end", {"status": "completed"}))


async def waits_for_its_commit(store: Store, release: asyncio.Event, tmp_path: Path) -> None:
    """durable_enough journals nothing and returns only once the held commits are let go."""
    waiting = asyncio.ensure_future(store.durable_enough())
    await asyncio.sleep(0.05)  # time to return early, which it must not
    assert not waiting.done() and journal_writes(tmp_path) == 0
    release.set()
    async with asyncio.timeout(5):
        await waiting
    assert store.pending_writes() == 0


def journal_writes(tmp_path: Path) -> int:
    """The writes the journal's segments hold."""
    return sum(len(Journal.read(p)) for p in (tmp_path / "spool").glob("*.journal.*"))


async def test_a_turn_is_durable_once_journaled_before_any_commit(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = await make()
    release = hold_commits(store, monkeypatch)
    a_turn(store, "c1")
    async with asyncio.timeout(5):
        await store.durable_enough()  # returns though the database has committed nothing
    assert store.pending_writes() == 5
    assert journal_writes(tmp_path) == 5  # conversation, turn, three events
    release.set()
    assert [e.type for e in await store.events("c1")] == [
        "user/message",
        "assistant/message",
        "turn/end",
    ]


async def test_what_a_crash_left_in_the_journal_is_in_the_database_at_the_next_start(
    make: MakeStore, crash: Crash, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = await make()
    hold_commits(store, monkeypatch)
    a_turn(store, "lost-without-it", "what the user saw")
    await store.durable_enough()
    await crash(store)
    again = await make()  # the same instance, restarted
    events = await again.events("lost-without-it")
    assert [e.payload["content"] for e in events[:2]] == [
        "what the user saw",
        ["what the user saw"],
    ]
    assert await again.turn_ended("t-lost-without-it")
    assert journal_writes(tmp_path) == 0  # replayed, then gone


async def test_writes_committed_and_journaled_both_land_once(
    make: MakeStore, crash: Crash, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    journal = Journal(tmp_path / "spool", "me")
    store = await make(journal=journal)
    release = hold_commits(store, monkeypatch)
    a_turn(store, "both")
    await store.durable_enough()
    release.set()
    await store.flush()  # committed, and the crash comes before the journal is let go of
    monkeypatch.setattr(journal, "handled", lambda count: None)
    release.clear()  # the next commit is held back again: the crash comes before it
    a_turn(store, "second")
    await store.durable_enough()
    await crash(store)
    again = await make()
    assert [e.seq for e in await again.events("both")] == [1, 2, 3]
    assert [e.seq for e in await again.events("second")] == [1, 2, 3]


async def test_another_instances_journal_is_left_alone(
    make: MakeStore, crash: Crash, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = await make(owner="worker-1")
    hold_commits(store, monkeypatch)
    a_turn(store, "theirs")
    await store.durable_enough()
    await crash(store)
    other = await make(owner="worker-2")
    assert await other.get_conversation("theirs") is None  # worker-1's own restart replays it
    assert journal_writes(tmp_path) == 5


async def test_the_journal_keeps_only_what_the_database_does_not_have(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(journal_module, "SEGMENT_BYTES", 2000)  # a segment every few turns
    store = await make()
    release = hold_commits(store, monkeypatch)
    for n in range(20):
        a_turn(store, f"k{n}")
        await store.durable_enough()
    segments = sorted((tmp_path / "spool").glob("*.journal.*"))
    assert len(segments) > 3 and journal_writes(tmp_path) == 100
    release.set()
    await store.flush()
    assert [p.stat().st_size for p in (tmp_path / "spool").glob("*.journal.*")] == [0]
    await store.close()
    assert not list((tmp_path / "spool").glob("*.journal.*"))  # a clean stop leaves none


async def test_a_long_answer_encoded_only_as_stored_waits_for_its_commit(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    store = await make()
    release = hold_commits(store, monkeypatch)
    store.create_conversation(Conversation("long", 1.0))
    store.append(NewEvent("long", "t", "assistant/message", DeferredPayload({"content": ["x"]})))
    await waits_for_its_commit(store, release, tmp_path)


async def test_postgresql_waits_for_its_commit_by_default(tmp_path: Path) -> None:
    config = StoreConfig(url="postgresql://u:p@localhost/db", spool_path=str(tmp_path))
    assert not make_store(config, "pg").journaling
    sqlite = StoreConfig(url=f"sqlite:///{tmp_path}/x.db", spool_path=str(tmp_path))
    assert make_store(sqlite, "lite").journaling
    off = StoreConfig(url=f"sqlite:///{tmp_path}/x.db", spool_path=str(tmp_path), journal=False)
    assert not make_store(off, "lite").journaling


def test_a_line_torn_by_a_crash_is_not_read(tmp_path: Path) -> None:
    journal = Journal(tmp_path, "torn")
    journal.open()
    journal.append([Write("conversation", {"id": "a"}), Write("conversation", {"id": "b"})], 2)
    path = journal.left_behind()[0]
    with path.open("ab") as file:
        file.write(b'[["conversation",{"id":"c"}],["conversation",{"id":')  # the crash cut it
    assert [w.row["id"] for w in Journal.read(path)] == ["a", "b"]


def test_an_append_is_one_line_and_a_segment_of_one_write_a_line_still_reads(
    tmp_path: Path,
) -> None:
    journal = Journal(tmp_path, "lines")
    journal.open()
    writes = [
        Write("turn", {"id": "t", "request": '{"model":"m","messages":[]}'}),
        Write("event", {"uid": "e", "payload": '{"content":[{"type":"text","text":"a\\n\\"b"}]}'}),
    ]
    journal.append(writes, 2)
    path = journal.left_behind()[0]
    assert path.read_bytes().count(b"\n") == 1
    assert Journal.read(path) == writes
    # A segment left by a gateway that journaled a write a line, in the spool's encoding.
    old = tmp_path / "old.journal.1"
    old.write_bytes(b"".join(w.line() for w in writes))
    assert Journal.read(old) == writes


async def test_a_batch_being_committed_and_more_behind_it_still_answer_from_the_journal(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The batch the database is committing and the writes gathering meanwhile (a batch and
    a half, at 64 streams at once) are no reason to wait for a commit: the journal has them.
    Turns that waited there held the writer to small batches and cost a third of the stream
    cells' throughput."""
    from gateway.storage import store as store_module

    store = await make()
    release = hold_commits(store, monkeypatch)
    turns = store_module._BATCH * 3 // 10
    for n in range(turns):  # five writes a turn
        a_turn(store, f"c{n}")
    async with asyncio.timeout(5):
        await store.durable_enough()  # though nothing is committed
    assert store.pending_writes() == journal_writes(tmp_path) == 5 * turns
    release.set()
    await store.flush()


async def test_a_database_behind_by_more_than_its_lag_bound_makes_turns_wait_for_commits(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Backpressure: without it, turns that never wait would let the backlog grow without
    bound (under load the writer thread gets little of the loop's core) until it spilled."""
    from gateway.storage import store as store_module

    monkeypatch.setattr(store_module, "_JOURNAL_LAG_MAX", 4)
    store = await make()
    release = hold_commits(store, monkeypatch)
    a_turn(store, "behind")  # five writes: more than the database may lag behind
    await waits_for_its_commit(store, release, tmp_path)


def a_long_turn(store: Store, team: str, cid: str, messages: int) -> None:
    """A turn of `team` whose request holds `messages` messages (an agent's long history)."""
    store.create_conversation(Conversation(cid, 1.0, team_id=team))
    store.start_turn(TurnStart(f"t-{cid}", cid, 1.0, {}, team_id=team))
    for n in range(messages):
        store.append(NewEvent(cid, f"t-{cid}", "user/message", {"content": f"{team} {n}"}))


async def answered(store: Store, request: contextvars.Context) -> asyncio.Task[None]:
    """`durable_enough` in a request's task (its context, where its turn started), given one
    step: done then if the journal answered for it, else waiting for a commit."""
    task = asyncio.create_task(store.durable_enough(), context=request)
    await asyncio.sleep(0)  # the task's first step runs before this resumes
    return task


async def test_a_team_behind_the_database_waits_and_another_answers_from_the_journal(
    make: MakeStore, crash: Crash, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Backpressure falls on the lane making the backlog: a team's long histories slow that
    team's turns, not another team's whose own writes are few; that one is durable as ever
    (the journal holds every write up to its own, the flood's too, in order)."""
    from gateway.storage import store as store_module

    monkeypatch.setattr(store_module, "_JOURNAL_LAG_MAX", 16)
    store = await make()
    release = hold_commits(store, monkeypatch)
    flood, other = contextvars.copy_context(), contextvars.copy_context()
    try:
        flood.run(a_long_turn, store, "a", "flood", 30)  # 32 writes: twice what may lag
        flooding = await answered(store, flood)
        assert not flooding.done() and journal_writes(tmp_path) == 0
        other.run(a_long_turn, store, "b", "other", 1)
        assert (await answered(store, other)).done()
        assert journal_writes(tmp_path) == store.pending_writes() == 35
        flood.run(a_long_turn, store, "a", "flood-2", 1)  # the flooding team's next turn waits
        flooding_again = await answered(store, flood)
        assert not flooding_again.done()
    except BaseException:
        release.set()  # the store is closed after a failure, which waits for the commits
        raise
    flooding.cancel()
    flooding_again.cancel()
    await crash(store)
    again = await make()
    assert [e.payload["content"] for e in await again.events("other")] == ["b 0"]
    assert len(await again.events("flood")) == 30


async def test_every_turn_waits_once_the_database_is_far_enough_behind(
    make: MakeStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Many lanes, each within its share, still make a backlog the database must be given time
    for; and a turn whose lane is not known (its start in another context) waits as before."""
    from gateway.storage import store as store_module

    monkeypatch.setattr(store_module, "_JOURNAL_LAG_MAX", 16)
    store = await make()
    release = hold_commits(store, monkeypatch)
    for n in range(6):  # six teams of 3 writes: 18 behind, each team's 3 within a quarter of 16
        contextvars.copy_context().run(a_long_turn, store, f"team-{n}", f"c{n}", 1)
    late = contextvars.copy_context()
    try:
        late.run(a_long_turn, store, "late", "late", 1)
        assert (await answered(store, late)).done()
        unknown = await answered(store, contextvars.copy_context())
        assert not unknown.done()
        for n in range(10):  # ten teams more, of 5 writes: 71 behind, past four times the bound
            contextvars.copy_context().run(a_long_turn, store, f"more-{n}", f"m{n}", 3)
        late_again = await answered(store, late)
        assert not late_again.done()
    finally:
        release.set()
    async with asyncio.timeout(5):
        await asyncio.gather(unknown, late_again)
    assert store.pending_writes() == 0
