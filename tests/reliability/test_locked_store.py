"""`kill -9` while the database holds the gateway's writes back (a table locked by a migration
or a long transaction): every stream whose client was answered comes back, at restart, with
exactly what its client received (docs/operations.md, "Stopping and crashing")."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes import FakeUpstream
from tests.postgres_server import PostgresServer
from tests.reliability.test_crash_recovery import BODY, text_of, write_config
from tests.test_cli import free_port
from tests.test_process import start

STREAMS = 4


class Reader:
    """One client's stream: the text it has received, read as it arrives."""

    def __init__(self) -> None:
        self.text = ""
        self.conversation = ""
        self.moved = asyncio.Event()

    async def read(self, session: aiohttp.ClientSession, url: str) -> None:
        try:
            async with session.post(url + "/v1/chat/completions", json=BODY) as response:
                self.conversation = response.headers["X-Conversation-Id"]
                async for line in response.content:
                    if line.startswith(b"data: {"):
                        for choice in json.loads(line[6:])["choices"]:
                            self.text += choice["delta"].get("content") or ""
                        self.moved.set()
        except aiohttp.ClientError:
            pass  # the gateway died under it

    async def until_one_of(self, texts: set[str]) -> None:
        async with asyncio.timeout(30):
            while self.text not in texts:
                self.moved.clear()
                await self.moved.wait()


class Database:
    """The store's database as the test sees it, and a lock on its writes."""

    def __init__(self, url: str, path: Path | None) -> None:
        self.url = url
        self.path = path  # SQLite's file, else PostgreSQL
        self._sqlite: sqlite3.Connection | None = None
        self._pg: Any = None
        self._lock: Any = None

    async def lock(self) -> None:
        """Writes wait (a long transaction, a migration), reads go on."""
        if self.path is not None:
            self._sqlite = sqlite3.connect(self.path, isolation_level=None)
            self._sqlite.execute("BEGIN IMMEDIATE")
        else:
            import asyncpg

            self._pg = await asyncpg.connect(self.url)
            self._lock = self._pg.transaction()
            await self._lock.start()
            await self._pg.execute("LOCK TABLE turns IN EXCLUSIVE MODE")

    async def unlock(self) -> None:
        if self._sqlite is not None:
            self._sqlite.execute("ROLLBACK")
            self._sqlite.close()
        if self._pg is not None:
            await self._lock.rollback()
            await self._pg.close()

    async def fetch(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        if self.path is not None:
            with sqlite3.connect(self.path) as connection:
                return connection.execute(sql.replace("$1", "?"), args).fetchall()
        import asyncpg

        connection = await asyncpg.connect(self.url)
        try:
            return [tuple(r) for r in await connection.fetch(sql, *args)]
        finally:
            await connection.close()

    async def checkpointed(self, texts: dict[str, str]) -> None:
        """Until the checkpoint of each conversation's turn holds exactly its text: in the
        database, or in the spool the next start replays."""
        from gateway.conversations.recovery import checkpoint_of

        async with asyncio.timeout(30):
            while True:
                rows = await self.fetch(
                    "SELECT turn_id, conversation_id, body FROM turn_checkpoints"
                )
                parts = await self.fetch(
                    "SELECT turn_id, body FROM turn_checkpoint_parts ORDER BY turn_id, seq"
                )
                held = {
                    r[1]: checkpoint_of(r[2], [p[1] for p in parts if p[0] == r[0]])["message"]
                    for r in rows
                }
                if all(held.get(c) and text_of(held[c]) == t for c, t in texts.items()):
                    return
                await asyncio.sleep(0.05)


def spooled_checkpoints(spool: Path) -> dict[str, str]:
    """The text of each conversation's last checkpoint in the spool (written whole, or a
    whole one and its parts)."""
    from gateway.conversations.recovery import checkpoint_of
    from gateway.storage.writes import Write

    whole: dict[str, tuple[str, str]] = {}
    parts: dict[str, list[str]] = {}
    for log in spool.glob("*.log"):
        for line in log.read_bytes().splitlines():
            write = Write.decode(line)
            row = write.row
            if write.kind == "checkpoint":
                whole[row["turn_id"]] = (row["conversation_id"], row["body"])
                parts[row["turn_id"]] = []
            elif write.kind == "checkpoint_part":
                parts.setdefault(row["turn_id"], []).append(row["body"])
    texts = {}
    for turn, (conversation, body) in whole.items():
        message = checkpoint_of(body, parts[turn])["message"]
        texts[conversation] = text_of(message) if message else ""
    return texts


async def until_checkpointed(database: Database, spool: Path, texts: dict[str, str]) -> None:
    async with asyncio.timeout(40):
        while True:
            try:
                await asyncio.wait_for(database.checkpointed(texts), 0.5)
                return
            except TimeoutError:
                pass
            held = spooled_checkpoints(spool)
            if all(held.get(c) == t for c, t in texts.items()):
                return


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_a_kill_while_the_database_holds_the_turns_back_loses_no_stream(
    tmp_path: Path, upstream: FakeUpstream, backend: str, request: pytest.FixtureRequest
) -> None:
    scripts = [[f"s{i}p{j} " for j in range(3 + i)] for i in range(STREAMS)]
    for parts in scripts:
        upstream.stall_after(parts)
    answers = {"".join(parts) for parts in scripts}
    if backend == "sqlite":
        database = Database(f"sqlite:///{tmp_path}/gw.db", tmp_path / "gw.db")
    else:
        postgres: PostgresServer = request.getfixturevalue("postgres")
        database = Database(postgres.create_database(), None)
    spool = tmp_path / "spool"
    store = {"url": database.url, "spool_path": str(spool)}
    config = write_config(tmp_path / "gw.yaml", store, upstream.deployment())
    port = free_port()
    gateway = f"http://127.0.0.1:{port}"
    process = await start(config, port)
    await database.lock()
    readers = [Reader() for _ in range(STREAMS)]
    try:
        async with aiohttp.ClientSession() as session:
            tasks = [asyncio.create_task(r.read(session, gateway)) for r in readers]
            # Each client has its whole answer, though no turn could be written.
            await asyncio.gather(*(r.until_one_of(answers) for r in readers))
            assert (await database.fetch("SELECT count(*) FROM turns"))[0][0] == 0
            await until_checkpointed(database, spool, {r.conversation: r.text for r in readers})
            process.send_signal(signal.SIGKILL)
            assert await process.wait() == -signal.SIGKILL
            await asyncio.gather(*tasks)
    finally:
        await database.unlock()  # the killed process's transactions went with it
    process = await start(config, port)  # the same instance: its spool, then its open turns
    process.send_signal(signal.SIGTERM)
    await process.wait()
    for reader in readers:
        rows = await database.fetch(
            "SELECT type, payload FROM events WHERE conversation_id = $1 ORDER BY seq",
            reader.conversation,
        )
        events = [(kind, json.loads(payload)) for kind, payload in rows]
        assert [kind for kind, _ in events] == ["user/message", "assistant/message", "turn/end"]
        assert text_of(events[1][1]) == reader.text
        assert events[2][1]["reason"] == "crash_recovered"
    assert (await database.fetch("SELECT count(*) FROM turn_checkpoints"))[0][0] == 0
