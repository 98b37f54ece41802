"""The store every part of the gateway talks to, over either backend.

Writes (conversations, turns, events, usage, responses) return at once: they join an in-memory
queue that one writer task applies in order, a batch per transaction. When the database is down
or the queue is longer than `queue_max`, batches go to the fsync'd spool instead, and a replay
task puts them into the database, in order, once it answers again; until the spool is empty
every new write follows them through it, so order is never lost. A user request never waits
for the database to write.

A turn's writes are durable before its client sees its end (`durable_enough`): appended to the
journal where the store is on this machine's disk (gateway.storage.journal), else committed.

Reads and admin operations (`run`, `transact`) go to the database directly, after every write
submitted before them has been handled, so a request sees the turns that ended before it began.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import orjson

from gateway import metrics
from gateway.storage import schema
from gateway.storage.backlog import Backlog, Mark
from gateway.storage.db import Db, Dialect, Op, ReadTimeout, StoreUnavailable
from gateway.storage.journal import Journal
from gateway.storage.payload import DeferredPayload
from gateway.storage.records import (
    SURFACE_TYPES,
    TURN_END,
    Conversation,
    Event,
    NewEvent,
    TurnStart,
)
from gateway.storage.spool import Spool
from gateway.storage.writes import Kind, Write, search_text

log = logging.getLogger(__name__)

T = TypeVar("T")

_BATCH = 512
# And at most about this much JSON a batch (gateway.storage.backlog): a turn waits for the
# batch its writes are in, and for the one being written before it, so a batch of one team's
# long histories must not take long to write.
_BATCH_WEIGHT = 256 * 1024
# Turn fingerprints kept in memory: many more than can be waiting to be committed.
_THREADS_KEPT = 8192
# The conversations a threading lookup returns at most: two tell that a history is ambiguous;
# a few more are there to link to.
_CANDIDATES = 4
# The newest turns that ended with a fingerprint, and those whose interrupted answer began at
# one (`Store.threads_of`): each through its own index.
_ENDED = (
    "SELECT conversation_id, ended_at FROM turns WHERE fingerprint = ?"
    f" ORDER BY ended_at DESC LIMIT {_CANDIDATES}"
)
_STARTED = (
    "SELECT conversation_id, ended_at FROM turns WHERE start_fingerprint = ?"
    f" ORDER BY ended_at DESC LIMIT {_CANDIDATES}"
)
# The event types of a history's messages, for SQL (constant names, not input).
_SURFACE = ", ".join(f"'{t}'" for t in sorted(SURFACE_TYPES))
# How far the database may fall behind the journal (writes not yet committed) before a turn
# waits for its commit instead: some batches, so that the batch being committed and the one
# gathering meanwhile never make turns wait on a store that keeps up (at 64 streams at once
# the backlog hovers at one batch and a half), while a store that does not keep up is still
# held to a bound. Past it, only the turns of a lane (a team, or a key of none) with more than
# a quarter of that bound of its own waiting wait: a burst of long histories (a request of
# 2,000 messages is 2,000 writes at once) slows the team sending it, not every team behind
# it; past four times the bound, every turn waits (many lanes, each within its share).
_JOURNAL_LAG_MAX = 16 * _BATCH
_RETRIES = 3
_STUCK_RETRY_S = 0.5
_ACK_WAIT_S = 5.0
_LOOKUP_S = 5.0  # a key or team lookup's longest read (Store.lookup)
# How long a checkpoint whose turn is not in the database is kept (claim_orphaned_turns).
_ORPHAN_CHECKPOINT_S = 24 * 3600.0
# How long writes nobody waits for yet (a turn's start) may wait for more (its end): one
# commit for both rather than two. Also how long a crash could lose them.
_GATHER_S = 0.02
# An event's payload as read: SQLite keeps a long stream's in `event_payloads` (JSON bytes).
_PAYLOAD = {
    "sqlite": "CASE WHEN payload_id IS NULL THEN payload"
    " ELSE (SELECT body FROM event_payloads WHERE id = payload_id) END",
    "postgresql": "payload",
}


class Backend(Protocol):
    dialect: Dialect

    @property
    def where(self) -> str: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def run(self, op: Op[T]) -> T: ...

    async def transact(self, op: Op[T]) -> T: ...

    async def apply(self, writes: list[Write]) -> None: ...

    async def read(self, op: Op[T], timeout_s: float, *, search: bool = False) -> T: ...

    async def ping(self) -> None: ...


class SchemaBehind(schema.SchemaMismatch):
    """Older than the code, with `migrate_on_start: false`: `gateway migrate` first."""


@dataclass(frozen=True, slots=True)
class TurnState:
    turn_id: str
    conversation_id: str
    team_id: str | None
    ended_at: float | None
    status: str | None  # as its end recorded it: completed, aborted, failed


class _Unwritable(Exception):
    """These writes could go neither to the database nor to the spool."""

    def __init__(self, writes: list[Write]) -> None:
        super().__init__(f"{len(writes)} writes")
        self.writes = writes


# The lane of the turn last started in this context (a request's task): whose writes a
# `durable_enough` there is about, since its callers do not say.
_UNKNOWN = object()
_LANE: ContextVar[Hashable] = ContextVar("store_lane", default=_UNKNOWN)


def _lane(team_id: str | None, key_id: str | None) -> Hashable:
    return team_id if team_id is not None or key_id is None else ("key", key_id)


class Store:
    def __init__(
        self,
        backend: Backend,
        spool: Spool,
        *,
        owner: str,
        queue_max: int = 10_000,
        migrate: bool = True,
        journal: Journal | None = None,
    ) -> None:
        self.backend = backend
        self.dialect = backend.dialect
        # SQLite's search index is filled by the writer, with text made here (PostgreSQL's is
        # a generated column).
        self._indexes_text = backend.dialect == "sqlite"
        self.owner = owner  # this process, as recorded on the turns it starts
        self._spool = spool
        self._queue_max = queue_max
        self._migrate = migrate
        self._backlog = Backlog()
        self._wake = asyncio.Event()
        self._submitted = 0
        # Every write submitted before this one is handled: in the database, or fsync'd in the
        # spool (writes of other lanes after it may be too: gateway.storage.backlog).
        self._handled = 0
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._spooling = False
        self._stuck = False  # neither the database nor the spool takes writes right now
        # durable_enough(): (mark, future, deadline, lane) of each turn waiting to be durable.
        self._durable: list[tuple[int, asyncio.Future[None], float, Hashable]] = []
        self._watchdog: asyncio.TimerHandle | None = None
        self._spool_lock = asyncio.Lock()
        self._writer: asyncio.Task[None] | None = None
        self._replayer: asyncio.Task[None] | None = None
        self._closing = False
        self._urgent: asyncio.Future[None] | None = None  # cuts a gathering wait short
        self._journal = journal
        self._journaled = 0  # writes submitted whose lines the journal holds
        # Writes submitted up to the last with a long stream's payload, which the journal
        # cannot hold (it is encoded only as the database writes it).
        self._deferred = 0
        self._turn_lanes: dict[str, Hashable] = {}  # the lane of each turn until its end
        # Writes submitted up to which a copy is in the spool, made because the database took
        # too long (`_rescue`), and the task making one.
        self._rescued = 0
        self._rescuing: asyncio.Task[None] | None = None
        # The newest turn fingerprints this process wrote (gateway.conversations.threading): a
        # lookup of one waits for the writer, which may still hold it, and any other does not;
        # and, on a store no other process writes, those the database was asked for and did
        # not have: only this process could add them, and it forgets them when it does.
        self._threads: OrderedDict[str, str] = OrderedDict()
        self._no_threads: OrderedDict[str, None] = OrderedDict()
        # Each conversation's end as this process last wrote it: its last turn's end
        # fingerprint, forgotten at any later write to the conversation (`ends_at`).
        self._ends: OrderedDict[str, str] = OrderedDict()
        # The turns this process started and has not ended yet, by conversation: a request that
        # would continue one of these conversations branches instead (`open_turns`).
        self._open: dict[str, set[str]] = {}
        # How many turns this process started in each (recent) conversation: a request that
        # read a conversation's path tells by it whether a turn began there meanwhile, and may
        # have ended too (`turns_started`).
        self._starts: OrderedDict[str, int] = OrderedDict()
        # Waiting for a conversation's running turns to end (`quiet`), by conversation.
        self._quiet: dict[str, list[asyncio.Future[None]]] = {}
        # Set once the database answered (at start, or later when it started unreachable).
        self.connected = asyncio.Event()
        self.refused: str | None = None  # why it never will (a schema this code cannot use)

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Connect (migrating, or checking the schema), then put in what a previous run left
        in the spool and the journal. A database that cannot be reached does not stop a
        store without a journal (PostgreSQL): it starts spooling every write, and connects in
        the background (`connected`) before the spool replays. A schema newer than the code
        (schema.SchemaAhead) or older with `migrate: false` (SchemaBehind) refuses to start."""
        try:
            await self._connect()
        except StoreUnavailable as exc:
            if self._journal is not None:
                raise
            log.warning(
                "store unavailable at start (%s): serving from the spool until it answers", exc
            )
            await asyncio.to_thread(self._spool.open)
            self._spooling = True
            metrics.STORE_SPOOLING.set(1)
            self._replayer = asyncio.create_task(self._connect_later(), name="store-connect")
            self._writer = asyncio.create_task(self._write_loop(), name="store-writer")
            return
        self.connected.set()
        await asyncio.to_thread(self._spool.open)
        if self._spool.pending_bytes:
            # What a previous run could not write goes in before anything new, so recovery
            # and reads see it.
            log.warning(
                "replaying %d bytes of spooled writes into %s",
                self._spool.pending_bytes,
                self.backend.where,
            )
            await self._replay_all()
        if self._journal is not None:
            await self._replay_journal(self._journal)
        self._writer = asyncio.create_task(self._write_loop(), name="store-writer")

    async def _connect(self) -> None:
        try:
            await self.backend.start()
            if self._migrate:
                await self.backend.transact(schema.migrate)
                return
            version = await self.backend.run(schema.current_version)
        except BaseException:
            await self.backend.close()
            raise
        schema.check_not_ahead(version, self.dialect, self.backend.where)
        if version < schema.latest(self.dialect):
            await self.backend.close()
            raise SchemaBehind(
                f"the store at {self.backend.where} is at schema version {version}, this"
                f" gateway needs {schema.latest(self.dialect)}: run `gateway migrate`"
            )

    async def _connect_later(self) -> None:
        """Started while the database was away: connect once it answers, then replay."""
        delay = 0.1
        while True:
            await asyncio.sleep(delay)
            try:
                await self._connect()
            except StoreUnavailable:
                delay = min(delay * 2, 5.0)
                continue
            except (schema.SchemaAhead, SchemaBehind) as exc:
                # Writes stay in the spool (nothing is lost); /health/ready says why.
                self.refused = str(exc)
                log.error("%s: writes stay in the spool", exc)
                return
            break
        log.info("store connected to %s: replaying the spool", self.backend.where)
        self.connected.set()
        await self._replay_loop()

    def _reachable(self) -> None:
        if not self.connected.is_set():
            raise StoreUnavailable(self.refused or f"not connected to {self.backend.where} yet")

    async def close(self) -> None:
        self._closing = True
        self._wake.set()
        self._hurry()
        if self._writer is not None:
            await self._writer
        if self._replayer is not None and not self._replayer.done():
            try:  # one last chance to empty the spool; what stays is replayed at next start
                await asyncio.wait_for(asyncio.shield(self._replayer), 5)
            except TimeoutError:
                self._replayer.cancel()
        if self._journal is not None and self._handled >= self._submitted:
            self._journal.close()  # else what it holds is put in at the next start
        await self.backend.close()

    # -- writes ----------------------------------------------------------------------------

    def write(self, kind: Kind, row: dict[str, Any], search: str | None = None) -> None:
        lane = _lane(row.get("team_id"), row.get("key_id"))
        if lane is None and (context := _LANE.get()) is not _UNKNOWN:
            # A row that names no team or key (a stored response of a key of no team) is in
            # the lane of the turn its request started, whose conversation it belongs to.
            lane = context
        self._submit(Write(kind, row, search), lane)

    def _submit(self, write: Write, lane: Hashable) -> None:
        if self._backlog.add(self._submitted, lane, write):
            self._wake.set()
        self._submitted += 1

    def create_conversation(self, conversation: Conversation) -> None:
        self.write(
            "conversation",
            {
                "id": conversation.id,
                "created_at": conversation.created_at,
                "parent_id": conversation.parent_id,
                "parent_seq": conversation.parent_seq,
                "team_id": conversation.team_id,
                "key_id": conversation.key_id,
                "metadata": orjson.dumps(conversation.metadata).decode()
                if conversation.metadata
                else None,
            },
        )

    def start_turn(self, turn: TurnStart) -> None:
        self._open.setdefault(turn.conversation_id, set()).add(turn.id)
        self._ends.pop(turn.conversation_id, None)
        _keep(self._starts, turn.conversation_id, self._starts.get(turn.conversation_id, 0) + 1)
        _LANE.set(lane := _lane(turn.team_id, turn.key_id))
        self._turn_lanes[turn.id] = lane
        self.write(
            "turn",
            {
                "id": turn.id,
                "conversation_id": turn.conversation_id,
                "started_at": turn.started_at,
                "request": orjson.dumps(turn.request).decode(),
                "team_id": turn.team_id,
                "key_id": turn.key_id,
                "owner": self.owner,
                # Looked up by the conversation list (gateway.conversations.listing).
                "request_id": _text_or_none(turn.request.get("request_id")),
                "user": _text_or_none(turn.request.get("user")),
            },
        )

    def append(self, event: NewEvent) -> None:
        # The payload's JSON text (decoded: orjson's bytes keep a 4 KiB buffer however short
        # they are, a str is its size), or a long stream's payload, encoded when it is written
        # (gateway.storage.payload).
        payload: str | DeferredPayload
        if isinstance(event.payload, DeferredPayload):
            payload = event.payload
            self._deferred = self._submitted + 1
        else:
            payload = orjson.dumps(event.payload).decode()
        row = {
            "conversation_id": event.conversation_id,
            "turn_id": event.turn_id,
            "type": event.type,
            "created_at": event.created_at,
            "payload": payload,
            "uid": event.uid,
        }
        if event.type == TURN_END:
            row["status"] = event.payload.get("status")
            row["response_id"] = event.payload.get("response_id")
            row["upstream_id"] = event.payload.get("upstream_id")
        fingerprint = event.fingerprint
        if fingerprint is not None:  # a turn's end, or a later change to what it ended with
            row["fingerprint"] = fingerprint
            self._remember_thread(fingerprint, event.conversation_id)
        if (start := event.start_fingerprint) is not None:  # an interrupted answer's turn end
            row["start_fingerprint"] = start
            self._remember_thread(start, event.conversation_id)
        lanes = self._turn_lanes
        lane = (
            lanes.pop(event.turn_id, None) if event.type == TURN_END else lanes.get(event.turn_id)
        )
        if event.type == TURN_END and (running := self._open.get(event.conversation_id)):
            running.discard(event.turn_id)
            if not running:
                del self._open[event.conversation_id]
                if self._quiet and (waiting := self._quiet.pop(event.conversation_id, None)):
                    for future in waiting:
                        if not future.done():
                            future.set_result(None)
        if event.type == TURN_END and fingerprint is not None:
            _keep(self._ends, event.conversation_id, fingerprint)
        else:
            self._ends.pop(event.conversation_id, None)
        search = None  # (a long stream's: taken out of its payload once it is stored)
        if self._indexes_text and event.type in schema.SEARCHED_TYPES and type(payload) is str:
            search = search_text(event.payload)
        self._submit(Write("event", row, search), lane)

    def open_turns(self, conversation_id: str) -> frozenset[str]:
        """The conversation's turns this process started and has not ended: while one runs,
        its answer is not in the conversation yet, and a request continuing the conversation
        where that turn began must not add its own input after that turn's."""
        turns = self._open.get(conversation_id)
        return frozenset(turns) if turns else frozenset()

    def turns_started(self, conversation_id: str) -> int:
        """A mark of the turns this process started in the conversation: a different one later
        means a turn began there in between (one forgotten meanwhile reads as a change too)."""
        return self._starts.get(conversation_id, 0)

    async def quiet(self, conversation_id: str, within_s: float) -> bool:
        """Whether no turn of the conversation runs in this process, after waiting up to
        `within_s` for those running to end: a client that stopped a stream and at once asks
        again may be ahead of its stop being handled here."""
        if not self._open.get(conversation_id):
            return True
        future = asyncio.get_running_loop().create_future()
        self._quiet.setdefault(conversation_id, []).append(future)
        try:
            await asyncio.wait_for(future, within_s)
        except TimeoutError:
            pass
        finally:
            waiting = self._quiet.get(conversation_id, [])
            if future in waiting:
                waiting.remove(future)
                if not waiting:
                    del self._quiet[conversation_id]
        return not self._open.get(conversation_id)

    def _remember_thread(self, fingerprint: str, conversation_id: str) -> None:
        _keep(self._threads, fingerprint, conversation_id)
        self._no_threads.pop(fingerprint, None)

    async def flush(self) -> None:
        """Wait until everything submitted so far is durable (in the database or the spool)."""
        await self._caught_up()

    async def durable_enough(self) -> None:
        """Before a client sees a turn's end: wait until what was submitted is durable, so a
        crash after the answer loses none of it. Unless nothing can be made durable right now
        (database and spool both refuse), or it takes longer than a few seconds: then answer
        anyway. A gateway that stops answering because its disk is full is worse than one
        that keeps the turn in memory until the disk has room."""
        mark = self._submitted
        lane = _LANE.get()
        if self._settled(mark, lane) or self._writer is None or self._stuck:
            return
        # The journal while the database keeps up; when it is behind by more than a few batches
        # of this turn's lane's writes, the turn waits for its commit: the backlog must not
        # grow without bound (it would spill).
        if self._journal is not None and self._may_lead(lane) and self._journal_append(mark):
            return
        # A future per waiting turn and one shared watchdog timer, rather than a timeout per
        # turn: this runs on every request.
        future = asyncio.get_running_loop().create_future()
        self._durable.append((mark, future, time.monotonic() + _ACK_WAIT_S, lane))
        self._hurry()
        if self._watchdog is None:
            self._watchdog = asyncio.get_running_loop().call_later(_ACK_WAIT_S, self._expire)
        await future

    def _may_lead(self, lane: Hashable) -> bool:
        """Whether the journal may answer for a turn of `lane`, the database being as far
        behind as it is (`_JOURNAL_LAG_MAX`). A turn whose lane is not known waits whenever
        the database is behind."""
        behind = self._backlog.behind
        if behind <= _JOURNAL_LAG_MAX:
            return True
        return (
            behind <= 4 * _JOURNAL_LAG_MAX
            and lane is not _UNKNOWN
            and self._backlog.count(lane) <= _JOURNAL_LAG_MAX // 4
        )

    def _settled(self, mark: int, lane: Hashable) -> bool:
        """Whether the writes submitted before `mark` that a turn of `lane` needs are in the
        database or the spool: all of its lane's (the writer takes lanes in turns) and every
        barrier (a write of no lane: one after the turn's end, say), or every write when the
        lane is not known (or is the barrier lane, `None`)."""
        if mark <= self._handled or mark <= self._rescued:
            return True
        if lane is _UNKNOWN or lane is None:
            return False
        backlog = self._backlog
        return backlog.settled(lane, mark) and backlog.settled(None, mark)

    def mark(self) -> Mark:
        """Where this context's writes stand (those submitted so far, and its turn's lane):
        a mark for `durable`."""
        return (self._submitted, _LANE.get())

    def durable(self, mark: Mark) -> bool:
        """Whether the writes a mark covers are durable: in the database, the journal or the
        spool. A checkpoint of a turn is written only once its start is
        (gateway.pipeline.checkpoints): recovery never finds one without its turn."""
        count, lane = mark
        return count <= self._journaled or self._settled(count, lane)

    def _journal_append(self, mark: int) -> bool:
        """Append the writes up to `mark` not yet in the database or the journal; False when
        they cannot be (a long stream's payload, encoded only as the database writes it; a
        journal that fails): then the commit is waited for."""
        assert self._journal is not None
        since = max(self._journaled, self._handled)
        if mark <= since:
            return True
        if self._deferred > since:
            # A long stream's payload among the writes the journal would take (or handled
            # since, behind older writes: this turn then waits for a commit it could skip).
            return False
        writes = self._backlog.unhandled(since)
        try:
            self._journal.append(writes, mark)
        except OSError as exc:
            log.error("the journal cannot be written (%s): waiting for commits instead", exc)
            self._journal = None
            return False
        self._journaled = mark
        return True

    def _expire(self) -> None:
        """A durability wait passed its deadline: the database is that slow (a lock, a
        backlog). What it has not taken is copied to the spool, which makes those turns
        durable on this machine; the waits then answer."""
        self._watchdog = None
        now = time.monotonic()
        if any(deadline <= now for _, _, deadline, _ in self._durable) and self._rescuing is None:
            self._rescuing = asyncio.create_task(self._rescue(), name="store-rescue")
        later = [deadline for _, _, deadline, _ in self._durable if deadline > now]
        if later:
            self._watchdog = asyncio.get_running_loop().call_later(min(later) - now, self._expire)

    async def _rescue(self) -> None:
        """Copy every write the database has not taken yet (the batch it is writing, and the
        queue) into the spool, fsync'd, and write through the spool from now on, so the order
        of what it holds is kept: a replay puts it all into the database once that answers (a
        write that also lands directly lands once: writes are idempotent). Without a spool to
        write, the waits answer anyway: a gateway that stops answering is worse than a turn
        kept in memory until the database takes it."""
        mark = self._submitted
        writes = self._backlog.unhandled()
        try:
            if writes and await self._to_spool(writes, force=True):
                self._rescued = mark
                log.warning(
                    "the store took over %.0f s: %d writes put in the spool %s",
                    _ACK_WAIT_S,
                    len(writes),
                    self._spool.log_path,
                )
        except _Unwritable:
            log.warning(
                "the store took over %.0f s: answering before the turn is durable", _ACK_WAIT_S
            )
        finally:
            self._rescuing = None
            self._release_durable(expired=time.monotonic())

    def _release_durable(self, expired: float | None = None) -> None:
        """Answer the durability waits whose writes are durable now, and those whose deadline
        is `expired`; with no deadline given, every one while the store is stuck."""
        everyone = expired is None and self._stuck
        late = float("-inf") if expired is None else expired
        still = []
        for waiter in self._durable:
            mark, future, deadline, lane = waiter
            if everyone or deadline <= late or self._settled(mark, lane):
                _settle_once(future)
            else:
                still.append(waiter)
        self._durable = still
        if not still and self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None

    # -- reads and direct operations -------------------------------------------------------

    async def run(self, op: Op[T]) -> T:
        self._reachable()
        await self._caught_up()
        return await self.backend.run(op)

    async def transact(self, op: Op[T]) -> T:
        self._reachable()
        await self._caught_up()
        return await self.backend.transact(op)

    async def read(self, op: Op[T], timeout_s: float, *, search: bool = False) -> T:
        """A read that may be long: out of the writer's way, `ReadTimeout` past `timeout_s`."""
        self._reachable()
        await self._caught_up()
        return await self.backend.read(op, timeout_s, search=search)

    async def lookup(self, op: Op[T]) -> T:
        """A short read of rows no write of the queue touches (keys, teams: written straight
        to the database): it waits neither for the queued writes nor behind the writer, so
        one team's backlog never holds another's key check. Past `_LOOKUP_S` the store counts
        as unavailable (a 503, worth retrying)."""
        self._reachable()
        try:
            return await self.backend.read(op, _LOOKUP_S)
        except ReadTimeout as exc:
            raise StoreUnavailable(f"a lookup took more than {_LOOKUP_S:g} s") from exc

    async def ping(self) -> None:
        self._reachable()
        await self.backend.ping()

    @property
    def shared(self) -> bool:
        """Other processes write this store too (replicas, workers): a write they made just
        before a client came here may still be on its way."""
        return self.dialect == "postgresql" or os.environ.get("GATEWAY_WORKER") is not None

    async def settled(
        self, read: Callable[[], Awaitable[T]], ok: Callable[[T], bool], within_s: float = 2.0
    ) -> T:
        """`read()` until `ok` (or `within_s` passes) when the store is shared, else once.

        A client that got its answer from one replica and asks another for what follows may
        be a few milliseconds ahead of the first replica's commit; this waits for it only in
        that case (something missing that should be there), never on the usual path."""
        value = await read()
        if ok(value) or not self.shared:
            return value
        deadline = time.monotonic() + within_s
        while not ok(value) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
            value = await read()
        return value

    @property
    def spooling(self) -> bool:
        return self._spooling

    def queue_depth(self) -> int:
        return len(self._backlog)

    def spooled_bytes(self) -> int:
        return self._spool.pending_bytes

    def pending_writes(self) -> int:
        """Writes submitted and not yet in the database or fsync'd in the spool (a write only
        in the journal counts: only the database serves reads). 0 once `flush()` has returned
        with nothing written since. For operators and tests."""
        return max(0, self._submitted - self._handled)

    @property
    def journaling(self) -> bool:
        """A turn is durable once its writes are in the local journal, before the database
        commits them (SQLite's default; off for good once the journal cannot be written)."""
        return self._journal is not None

    async def _caught_up(self) -> None:
        mark = self._submitted
        if self._handled >= mark or self._writer is None:
            return
        future = asyncio.get_running_loop().create_future()
        self._waiters.append((mark, future))
        self._hurry()
        await future

    def _handled_batch(self, count: int) -> None:
        """The first `count` writes of the batch taken are handled (the rest go back)."""
        backlog = self._backlog
        backlog.done(count)
        oldest = backlog.oldest()
        self._handled = self._submitted if oldest is None else oldest
        if self._journal is not None:
            self._journal.handled(self._handled)
        if self._durable:
            self._release_durable()
        if self._waiters:
            still = []
            for mark, future in self._waiters:
                if mark <= self._handled:
                    _settle_once(future)
                else:
                    still.append((mark, future))
            self._waiters = still

    # -- the writer ------------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            backlog = self._backlog
            if not backlog:
                if self._closing:
                    return
                self._wake.clear()
                await self._wake.wait()
                continue
            if len(backlog) < _BATCH and not (
                self._durable or self._waiters or self._closing or self._stuck
            ):
                await self._gather()
            batch = backlog.take(_BATCH, _BATCH_WEIGHT)
            try:
                await self._write(batch)
            except _Unwritable as stuck:
                # Neither the database nor the spool's disk takes them: keep them in memory, in
                # order, and try again shortly. Nothing is dropped while memory lasts.
                self._stuck = True  # (the writes it could not handle are its batch's last)
                self._handled_batch(len(batch) - len(stuck.writes))  # releases durability waits
                await asyncio.sleep(_STUCK_RETRY_S)
                continue
            except Exception:  # the writer must outlive anything one batch does
                log.exception("store writer: %d writes could not be handled", len(batch))
                metrics.STORE_WRITE_ERRORS.inc(len(batch))
            self._stuck = False
            self._handled_batch(len(batch))

    async def _gather(self) -> None:
        """Nobody waits on the queued writes yet (a turn's start, typically): give them up to
        `_GATHER_S` to be joined by more (the turn's end, other turns), so that a short turn is
        one commit, not two. Waiting on the writes (durable_enough, a read, close) ends it."""
        loop = asyncio.get_running_loop()
        urgent = self._urgent = loop.create_future()
        timer = loop.call_later(_GATHER_S, _settle_once, urgent)
        try:
            await urgent
        finally:
            timer.cancel()
            self._urgent = None

    def _hurry(self) -> None:
        if self._urgent is not None and not self._urgent.done():
            self._urgent.set_result(None)

    async def _write(self, batch: list[Write]) -> None:
        spill = self._spooling or len(self._backlog) > self._queue_max
        if spill and await self._to_spool(batch):
            return
        try:
            await self.backend.apply(batch)
        except StoreUnavailable as exc:
            await self._to_spool(batch, force=True, why=f"store unavailable: {exc}")
        except Exception:
            await self._one_by_one(batch)

    async def _one_by_one(self, batch: list[Write]) -> None:
        """A batch failed on its content (or lost a race for a seq): retry each write alone,
        so one bad write does not sink the rest."""
        for index, write in enumerate(batch):
            for attempt in range(_RETRIES):
                try:
                    await self.backend.apply([write])
                    break
                except StoreUnavailable as exc:
                    why = f"store unavailable: {exc}"
                    await self._to_spool(batch[index:], force=True, why=why)
                    return
                except Exception:
                    if attempt == _RETRIES - 1:
                        log.exception("store: dropping a %s write that keeps failing", write.kind)
                        metrics.STORE_WRITE_ERRORS.inc()

    async def _to_spool(
        self, batch: list[Write], force: bool = False, why: str = "store.queue_max passed"
    ) -> bool:
        """Append to the spool if spooling (or `force`: start spooling). False: not spooling
        any more (the replay caught up meanwhile), so write to the database instead."""
        async with self._spool_lock:
            if not (self._spooling or force or len(self._backlog) > self._queue_max):
                return False
            try:
                await asyncio.to_thread(self._spool.append, batch)
            except OSError as exc:
                log.error("the spool cannot be written either (%s): holding writes in memory", exc)
                raise _Unwritable(batch) from exc
            metrics.STORE_SPOOLED.inc(len(batch))
            if not self._spooling:
                log.warning("writes go to the spool until the store takes them (%s)", why)
                self._spooling = True
                metrics.STORE_SPOOLING.set(1)
                self._replayer = asyncio.create_task(self._replay_loop(), name="store-replay")
            return True

    async def _replay_loop(self) -> None:
        delay = 0.1
        while True:
            try:
                await self.backend.ping()
                if await self._replay_batch():
                    log.info("store is back: the spool is replayed")
                    return
                delay = 0.1
            except StoreUnavailable:
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def _replay_all(self) -> None:
        while not await self._replay_batch():
            pass

    async def _replay_batch(self) -> bool:
        """Apply the next spooled batch; True when the spool is empty and writes go direct."""
        async with self._spool_lock:
            writes, pos = await asyncio.to_thread(self._spool.read, _BATCH)
            if not writes:
                await asyncio.to_thread(self._spool.reset)
                self._spooling = False
                metrics.STORE_SPOOLING.set(0)
                return True
        await self._apply_replayed(writes)
        async with self._spool_lock:
            await asyncio.to_thread(self._spool.advance, pos)
        metrics.STORE_REPLAYED.inc(len(writes))
        return False

    async def _replay_journal(self, journal: Journal) -> None:
        """Put into the database what a previous life journaled (it may have committed some of
        it too: writes are idempotent), then start a journal of this life's own."""
        for path in await asyncio.to_thread(journal.left_behind):
            writes = await asyncio.to_thread(journal.read, path)
            if writes:
                log.warning(
                    "replaying %d journaled writes into %s", len(writes), self.backend.where
                )
            for start in range(0, len(writes), _BATCH):
                await self._apply_replayed(writes[start : start + _BATCH])
            await asyncio.to_thread(path.unlink)
        await asyncio.to_thread(journal.open)

    async def _apply_replayed(self, writes: list[Write]) -> None:
        """A batch read back from the spool or the journal, into the database: a batch that
        fails on its content goes again one write at a time. StoreUnavailable propagates."""
        try:
            await self.backend.apply(writes)
        except StoreUnavailable:
            raise
        except Exception:
            await self._replay_one_by_one(writes)

    async def _replay_one_by_one(self, writes: list[Write]) -> None:
        for write in writes:
            for attempt in range(_RETRIES):
                try:
                    await self.backend.apply([write])
                    break
                except StoreUnavailable:
                    raise
                except Exception:
                    if attempt == _RETRIES - 1:
                        log.exception(
                            "spool replay: dropping a %s write that keeps failing", write.kind
                        )
                        metrics.STORE_WRITE_ERRORS.inc()

    # -- conversations ---------------------------------------------------------------------

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        async def read(db: Db) -> Conversation | None:
            row = await db.fetchrow(
                f"SELECT {_CONVERSATION_COLUMNS} FROM conversations c WHERE c.id = ?",
                conversation_id,
            )
            return None if row is None else _conversation(row)

        return await self.run(read)

    async def events(self, conversation_id: str, up_to_seq: int | None = None) -> list[Event]:
        """The conversation's own events (not its parent's), in seq order."""
        limit = up_to_seq if up_to_seq is not None else 2**62

        async def read(db: Db) -> list[Event]:
            rows = await db.fetch(
                f"SELECT seq, turn_id, type, created_at, {_PAYLOAD[db.dialect]} FROM events"
                " WHERE conversation_id = ? AND seq <= ? ORDER BY seq",
                conversation_id,
                limit,
            )
            return _events(conversation_id, rows)

        return await self.run(read)

    async def after_end(
        self, conversation_id: str, fingerprint: str, limit: int
    ) -> tuple[int, list[Event]] | None:
        """Where the conversation's newest turn that ended with this fingerprint ends: the seq
        of its last message, and the first `limit` of the conversation's own events after it,
        in seq order, as recorded. None when there is no such turn with a message.

        What a request whose history is that turn's end needs of the conversation to see where
        it departs from it, read in the size of what follows the turn rather than of the
        whole conversation (Conversations.join)."""

        async def read(db: Db) -> tuple[int, list[Event]] | None:
            turn_id = await db.fetchval(
                "SELECT id FROM turns WHERE fingerprint = ? AND conversation_id = ?"
                " ORDER BY ended_at DESC LIMIT 1",
                fingerprint,
                conversation_id,
            )
            if turn_id is None:
                return None
            # The conversation's events walked back from its end to the turn's: a regenerate
            # departs near the end.
            seq = await db.fetchval(
                "SELECT seq FROM events WHERE conversation_id = ? AND turn_id = ?"
                f" AND type IN ({_SURFACE}) ORDER BY seq DESC LIMIT 1",
                conversation_id,
                turn_id,
            )
            if seq is None:
                return None
            rows = await db.fetch(
                f"SELECT seq, turn_id, type, created_at, {_PAYLOAD[db.dialect]} FROM events"
                " WHERE conversation_id = ? AND seq > ? ORDER BY seq LIMIT ?",
                conversation_id,
                seq,
                limit,
            )
            return seq, _events(conversation_id, rows)

        return await self.run(read)

    async def set_conversation_metadata(
        self, conversation_id: str, metadata: dict[str, str] | None
    ) -> None:
        """Replace a conversation's metadata (None: it has none)."""
        value = orjson.dumps(metadata).decode() if metadata else None

        async def update(db: Db) -> None:
            await db.execute(
                "UPDATE conversations SET metadata = ? WHERE id = ?", value, conversation_id
            )

        await self.run(update)

    async def delete_conversation(self, conversation_id: str, when: float) -> None:
        """Hide a conversation (its events stay, for audit)."""

        async def update(db: Db) -> None:
            await db.execute(
                "UPDATE conversations SET deleted_at = ? WHERE id = ?", when, conversation_id
            )

        await self.run(update)

    def ends_at(self, conversation_id: str, fingerprint: str) -> bool:
        """The conversation is, to this process's knowledge, exactly as its last turn ended
        with this fingerprint: nothing written to it since, here or (on a store no other
        process writes) anywhere. False whenever that is not known."""
        return not self.shared and self._ends.get(conversation_id) == fingerprint

    async def threads_of(
        self, fingerprint: str | None, start: str | None = None
    ) -> list[Conversation]:
        """The conversations of the newest turns that ended with this fingerprint, or whose
        interrupted answer began at the history `start` is the fingerprint of, newest first (a
        few at most of each), as stored: one read, which is also the conversations' read.

        A fingerprint this process wrote lately is read after its writes are in; any other
        was committed long ago, so the database is read without waiting for the writer: a
        request with a history that matches nothing (few-shot examples) never queues behind
        other turns' writes. A store that cannot be read matches nothing (the turn starts a
        conversation)."""
        prints = [p for p in (fingerprint, start) if p is not None]
        known = any(p in self._threads for p in prints)
        if not known and all(p in self._no_threads for p in prints):
            return []
        if fingerprint is None:
            turns, args = _STARTED, [start]
        elif start is None:
            turns, args = _ENDED, [fingerprint]
        else:
            # (A compound's members are ordered and limited only as subqueries.)
            turns = f"SELECT * FROM ({_ENDED}) AS e UNION ALL SELECT * FROM ({_STARTED}) AS s"
            args = [fingerprint, start]

        async def read(db: Db) -> list[Conversation]:
            rows = await db.fetch(
                f"SELECT {_CONVERSATION_COLUMNS} FROM ({turns}) AS m"
                " JOIN conversations c ON c.id = m.conversation_id ORDER BY m.ended_at DESC",
                *args,
            )
            found: dict[str, Conversation] = {}
            for row in rows:
                found.setdefault(row[0], _conversation(row))
            return list(found.values())

        try:
            if known:
                return await self.run(read)
            self._reachable()
            found = await self.backend.run(read)
        except StoreUnavailable as exc:
            log.warning("store unavailable (%s): a request could not be threaded", exc)
            return []
        if not found and not self.shared:
            for p in prints:
                if p not in self._threads:  # (unless written while it was read)
                    _keep(self._no_threads, p, None)
        return found

    async def last_fingerprints(
        self, conversation_ids: list[str]
    ) -> dict[str, tuple[str | None, str | None]]:
        """Each conversation's end: the fingerprints of the turn its last event belongs to,
        of its end and (an interrupted answer's) its start; None while that turn runs (or
        when it has none)."""

        async def read(db: Db) -> dict[str, tuple[str | None, str | None]]:
            ends: dict[str, tuple[str | None, str | None]] = {}
            for conversation_id in conversation_ids:
                row = await db.fetchrow(
                    "SELECT t.fingerprint, t.start_fingerprint FROM events e"
                    " JOIN turns t ON t.id = e.turn_id"
                    " WHERE e.conversation_id = ? ORDER BY e.seq DESC LIMIT 1",
                    conversation_id,
                )
                ends[conversation_id] = (row[0], row[1]) if row is not None else (None, None)
            return ends

        return await self.run(read)

    async def claim_next(self, turn_id: str, claimant: str) -> bool:
        """Whether `claimant`, a request about to continue the turn's conversation after it,
        is the one that does: the first to claim it, on any replica. True as well when that
        cannot be known (the store cannot be written, the turn is not committed yet): a
        request never fails for it."""

        async def claim(db: Db) -> bool:
            won = await db.fetchrow(
                "UPDATE turns SET continued_by = ? WHERE id = ? AND continued_by IS NULL"
                " RETURNING id",
                claimant,
                turn_id,
            )
            if won is not None:
                return True
            taken = await db.fetchrow("SELECT continued_by FROM turns WHERE id = ?", turn_id)
            return taken is None or taken[0] == claimant

        try:
            self._reachable()
            return await self.backend.run(claim)
        except StoreUnavailable as exc:
            log.warning("store unavailable (%s): a turn continues unclaimed", exc)
            return True

    async def turn_ended(self, turn_id: str) -> bool:
        """True once the turn's `turn/end` is recorded."""

        async def read(db: Db) -> bool:
            ended = await db.fetchrow("SELECT ended_at FROM turns WHERE id = ?", turn_id)
            return ended is not None and ended[0] is not None

        return await self.run(read)

    async def turn_state(self, turn_id: str) -> TurnState | None:
        """Where a recorded turn is and whether it has ended: None when no turn has that id."""

        async def read(db: Db) -> TurnState | None:
            row = await db.fetchrow(
                "SELECT conversation_id, team_id, ended_at, status FROM turns WHERE id = ?",
                turn_id,
            )
            return None if row is None else TurnState(turn_id, *row)

        return await self.run(read)

    async def turn_requests(self, turn_ids: list[str]) -> list[dict[str, Any]]:
        """Each of `turn_ids` the store holds, in their order: its id, its recorded request,
        and the ids the client and the provider gave its answer."""

        async def read(db: Db) -> dict[str, dict[str, Any]]:
            found: dict[str, dict[str, Any]] = {}
            for first in range(0, len(turn_ids), 500):
                ids = turn_ids[first : first + 500]
                marks = ", ".join("?" * len(ids))
                rows = await db.fetch(
                    "SELECT id, request, response_id, upstream_id FROM turns"
                    f" WHERE id IN ({marks})",
                    *ids,
                )
                for turn_id, request, response_id, upstream_id in rows:
                    found[turn_id] = {
                        "id": turn_id,
                        "request": orjson.loads(request),
                        "response_id": response_id,
                        "upstream_id": upstream_id,
                    }
            return found

        if not turn_ids:
            return []
        found = await self.run(read)
        return [found[t] for t in turn_ids if t in found]

    async def open_turn_of_request(self, request_id: str, team_id: str | None) -> str | None:
        """The newest turn still open that a request with this id started, for this team (None:
        any team's, for the admin): what a cancel by request id names on another replica."""

        async def read(db: Db) -> str | None:
            sql = "SELECT id FROM turns WHERE request_id = ? AND ended_at IS NULL"
            args: tuple[Any, ...] = (request_id,)
            if team_id is not None:
                sql, args = sql + " AND team_id = ?", (request_id, team_id)
            row = await db.fetchrow(sql + " ORDER BY started_at DESC LIMIT 1", *args)
            return None if row is None else str(row[0])

        return await self.run(read)

    async def claim_orphaned_turns(
        self, *, own: bool, stale_before: float
    ) -> list[tuple[str, str, str | None]]:
        """Take over the open turns whose process is gone: (turn id, conversation id, its
        last checkpoint or None) each.

        `own`: this process's own earlier life (same owner id: it was restarted), and turns
        from before owners were recorded. Otherwise only turns of instances whose heartbeat
        stopped before `stale_before`. The claim is one UPDATE, so two replicas sweeping at
        once never both close a turn. A claimed turn's checkpoint is taken with it, and so
        are the checkpoints of turns that ended after their last one was written."""

        async def claim(db: Db) -> list[tuple[str, str, str | None]]:
            condition = "owner IN (SELECT id FROM instances WHERE heartbeat_at < ? AND id <> ?)"
            args: list[Any] = [stale_before, self.owner]
            if own:
                condition = f"(owner IS NULL OR owner = ? OR {condition})"
                args.insert(0, self.owner)
            rows = await db.fetch(
                f"UPDATE turns SET owner = ? WHERE ended_at IS NULL AND {condition}"
                " RETURNING id, conversation_id, started_at",
                self.owner,
                *args,
            )
            bodies: dict[str, str] = {}
            for first in range(0, len(rows), 500):
                ids = [r[0] for r in rows[first : first + 500]]
                marks = ", ".join("?" * len(ids))
                found = await db.fetch(
                    f"DELETE FROM turn_checkpoints WHERE turn_id IN ({marks})"
                    " RETURNING turn_id, body",
                    *ids,
                )
                bodies.update((r[0], r[1]) for r in found)
            await db.execute(
                "DELETE FROM turn_checkpoints WHERE turn_id IN"
                " (SELECT id FROM turns WHERE ended_at IS NOT NULL)"
            )
            # Checkpoints whose turn never reached the database: left by a gateway that wrote
            # them before their turn. A turn kept in a dead instance's spool comes back when
            # that instance starts again; one that has not within a day never will.
            await db.execute(
                "DELETE FROM turn_checkpoints WHERE at < ?"
                " AND NOT EXISTS (SELECT 1 FROM turns t WHERE t.id = turn_id)",
                time.time() - _ORPHAN_CHECKPOINT_S,
            )
            ordered = sorted(rows, key=lambda r: r[2])
            return [(r[0], r[1], bodies.get(r[0])) for r in ordered]

        return await self.transact(claim)

    async def save_checkpoints(
        self,
        rows: list[tuple[str, str, float, str]],
        ended: Iterable[str],
        parts: Iterable[tuple[str, int, float, str]] = (),
    ) -> None:
        """Upsert open turns' checkpoints written whole (turn id, conversation id, time, body),
        dropping the parts they had; add parts to others' (turn id, number, time, body: what
        grew since); drop the checkpoints of `ended` turns. One transaction, straight to the
        database, not queued: a checkpoint the store cannot take now is outdated by the next.
        While the database does not take writes (the spool has them), they join the spool
        instead, which the next start replays before it closes the turns a crash left open."""
        whole = [(row[0],) for row in rows]
        grown = list(parts)
        if self._spooling:
            await self._spool_checkpoints(rows, grown)
            return
        gone = [(turn_id,) for turn_id in ended]

        async def save(db: Db) -> None:
            if rows:
                await db.executemany(
                    "INSERT INTO turn_checkpoints (turn_id, conversation_id, at, body)"
                    " VALUES (?, ?, ?, ?) ON CONFLICT (turn_id) DO UPDATE"
                    " SET at = excluded.at, body = excluded.body",
                    rows,
                )
                await db.executemany("DELETE FROM turn_checkpoint_parts WHERE turn_id = ?", whole)
            if grown:
                await db.executemany(
                    "INSERT INTO turn_checkpoint_parts (turn_id, seq, at, body)"
                    " VALUES (?, ?, ?, ?)",
                    grown,
                )
            if gone:
                await db.executemany("DELETE FROM turn_checkpoints WHERE turn_id = ?", gone)
                await db.executemany("DELETE FROM turn_checkpoint_parts WHERE turn_id = ?", gone)

        self._reachable()
        await self.backend.transact(save)

    async def _spool_checkpoints(
        self, rows: list[tuple[str, str, float, str]], parts: list[tuple[str, int, float, str]]
    ) -> None:
        """The checkpoints into the spool. Those of turns that ended stay in the database
        until a recovery sweep drops them (claim_orphaned_turns)."""
        writes = [
            Write("checkpoint", {"turn_id": t, "conversation_id": c, "at": at, "body": body})
            for t, c, at, body in rows
        ]
        writes += [
            Write("checkpoint_part", {"turn_id": t, "seq": seq, "at": at, "body": body})
            for t, seq, at, body in parts
        ]
        if not writes:
            return
        try:
            spooled = await self._to_spool(writes)
        except _Unwritable as exc:
            raise StoreUnavailable("neither the database nor the spool takes checkpoints") from exc
        if not spooled:  # the replay caught up meanwhile: the next tick writes them directly
            raise StoreUnavailable("the store stopped spooling")

    async def take_checkpoint_parts(self, turn_ids: list[str]) -> dict[str, list[str]]:
        """The parts of these turns' checkpoints (turns just claimed: claim_orphaned_turns took
        their checkpoints), each turn's in order, taken out of the store; and the parts of any
        turn whose checkpoint is gone (it ended, or was claimed), dropped. One transaction."""

        async def take(db: Db) -> dict[str, list[str]]:
            found: list[Any] = []
            for first in range(0, len(turn_ids), 500):
                ids = turn_ids[first : first + 500]
                marks = ", ".join("?" * len(ids))
                found += await db.fetch(
                    f"DELETE FROM turn_checkpoint_parts WHERE turn_id IN ({marks})"
                    " RETURNING turn_id, seq, body",
                    *ids,
                )
            await db.execute(
                "DELETE FROM turn_checkpoint_parts WHERE turn_id NOT IN"
                " (SELECT turn_id FROM turn_checkpoints)"
            )
            taken: dict[str, list[str]] = {}
            for turn_id, _, body in sorted(found, key=lambda r: (r[0], r[1])):
                taken.setdefault(turn_id, []).append(body)
            return taken

        return await self.transact(take)

    async def heartbeat(self, started_at: float) -> None:
        """Note that this process is alive (its open turns are not orphans)."""
        now = time.time()

        async def beat(db: Db) -> None:
            await db.execute(
                "INSERT INTO instances (id, started_at, heartbeat_at) VALUES (?, ?, ?)"
                " ON CONFLICT (id) DO UPDATE SET heartbeat_at = excluded.heartbeat_at,"
                " started_at = excluded.started_at",
                self.owner,
                started_at,
                now,
            )

        self._reachable()
        await self.backend.run(beat)


