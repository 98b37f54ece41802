"""Conversations whose every message holds the same words, put straight into a store's
database: a search for all of those words matches every message, the slowest a search gets."""

from __future__ import annotations

import sqlite3
import tempfile
from pathlib import Path

import asyncpg
import orjson

from gateway.config import StoreConfig
from gateway.storage.backends import make_store
from gateway.storage.schema import sqlite_index_new_messages

WORDS = [f"w{n}" for n in range(1000)]
TEXT = " ".join(WORDS)
# Every word of every message: what a flood of searches asks for.
EVERYTHING = TEXT


def _rows(count: int, team: str) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    conversations, events = [], []
    for n in range(count):
        cid = f"conv_seed{n:06d}"
        conversations.append((cid, 1_780_000_000.0 + n, team, None, None))
        for seq, kind in ((1, "user/message"), (2, "assistant/message")):
            payload = (
                {"content": TEXT} if seq == 1 else {"content": [{"type": "text", "text": TEXT}]}
            )
            events.append(
                (
                    cid,
                    seq,
                    f"turn_seed{n:06d}",
                    kind,
                    1_780_000_000.0 + n,
                    orjson.dumps(payload).decode(),
                    f"seed{n}-{seq}",
                )
            )
    return conversations, events


_CONVERSATIONS = (
    "INSERT INTO conversations (id, created_at, team_id, key_id, metadata) VALUES (?, ?, ?, ?, ?)"
)
_EVENTS = (
    "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload, uid)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


async def _migrated(url: str) -> None:
    store = make_store(StoreConfig(url=url, spool_path=tempfile.mkdtemp()), "seed")
    await store.start()
    await store.close()


async def seed_sqlite(path: Path, count: int, team: str) -> None:
    await _migrated(f"sqlite:///{path}")
    conversations, events = _rows(count, team)
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("BEGIN")
        db.executemany(_CONVERSATIONS, conversations)
        db.executemany(_EVENTS, events)
        uids = [event[6] for event in events]
        for start in range(0, len(uids), 500):
            some = uids[start : start + 500]
            db.execute(sqlite_index_new_messages(len(some)), some)
        db.execute("COMMIT")
    finally:
        db.close()


async def seed_postgres(url: str, count: int, team: str) -> None:
    await _migrated(url)
    conversations, events = _rows(count, team)
    conn = await asyncpg.connect(url)
    try:
        columns = ["id", "created_at", "team_id", "key_id", "metadata"]
        await conn.copy_records_to_table("conversations", records=conversations, columns=columns)
        columns = ["conversation_id", "seq", "turn_id", "type", "created_at", "payload", "uid"]
        await conn.copy_records_to_table("events", records=events, columns=columns)
        await conn.execute("ANALYZE")
    finally:
        await conn.close()
