"""Store faults on the embedded store: the SQLite file locked by another process, its disk
full, and the spool's disk full as well. Requests keep succeeding throughout, and once the
fault clears every turn is in the store exactly once."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

from gateway.storage.db import Db
from gateway.storage.spool import Spool
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, completion


async def until(condition: Callable[[], bool], timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def ask(gw: GatewayUnderTest, n: int) -> list[str]:
    client = gw.client()
    ids = []
    for i in range(n):
        response = await client.chat.completions.with_raw_response.create(
            model="fake", messages=[{"role": "user", "content": f"q{i}"}]
        )
        assert response.parse().choices[0].message.content == "answer"
        ids.append(response.headers["X-Conversation-Id"])
    return ids


def exactly_once(gw: GatewayUnderTest, ids: list[str]) -> None:
    rows = gw.query(
        "SELECT conversation_id, type, count(*) FROM events GROUP BY conversation_id, type"
    )
    kinds: dict[str, dict[str, int]] = {}
    for cid, kind, count in rows:
        kinds.setdefault(cid, {})[kind] = count
    for cid in ids:
        assert kinds.get(cid) == {"user/message": 1, "assistant/message": 1, "turn/end": 1}, (
            cid,
            kinds.get(cid),
        )
    assert gw.query("SELECT count(*) FROM usage")[0][0] >= len(ids)


async def test_a_locked_sqlite_file_spools_then_catches_up(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(upstream=upstream)
    store = gw.gateway.store
    upstream.push(*[completion("answer")] * 12)
    before = await ask(gw, 2)
    await gw.flush()
    holder = sqlite3.connect(gw.db_path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")  # another process holds the file
    try:
        during = await ask(gw, 5)  # answered at once: the writes wait in memory
        await until(lambda: store.spooling)  # the busy timeout ran out: to the spool
        during += await ask(gw, 5)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    await until(lambda: not store.spooling)
    await gw.flush()
    exactly_once(gw, before + during)


async def test_a_full_disk_and_a_full_spool_lose_nothing(
    make_gateway: MakeGateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    gw = await make_gateway(upstream=upstream)
    store = gw.gateway.store
    upstream.push(*[completion("answer")] * 12)
    before = await ask(gw, 2)
    await gw.flush()
    spool_log = Spool(tmp_path / "spool", store.owner).log_path  # where the spool appends

    async def cap(pages: int | None) -> None:
        async def op(db: Db) -> None:
            count = await db.fetchval("PRAGMA page_count")
            await db.execute(f"PRAGMA max_page_count = {pages or count}")

        await store.backend.run(op)

    await cap(None)  # the database file may not grow: SQLITE_FULL
    spool_log.parent.mkdir(parents=True, exist_ok=True)
    spool_log.symlink_to("/dev/full")  # and the spool's disk is full too: ENOSPC
    try:
        during = await ask(gw, 4)  # requests still succeed
        await until(lambda: store.queue_depth() > 0)  # neither takes them: held in memory
    finally:
        spool_log.unlink()
    during += await ask(gw, 4)  # the spool takes them again
    await until(lambda: store.spooled_bytes() > 0)
    await cap(1_000_000)  # space again
    await until(lambda: not store.spooling)
    await gw.flush()
    exactly_once(gw, before + during)