_CONVERSATION_COLUMNS = (
    "c.id, c.created_at, c.parent_id, c.parent_seq, c.team_id, c.key_id, c.metadata, c.deleted_at"
)


def _events(conversation_id: str, rows: list[Any]) -> list[Event]:
    """Events from rows of (seq, turn_id, type, created_at, payload JSON)."""
    return [Event(conversation_id, s, t, ty, c, orjson.loads(p)) for s, t, ty, c, p in rows]


def _conversation(row: Any) -> Conversation:
    """A conversation from a row of `_CONVERSATION_COLUMNS`."""
    id_, created, parent, parent_seq, team, key, metadata, deleted = row[:8]
    return Conversation(
        id_,
        created,
        parent_id=parent,
        parent_seq=parent_seq,
        team_id=team,
        key_id=key,
        metadata=orjson.loads(metadata) if metadata else None,
        deleted_at=deleted,
    )


def _keep(recent: OrderedDict[str, Any], key: str, value: Any) -> None:
    """Put `key` last in a dict that keeps its newest `_THREADS_KEPT` keys. An OrderedDict:
    a plain dict's oldest key, found by `next(iter())`, is found after every slot its removed
    keys left, which costs more the longer it has been used."""
    recent[key] = value
    recent.move_to_end(key)
    if len(recent) > _THREADS_KEPT:
        recent.popitem(last=False)


def _text_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _settle_once(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
