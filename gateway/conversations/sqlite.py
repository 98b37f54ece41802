"""SQLite backend: one file in WAL mode, one worker thread that owns the connection.

Every operation goes through one queue to that thread, so the event loop never blocks on the
disk, writes keep their submission order, and a read sees every write submitted before it.
The thread applies whatever has queued up in one transaction (group commit), which keeps the
per-request cost to a queue put however many events a turn records.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import orjson

from gateway.conversations.events import TURN_END, Conversation, Event, NewEvent, TurnStart

log = logging.getLogger(__name__)

T = TypeVar("T")
_Op = Callable[[sqlite3.Connection], Any]

SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    parent_id TEXT,
    parent_seq INTEGER,
    team_id TEXT,
    key_id TEXT,
    metadata TEXT,
    deleted_at REAL
);
CREATE TABLE IF NOT EXISTS turns (
    id TEXT PRIMARY KEY,
    conversation_id TEXT NOT NULL,
    started_at REAL NOT NULL,
    ended_at REAL,
    status TEXT,
    request TEXT NOT NULL,
    team_id TEXT,
    key_id TEXT
);
CREATE TABLE IF NOT EXISTS teams (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    created_at REAL NOT NULL,
    metadata TEXT NOT NULL,
    limits TEXT
);
CREATE TABLE IF NOT EXISTS keys (
    id TEXT PRIMARY KEY,
    hash TEXT NOT NULL UNIQUE,
    prefix TEXT NOT NULL,
    team_id TEXT NOT NULL,
    created_at REAL NOT NULL,
    name TEXT,
    user TEXT,
    models TEXT,
    expires_at REAL,
    revoked_at REAL,
    metadata TEXT NOT NULL,
    limits TEXT
);
CREATE INDEX IF NOT EXISTS keys_by_team ON keys (team_id);
CREATE TABLE IF NOT EXISTS usage (
    id TEXT PRIMARY KEY,
    turn_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    team_id TEXT,
    key_id TEXT,
    user TEXT,
    alias TEXT,
    deployment TEXT NOT NULL,
    provider TEXT NOT NULL,
    model TEXT NOT NULL,
    created_at REAL NOT NULL,
    status TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    completion_delivered INTEGER NOT NULL,
    reasoning_tokens INTEGER NOT NULL,
    cached_tokens INTEGER NOT NULL,
    usage_source TEXT NOT NULL,
    cost_usd REAL,
    ttft_ms REAL,
    duration_ms REAL
);
CREATE INDEX IF NOT EXISTS usage_by_time ON usage (created_at);
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    turn_id TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    team_id TEXT,
    created_at REAL NOT NULL,
    request TEXT NOT NULL,
    previous_response_id TEXT,
    store INTEGER NOT NULL,
    deleted_at REAL
);
CREATE INDEX IF NOT EXISTS usage_by_team ON usage (team_id, created_at);
CREATE INDEX IF NOT EXISTS turns_by_conversation ON turns (conversation_id, started_at);
CREATE TABLE IF NOT EXISTS events (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    turn_id TEXT NOT NULL,
    type TEXT NOT NULL,
    created_at REAL NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;
"""

_BATCH = 512
_SEQ_CACHE = 4096


