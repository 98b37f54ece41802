"""SQLite backend: one file in WAL mode, one thread that owns the connection.

Every operation runs on that thread in submission order, so the event loop never blocks on the
disk. A batch of writes is one transaction (group commit).
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gateway.storage.db import Dialect, Op, Row, StoreUnavailable, run_now
from gateway.storage.payload import DeferredPayload
from gateway.storage.writes import Write, apply_batch

# A long stream's payload is encoded as SQLite binds it, on this backend's thread: its JSON is
# one buffer that lives only until SQLite has copied it (before SQLite makes the row of it).
sqlite3.register_adapter(DeferredPayload, DeferredPayload.encode)

T = TypeVar("T")

# OperationalErrors that mean "the file cannot be written now", not "this SQL is wrong".
_ENVIRONMENT = ("locked", "busy", "disk", "full", "i/o", "readonly", "unable to open")


class _Connection:
    dialect: Dialect = "sqlite"

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    async def execute(self, sql: str, *args: Any) -> int:
        return self._db.execute(sql, args).rowcount

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self._db.executemany(sql, rows)

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

    @property
    def where(self) -> str:
        return str(self.path)

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

    async def apply(self, writes: list[Write]) -> None:
        async def op(db: Any) -> None:
            await apply_batch(db, writes)

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
            raw.execute("PRAGMA journal_mode=WAL")
            raw.execute("PRAGMA synchronous=NORMAL")
            raw.execute("PRAGMA busy_timeout=5000")
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
