"""SQLite checkpoints run on their own thread, off the commit path, and keep the log short."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from gateway.storage.db import Db
from gateway.storage.sqlite import SQLiteBackend


async def test_the_checkpoint_thread_copies_the_log_into_the_database(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    backend = SQLiteBackend(path, checkpoint_s=0.02)
    await backend.start()
    try:

        async def fill(db: Db) -> None:
            await db.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, body TEXT)")
            await db.executemany("INSERT INTO t (body) VALUES (?)", [("x" * 500,)] * 2000)

        await backend.transact(fill)
        size_before = os.path.getsize(path)
        done = backend.checkpoints + 2  # one that may have begun before the rows, then one more
        async with asyncio.timeout(10):
            while backend.checkpoints < done:
                await asyncio.sleep(0.01)
        assert os.path.getsize(path) > size_before + 500_000  # the rows are in the main file

        async def count(db: Db) -> int:
            return int(await db.fetchval("SELECT COUNT(*) FROM t"))

        assert await backend.run(count) == 2000
    finally:
        await backend.close()
    assert backend._checkpointer is None  # close() stopped the thread
