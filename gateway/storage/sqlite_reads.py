"""SQLite reads that may be long (the conversation list and its search): on connections of
their own, stopped at a deadline.

On the store's one thread a search of many common words held every write and every other read
behind it. Here each pool of threads has its own connections: WAL lets them read while the
writer writes, each seeing the last commit when its statement began. A progress handler,
called every few thousand virtual machine instructions, aborts a statement past its read's
deadline (SQLite interrupts it: the thread is free again at once), and a read that waited past
its deadline in the queue is not started at all.
"""

from __future__ import annotations

import asyncio
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from gateway.storage.db import Dialect, Op, ReadTimeout, Row, run_now

T = TypeVar("T")

# Virtual machine instructions between two looks at the clock: well under a millisecond.
_PROGRESS_STEPS = 10_000


class _ReadConnection:
    """The Db of a read: the four reading methods; `execute` only for a session setting."""

    dialect: Dialect = "sqlite"

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db

    async def execute(self, sql: str, *args: Any) -> int:
        return self._db.execute(sql, args).rowcount

    async def executemany(self, sql: str, rows: list[tuple[Any, ...]]) -> int | None:
        raise sqlite3.OperationalError("a read connection does not write")

    async def fetch(self, sql: str, *args: Any) -> list[Row]:
        return self._db.execute(sql, args).fetchall()

    async def fetchrow(self, sql: str, *args: Any) -> Row | None:
        return self._db.execute(sql, args).fetchone()  # type: ignore[no-any-return]

    async def fetchval(self, sql: str, *args: Any) -> Any:
        row = self._db.execute(sql, args).fetchone()
        return None if row is None else row[0]


_Job = tuple[Op[Any], float, asyncio.Future[Any]]  # the read, its monotonic deadline, its answer


class ReadPool:
    """`threads` threads, each with a read-only connection to `path`, taking reads in order."""

    def __init__(self, path: Path, threads: int, name: str) -> None:
        self._path = path
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name=f"{name}-{n}", daemon=True)
            for n in range(threads)
        ]
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for thread in self._threads:
            thread.start()

    async def close(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        for thread in self._threads:
            if thread.is_alive():
                await asyncio.to_thread(thread.join)

    async def read(self, op: Op[T], timeout_s: float) -> T:
        assert self._loop is not None, "store not started"
        future: asyncio.Future[T] = self._loop.create_future()
        self._jobs.put((op, time.monotonic() + timeout_s, future))
        return await future

    def _run(self) -> None:
        loop = self._loop
        assert loop is not None
        raw = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        raw.execute("PRAGMA query_only = ON")
        raw.execute("PRAGMA busy_timeout = 5000")
        db = _ReadConnection(raw)
        try:
            while (job := self._jobs.get()) is not None:
                op, deadline, future = job
                value, error = self._one(raw, db, op, deadline)
                try:
                    loop.call_soon_threadsafe(_settle, future, value, error)
                except RuntimeError:  # the loop is closed: nobody is waiting any more
                    pass
        finally:
            raw.close()

    @staticmethod
    def _one(
        raw: sqlite3.Connection, db: _ReadConnection, op: Op[Any], deadline: float
    ) -> tuple[Any, BaseException | None]:
        if time.monotonic() >= deadline:
            return None, ReadTimeout("the read waited past its deadline")
        over: Callable[[], bool] = lambda: time.monotonic() >= deadline  # noqa: E731
        raw.set_progress_handler(over, _PROGRESS_STEPS)
        try:
            return run_now(op(db)), None  # type: ignore[arg-type]
        except sqlite3.OperationalError as exc:
            if "interrupted" in str(exc) and over():
                return None, ReadTimeout("the read ran past its deadline")
            return None, exc
        except BaseException as exc:  # handed to the caller, who decides
            return None, exc
        finally:
            raw.set_progress_handler(None, 0)
            if raw.in_transaction:
                raw.execute("ROLLBACK")


def _settle(future: asyncio.Future[Any], value: Any, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(value)
