"""Processes starting together on one new SQLite file (the workers of `serve --workers`)
each start: the switch to WAL mode one of them cannot make while the other holds the file is
made again once the other is through, and the schema is made once."""

from __future__ import annotations

import asyncio
import multiprocessing
from pathlib import Path
from typing import Any

from gateway.config import StoreConfig
from gateway.storage import schema
from gateway.storage.backends import make_store

ROUNDS = 12


def start_store(path: str, spool: str, owner: str, ready: Any) -> None:
    async def start() -> None:
        store = make_store(StoreConfig(url=f"sqlite:///{path}", spool_path=spool), owner)
        await store.start()
        await store.close()

    ready.wait(30)  # both at once, once both have imported the gateway
    asyncio.run(start())


def test_two_processes_starting_on_a_new_file_both_start(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    for n in range(ROUNDS):
        path = str(tmp_path / f"store-{n}.db")
        ready = context.Barrier(2)
        starting = [
            context.Process(
                target=start_store, args=(path, str(tmp_path / f"spool-{n}"), f"w{i}", ready)
            )
            for i in range(2)
        ]
        for process in starting:
            process.start()
        for process in starting:
            process.join(30)
        assert [p.exitcode for p in starting] == [0, 0], f"round {n}"
        assert asyncio.run(_version(path)) == schema.latest("sqlite")


async def _version(path: str) -> int:
    store = make_store(StoreConfig(url=f"sqlite:///{path}", spool_path=path + ".spool"), "reader")
    await store.start()
    try:
        return await store.run(schema.current_version)
    finally:
        await store.close()
