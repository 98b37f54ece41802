"""Schema migrations carry a store made by an earlier version forward, its data whole."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from gateway.config import StoreConfig
from gateway.storage import schema
from gateway.storage.backends import make_store
from gateway.storage.records import NewEvent

# The migrations table as every version of the gateway has made it.
TRACKING = (
    "CREATE TABLE IF NOT EXISTS schema_migrations"
    " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
)


def _sqlite_at(path: Path, version: int) -> sqlite3.Connection:
    """An SQLite file as a gateway of schema `version` left it."""
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute(TRACKING)
    for migration in schema.MIGRATIONS["sqlite"]:
        if migration.version > version:
            break
        for statement in migration.statements:
            db.execute(statement)
        db.execute(
            "INSERT INTO schema_migrations VALUES (?, ?, 0)", (migration.version, migration.name)
        )
    return db


async def test_v4_rebuilds_events_as_a_rowid_table_keeping_every_event(tmp_path: Path) -> None:
    path = tmp_path / "store.db"
    db = _sqlite_at(path, 3)
    with pytest.raises(sqlite3.OperationalError):  # WITHOUT ROWID at v3
        db.execute("SELECT rowid FROM events")
    long_id = db.execute("INSERT INTO event_payloads (body) VALUES (?)", (b'{"long":1}',)).lastrowid
    # Two conversations written in turns, as a v3 gateway did; one event's payload aside.
    rows = [
        ("b", 1, "tb", "user/message", 1.0, '{"content":"b1"}', "u1", None),
        ("a", 1, "ta", "user/message", 2.0, '{"content":"a1"}', "u2", None),
        ("a", 2, "ta", "assistant/message", 3.0, "", "u3", long_id),
        ("b", 2, "tb", "assistant/message", 4.0, '{"content":"b2"}', "u4", None),
    ]
    db.executemany("INSERT INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    db.close()

    config = StoreConfig(url=f"sqlite:///{path}", spool_path=str(tmp_path / "spool"))
    store = make_store(config, "test")
    await store.start()
    try:
        assert [(e.seq, e.type, e.payload) for e in await store.events("a")] == [
            (1, "user/message", {"content": "a1"}),
            (2, "assistant/message", {"long": 1}),
        ]
        assert [e.payload for e in await store.events("b", up_to_seq=1)] == [{"content": "b1"}]
        # Seqs go on from the last; a write replayed (same uid) still lands once.
        again = NewEvent("b", "tb2", "user/message", {"content": "b3"}, uid="u5")
        store.append(again)
        store.append(again)
        await store.flush()
        assert [e.seq for e in await store.events("b")] == [1, 2, 3]
    finally:
        await store.close()

    with sqlite3.connect(path) as db:
        latest = schema.latest("sqlite")
        assert db.execute("SELECT MAX(version) FROM schema_migrations").fetchone() == (latest,)
        # A rowid table now, in the order the events were made, its key still unique.
        assert [r[0] for r in db.execute("SELECT uid FROM events ORDER BY rowid")] == [
            "u1", "u2", "u3", "u4", "u5"
        ]  # fmt: skip
        with pytest.raises(sqlite3.IntegrityError):
            db.execute("INSERT INTO events VALUES ('a', 2, 't', 'x', 9.0, '{}', 'u9', NULL)")
        with pytest.raises(sqlite3.IntegrityError):
            db.execute("INSERT INTO events VALUES ('a', 3, 't', 'x', 9.0, '{}', 'u1', NULL)")
        names = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"events_by_conversation", "events_uid"} <= names
        plan = " ".join(
            r[3]
            for r in db.execute(
                "EXPLAIN QUERY PLAN SELECT seq FROM events WHERE conversation_id = 'a' ORDER BY seq"
            )
        )
        assert "events_by_conversation" in plan and "TEMP B-TREE" not in plan


async def test_a_new_store_has_events_as_a_rowid_table(tmp_path: Path) -> None:
    config = StoreConfig(url=f"sqlite:///{tmp_path}/s.db", spool_path=str(tmp_path / "spool"))
    store = make_store(config, "test")
    await store.start()
    await store.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        sql = db.execute("SELECT sql FROM sqlite_master WHERE name = 'events'").fetchone()[0]
        assert "WITHOUT ROWID" not in sql
        assert db.execute("SELECT COUNT(rowid) FROM events").fetchone() == (0,)


async def test_a_new_store_says_so_in_one_line_and_an_upgrade_names_its_steps(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    latest = schema.MIGRATIONS["sqlite"][-1].version
    caplog.set_level("INFO", logger="gateway.storage.schema")
    config = StoreConfig(url=f"sqlite:///{tmp_path}/new.db", spool_path=str(tmp_path / "s1"))
    store = make_store(config, "test")
    await store.start()
    await store.close()
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.storage.schema"]
    assert said == [f"store created at schema version {latest}"]

    caplog.clear()
    _sqlite_at(tmp_path / "old.db", latest - 2).close()
    config = StoreConfig(url=f"sqlite:///{tmp_path}/old.db", spool_path=str(tmp_path / "s2"))
    store = make_store(config, "test")
    await store.start()
    await store.close()
    said = [r.getMessage() for r in caplog.records if r.name == "gateway.storage.schema"]
    assert said[-1] == f"store migrated from schema version {latest - 2} to {latest}"
    assert [m for m in said if m.startswith("store migrating to version")] == [
        f"store migrating to version {m.version} ({m.name})"
        for m in schema.MIGRATIONS["sqlite"][-2:]
    ]
