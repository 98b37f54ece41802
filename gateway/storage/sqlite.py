"""SQLite backend: one file in WAL mode, one thread that owns the writing connection.

Every operation runs on that thread in submission order, so the event loop never blocks on the
disk. A batch of writes is one transaction (group commit). Reads that may be long (the
conversation list, its search) run beside it on read-only connections of their own, stopped
at a deadline (gateway.storage.sqlite_reads): they hold neither the writer nor each other.

The file is created 0600 before SQLite opens it (its `-wal` and `-shm` files take the database
file's mode), its directory 0700 when made here; a file another user can read is logged at
start (docs/security.md).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

from gateway.storage.db import Dialect, Op, Row, StoreUnavailable, run_now
from gateway.storage.payload import DeferredPayload
from gateway.storage.spool import create_private, private_dir
from gateway.storage.sqlite_reads import ReadPool
from gateway.storage.writes import Write, apply_batch

T = TypeVar("T")

log = logging.getLogger(__name__)

# The page cache a long payload is written through: small, so that its pages spill to the WAL
# as they fill rather than grow the cache by the payload's size. The usual size is restored
# after it.
_LONG_PAYLOAD_CACHE_KIB = 256
# How long a statement waits for another connection's lock (another worker's commit).
_BUSY_MS = 5000

# A NULL parameter as it is, without the module's search for an adapter: sqlite3 binds int,
# float and str directly but looks every other value up, None included, and a miss there costs
# an AttributeError made and dropped (a turn binds about ten NULLs). An
# adapter for None that gives None back (an empty dict's `get`, a C call) is found at once.
# Process-wide, as every sqlite3 adapter is, and the same value either way.
sqlite3.register_adapter(type(None), cast(Callable[[None], None], {}.get))

# OperationalErrors that mean "the file cannot be written now", not "this SQL is wrong".
_ENVIRONMENT = ("locked", "busy", "disk", "full", "i/o", "readonly", "unable to open")

# Threads reading for searches, and for the other bounded reads (a list without `q`): a flood
# of searches, each stopped at its deadline, still leaves a list its own thread.
_SEARCH_THREADS = 2
_LIST_THREADS = 1


class _Connection:
    dialect: Dialect = "sqlite"

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    async def execute(self, sql: str, *args: Any) -> int:
        return self._db.execute(sql, args).rowcount

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> int | None:
        return self._db.executemany(sql, rows).rowcount

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return self._db.execute(sql, args).fetchall()

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        return self._db.execute(sql, args).fetchone()  # type: ignore[no-any-return]

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = self._db.execute(sql, args).fetchone()
        return None if row is None else row[0]


class SQLiteBackend:
    dialect: Dialect = "sqlite"

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self._jobs: queue.SimpleQueue[
            tuple[Callable[[_Connection], Any], asyncio.Future[Any]] | None
        ] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._searches = ReadPool(self.path, _SEARCH_THREADS, "sqlite-search")
        self._lists = ReadPool(self.path, _LIST_THREADS, "sqlite-list")

    @property
    def where(self) -> str:
        return str(self.path)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._on_disk:
            await asyncio.to_thread(self._private_file)
        ready: asyncio.Future[None] = self._loop.create_future()
        self._thread = threading.Thread(
            target=self._run, args=(ready,), name="sqlite-store", daemon=True
        )
        self._thread.start()
        await ready
        if self._on_disk:
            self._searches.start()
            self._lists.start()

    @property
    def _on_disk(self) -> bool:
        return str(self.path) != ":memory:"  # another connection would see another database

    def _private_file(self) -> None:
        """The database file, made 0600 (and its directory 0700) if it is not there yet."""
        private_dir(self.path.parent)
        os.close(create_private(self.path, os.O_RDWR))
        mode = self.path.stat().st_mode & 0o777
        if mode & 0o077:
            log.warning(
                "the store file %s can be read by other local users (mode %o): chmod 600 it,"
                " and its -wal and -shm files",
                self.path,
                mode,
            )

    async def close(self) -> None:
        if self._thread is None:
            return
        if self._on_disk:
            await self._searches.close()
            await self._lists.close()
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)
        self._thread = None

    async def run(self, op: Op[T]) -> T:
        return await self._submit(lambda db: run_now(op(db)))  # type: ignore[arg-type]

    async def transact(self, op: Op[T]) -> T:
        def job(db: _Connection) -> T:
            db._db.execute("BEGIN IMMEDIATE")
            try:
                value: T = run_now(op(db))  # type: ignore[arg-type]
            except BaseException:
                if db._db.in_transaction:
                    db._db.execute("ROLLBACK")
                raise
            db._db.execute("COMMIT")
            return value

        return await self._submit(job)

    async def read(self, op: Op[T], timeout_s: float, *, search: bool = False) -> T:
        if not self._on_disk:
            return await self.run(op)
        return await (self._searches if search else self._lists).read(op, timeout_s)

    async def apply(self, writes: list[Write]) -> None:
        async def op(db: Any) -> None:
            await apply_batch(db, [_long_payload_aside(db._db, write) for write in writes])

        await self.transact(op)

    async def ping(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            raise StoreUnavailable("the SQLite store is not running")
        await self._submit(lambda db: db._db.execute("SELECT 1").fetchone())

    async def _submit(self, job: Callable[[_Connection], T]) -> T:
        assert self._loop is not None, "store not started"
        future: asyncio.Future[T] = self._loop.create_future()
        self._jobs.put((job, future))
        return await future

    def _run(self, ready: asyncio.Future[None]) -> None:
        loop = self._loop
        assert loop is not None
        try:
            raw = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            raw.execute(f"PRAGMA busy_timeout={_BUSY_MS}")
            _write_ahead_log(raw)
            raw.execute("PRAGMA synchronous=NORMAL")
        except Exception as exc:
            loop.call_soon_threadsafe(_settle, ready, None, exc)
            return
        loop.call_soon_threadsafe(_settle, ready, None, None)
        db = _Connection(raw)
        while (item := self._jobs.get()) is not None:
            job, future = item
            try:
                value, error = job(db), None
            except sqlite3.OperationalError as exc:
                value, error = None, _classify(exc)
            except BaseException as exc:  # handed to the caller, who decides
                value, error = None, exc
            try:
                loop.call_soon_threadsafe(_settle, future, value, error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                pass
        raw.close()


def _long_payload_aside(raw: sqlite3.Connection, write: Write) -> Write:
    """An event with a long stream's payload (a DeferredPayload), as the event to insert once
    its payload is in `event_payloads`: written there first, in pieces (never all of its
    JSON at once), unless the event is already stored (a replay), which leaves nothing behind
    on a conflict. The write itself is left as it is: a batch that fails is spooled."""
    payload = write.row.get("payload") if write.kind == "event" else None
    if type(payload) is not DeferredPayload:
        return write
    row = {**write.row, "payload": ""}
    if raw.execute("SELECT 1 FROM events WHERE uid = ?", (row["uid"],)).fetchone() is None:
        row["payload_id"] = _write_long_payload(raw, payload)
    return Write("event", row)


def _write_long_payload(raw: sqlite3.Connection, payload: DeferredPayload) -> int:
    size = payload.size()  # a blob's size is set when it is made: a first pass to count
    cache = raw.execute("PRAGMA cache_size").fetchone()[0]
    raw.execute(f"PRAGMA cache_size = -{_LONG_PAYLOAD_CACHE_KIB}")
    try:
        made = raw.execute("INSERT INTO event_payloads (body) VALUES (zeroblob(?))", (size,))
        rowid = made.lastrowid
        assert rowid is not None
        with raw.blobopen("event_payloads", "body", rowid) as blob:

            def give(piece: bytearray) -> None:
                if blob.tell() + len(piece) > size:
                    _changed(size, blob.tell() + len(piece))
                blob.write(piece)

            written = payload.write(give)
    finally:
        raw.execute(f"PRAGMA cache_size = {int(cache)}")
    if written != size:
        _changed(size, written)
    return rowid


def _changed(size: int, written: int) -> NoReturn:
    # Its sources changed between the two passes: never stored cut or padded.
    raise RuntimeError(f"a long payload changed as it was written ({size} -> {written}+ bytes)")


def _write_ahead_log(raw: sqlite3.Connection) -> None:
    """Put the database in WAL mode. Two processes opening a new file at once (the workers of
    `serve --workers`) can each hold what the other's switch needs; SQLite then answers
    "locked" at once rather than wait (waiting would never end), so the switch is tried again
    once the other is through, within the busy timeout."""
    deadline = time.monotonic() + _BUSY_MS / 1000
    while True:
        try:
            raw.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _classify(exc: sqlite3.OperationalError) -> BaseException:
    if any(word in str(exc).lower() for word in _ENVIRONMENT):
        unavailable = StoreUnavailable(f"SQLite: {exc}")
        unavailable.__cause__ = exc
        return unavailable
    return exc


def _settle(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