class SQLiteStore:
    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._queue: queue.SimpleQueue[tuple[_Op, asyncio.Future[Any] | None] | None] = (
            queue.SimpleQueue()
        )
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._next_seq: OrderedDict[str, int] = OrderedDict()  # owned by the worker thread

    # -- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if str(self.path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        ready: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="sqlite-store", daemon=True
        )
        self._thread.start()
        await ready

    async def close(self) -> None:
        if self._thread is None:
            return
        self._queue.put(None)
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    # -- writes (queued) -------------------------------------------------------------------

    def create_conversation(self, conversation: Conversation) -> None:
        row = (
            conversation.id,
            conversation.created_at,
            conversation.parent_id,
            conversation.parent_seq,
            conversation.team_id,
            conversation.key_id,
            orjson.dumps(conversation.metadata).decode() if conversation.metadata else None,
        )
        self._submit(lambda db: self._insert_conversation(db, row))

    def start_turn(self, turn: TurnStart) -> None:
        row = (
            turn.id,
            turn.conversation_id,
            turn.started_at,
            orjson.dumps(turn.request).decode(),
            turn.team_id,
            turn.key_id,
        )
        self._submit(
            lambda db: db.execute(
                "INSERT INTO turns (id, conversation_id, started_at, request, team_id, key_id)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                row,
            )
        )

    def append(self, event: NewEvent) -> None:
        self._submit(lambda db: self._insert_event(db, event))

    # -- reads (ordered after earlier writes) ----------------------------------------------

    async def flush(self) -> None:
        await self._call(lambda db: None)

    async def ping(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            raise RuntimeError("the SQLite store is not running")
        await self._call(lambda db: db.execute("SELECT 1").fetchone())

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        def read(db: sqlite3.Connection) -> Conversation | None:
            row = db.execute(
                "SELECT id, created_at, parent_id, parent_seq, team_id, key_id, metadata,"
                " deleted_at FROM conversations WHERE id = ?",
                (conversation_id,),
            ).fetchone()
            if row is None:
                return None
            id_, created, parent, parent_seq, team, key, metadata, deleted = row
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

        return await self._call(read)

    async def events(self, conversation_id: str, up_to_seq: int | None = None) -> list[Event]:
        limit = up_to_seq if up_to_seq is not None else 2**62

        def read(db: sqlite3.Connection) -> list[Event]:
            rows = db.execute(
                "SELECT seq, turn_id, type, created_at, payload FROM events"
                " WHERE conversation_id = ? AND seq <= ? ORDER BY seq",
                (conversation_id, limit),
            ).fetchall()
            return [Event(conversation_id, s, t, ty, c, orjson.loads(p)) for s, t, ty, c, p in rows]

        return await self._call(read)

    async def delete_conversation(self, conversation_id: str, when: float) -> None:
        await self._call(
            lambda db: db.execute(
                "UPDATE conversations SET deleted_at = ? WHERE id = ?", (when, conversation_id)
            )
        )

    async def open_turns(self) -> list[tuple[str, str]]:
        """(turn id, conversation id) of every turn without a turn/end, oldest first."""

        def read(db: sqlite3.Connection) -> list[tuple[str, str]]:
            rows = db.execute(
                "SELECT id, conversation_id FROM turns WHERE ended_at IS NULL ORDER BY started_at"
            ).fetchall()
            return [(r[0], r[1]) for r in rows]

        return await self._call(read)

    async def turn_ended(self, turn_id: str) -> bool:
        def read(db: sqlite3.Connection) -> bool:
            row = db.execute("SELECT ended_at FROM turns WHERE id = ?", (turn_id,)).fetchone()
            return row is not None and row[0] is not None

        return await self._call(read)

    # -- the worker ------------------------------------------------------------------------

    def queue_depth(self) -> int:
        return self._queue.qsize()

    def submit(self, op: _Op) -> None:
        """Queue a write of another module's own table (usage, keys) in order with the rest."""
        self._submit(op)

    def _submit(self, op: _Op) -> None:
        self._queue.put((op, None))

    async def call(self, op: Callable[[sqlite3.Connection], T]) -> T:
        """Run `op` on the store's connection, in order with every queued write."""
        return await self._call(op)

    async def _call(self, op: Callable[[sqlite3.Connection], T]) -> T:
        assert self._loop is not None, "store not started"
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.put((op, future))
        return await future

    def _insert_conversation(self, db: sqlite3.Connection, row: tuple[Any, ...]) -> None:
        cursor = db.execute(
            "INSERT OR IGNORE INTO conversations"
            " (id, created_at, parent_id, parent_seq, team_id, key_id, metadata)"
            " VALUES (?, ?, ?, ?, ?, ?, ?)",
            row,
        )
        if cursor.rowcount == 1:  # new: its first event is known without asking the file
            self._remember_seq(row[0], (row[3] or 0) + 1)

    def _remember_seq(self, conversation_id: str, next_seq: int) -> None:
        self._next_seq[conversation_id] = next_seq
        if len(self._next_seq) > _SEQ_CACHE:
            self._next_seq.popitem(last=False)

    def _insert_event(self, db: sqlite3.Connection, event: NewEvent) -> None:
        cid = event.conversation_id
        seq = self._next_seq.pop(cid, None)
        if seq is None:
            row = db.execute(
                "SELECT max(seq) FROM events WHERE conversation_id = ?", (cid,)
            ).fetchone()
            if row[0] is not None:
                seq = row[0] + 1
            else:
                parent = db.execute(
                    "SELECT parent_seq FROM conversations WHERE id = ?", (cid,)
                ).fetchone()
                seq = (parent[0] or 0) + 1 if parent else 1
        db.execute(
            "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (
                cid,
                seq,
                event.turn_id,
                event.type,
                event.created_at,
                orjson.dumps(event.payload).decode(),
            ),
        )
        self._remember_seq(cid, seq + 1)
        if event.type == TURN_END:
            db.execute(
                "UPDATE turns SET ended_at = ?, status = ? WHERE id = ?",
                (event.created_at, event.payload.get("status"), event.turn_id),
            )

    def _run(self, ready: asyncio.Future[None]) -> None:
        loop = self._loop
        assert loop is not None
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            db.execute("PRAGMA busy_timeout=5000")
            db.executescript(SCHEMA)
            _migrate(db)
        except Exception as exc:
            loop.call_soon_threadsafe(_settle, ready, None, exc)
            return
        loop.call_soon_threadsafe(_settle, ready, None, None)
        stopping = False
        while not stopping:
            item = self._queue.get()
            batch = []
            while item is not None:
                batch.append(item)
                if len(batch) >= _BATCH:
                    break
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
            else:
                stopping = True
            if batch:
                self._apply(db, batch)
        db.close()

    def _apply(
        self, db: sqlite3.Connection, batch: list[tuple[_Op, asyncio.Future[Any] | None]]
    ) -> None:
        results: list[tuple[asyncio.Future[Any] | None, Any, BaseException | None]] = []
        try:
            db.execute("BEGIN IMMEDIATE")
            for op, future in batch:
                results.append((future, op(db), None))
            db.execute("COMMIT")
        except Exception:
            # One bad operation must not sink the others: roll back, then apply one by one.
            log.exception(
                "store batch failed; retrying its %d operations one at a time", len(batch)
            )
            if db.in_transaction:
                db.execute("ROLLBACK")
            self._next_seq.clear()
            results = []
            for op, future in batch:
                try:
                    db.execute("BEGIN IMMEDIATE")
                    value = op(db)
                    db.execute("COMMIT")
                    results.append((future, value, None))
                except Exception as exc:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    self._next_seq.clear()
                    log.exception("store operation failed")
                    results.append((future, None, exc))
        loop = self._loop
        assert loop is not None
        for future, value, error in results:
            if future is not None:
                try:
                    loop.call_soon_threadsafe(_settle, future, value, error)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    pass


def _settle(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)


# Columns added after a table first shipped: (table, column, type).
_ADDED_COLUMNS = [
    ("conversations", "team_id", "TEXT"),
    ("conversations", "key_id", "TEXT"),
    ("turns", "team_id", "TEXT"),
    ("turns", "key_id", "TEXT"),
    ("teams", "limits", "TEXT"),
    ("conversations", "metadata", "TEXT"),
    ("conversations", "deleted_at", "REAL"),
    ("keys", "limits", "TEXT"),
]


def _migrate(db: sqlite3.Connection) -> None:
    for table, column, kind in _ADDED_COLUMNS:
        present = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in present:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
