"""A request's key check reads keys and teams without waiting for the turns queued for the
database: one team's backlog (a flood of long histories, a database held up) is never another
team's wait to be let in."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from gateway.config import StoreConfig
from gateway.metering.key_store import KeyStore
from gateway.metering.keys import KeyRecord, Team, hash_key
from gateway.storage.backends import make_store


async def test_a_key_is_checked_while_queued_writes_wait_for_a_locked_database(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.db"
    store = make_store(
        StoreConfig(url=f"sqlite:///{path}", spool_path=str(tmp_path / "spool")), "me"
    )
    await store.start()
    keys = KeyStore(store)
    await keys.create_team(Team("red", "Red", time.time()))
    secret = "gw-red-secret-0123456789"
    await keys.create_key(KeyRecord("key_red", hash_key(secret), secret[:7], "red", time.time()))
    await keys.create_team(Team("blue", "Blue", time.time()))

    # Another process holds the database's write lock: what the store queues now waits.
    lock = sqlite3.connect(path, isolation_level=None)
    lock.execute("BEGIN IMMEDIATE")
    try:
        store.write("conversation", {"id": "conv_held", "created_at": time.time()})
        mark = store.mark()
        found = await keys.key_by_hash(hash_key(secret))
        teams = await keys.teams()
        # Answered while the queued write is still where it was: neither committed nor, as
        # it would be once the writer gave up on the lock, in the spool.
        assert not store.durable(mark)
    finally:
        lock.execute("ROLLBACK")
        lock.close()
    assert found is not None and found.id == "key_red" and found.team_id == "red"
    assert [t.id for t in teams] == ["red", "blue"]
    await store.flush()
    reader = sqlite3.connect(path)
    assert reader.execute("SELECT count(*) FROM conversations WHERE id = 'conv_held'").fetchone()
    reader.close()
    await store.close()
