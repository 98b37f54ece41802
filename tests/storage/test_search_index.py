"""SQLite's search index: the text the store gives it with each new message is the text the
schema's SQL takes out of the same payload's JSON (what a replayed write is indexed by)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import StoreConfig
from gateway.storage.backends import make_store
from gateway.storage.db import Db
from gateway.storage.records import Conversation, NewEvent
from gateway.storage.schema import SEARCHED_CHARS
from gateway.storage.store import Store
from gateway.storage.writes import Write, search_text

PAYLOADS: list[tuple[str, dict[str, Any]]] = [
    ("user/message", {"content": "plain words here"}),
    ("user/message", {"content": ""}),
    ("user/message", {"content": None}),
    ("user/message", {"name": "no content at all"}),
    (
        "user/message",
        {
            "content": [
                {"type": "text", "text": "look at"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "this picture"},
            ]
        },
    ),
    (
        "assistant/message",
        {
            "content": [
                {"type": "reasoning", "text": "hidden thoughts"},
                {"type": "text", "text": "the answer"},
                {"type": "tool_call", "id": "c1", "name": "f", "arguments": "{}"},
                "not a block",
                {"text": "a block without a type"},
            ],
            "stream": [{"type": "text", "t": 1.0}],
            "usage": {"prompt_tokens": 3},
        },
    ),
    ("assistant/message", {"content": [{"type": "reasoning", "text": "only reasoning"}]}),
    ("tool/result", {"tool_call_id": "c1", "content": "sunny, 21 degrees"}),
    ("tool/result", {"tool_call_id": "c2", "content": [{"type": "text", "text": "rows: 3"}]}),
    ("user/message", {"content": "é ünïcödé 漢字 " + "x" * (SEARCHED_CHARS + 10)}),
    ("turn/end", {"status": "completed"}),
]


@pytest.fixture
async def store(tmp_path: Path) -> Store:
    config = StoreConfig(url=f"sqlite:///{tmp_path}/store.db", spool_path=str(tmp_path))
    made = make_store(config, "test")
    await made.start()
    yield made  # type: ignore[misc]
    await made.close()


def _event(cid: str, number: int, kind: str, payload: dict[str, Any], given: bool) -> Write:
    row = {
        "conversation_id": cid,
        "turn_id": f"{cid}-t",
        "type": kind,
        "created_at": 1.0,
        "payload": orjson.dumps(payload).decode(),
        "uid": f"{cid}-{number}",
    }
    search = search_text(payload) if given and kind != "turn/end" else None
    return Write("event", row, search)


async def _indexed(store: Store, cid: str) -> list[tuple[int, str]]:
    async def read(db: Db) -> list[tuple[int, str]]:
        rows = await db.fetch(
            "SELECT e.seq, m.text FROM message_text m JOIN events e ON e.rowid = m.rowid"
            " WHERE e.conversation_id = ? ORDER BY e.seq",
            cid,
        )
        return [(row[0], row[1]) for row in rows]

    return await store.backend.run(read)


async def test_text_given_with_a_message_is_what_sql_takes_out_of_its_json(store: Store) -> None:
    for cid in ("given", "replayed"):
        store.create_conversation(Conversation(cid, 1.0))
    await store.flush()
    for cid, given in (("given", True), ("replayed", False)):
        writes = [_event(cid, n, kind, p, given) for n, (kind, p) in enumerate(PAYLOADS)]
        await store.backend.apply(writes)  # one batch each
    from_payload = await _indexed(store, "given")
    from_json = await _indexed(store, "replayed")
    assert from_payload == from_json
    texts = [text for _, text in from_payload]
    assert texts[:3] == [
        "plain words here",
        "look at this picture",
        "the answer a block without a type",
    ]
    assert "hidden thoughts" not in " ".join(texts) and "only reasoning" not in " ".join(texts)
    assert len(texts[-1]) == SEARCHED_CHARS


async def test_a_message_written_twice_is_indexed_once(store: Store) -> None:
    store.create_conversation(Conversation("c", 1.0))
    message = NewEvent("c", "t", "user/message", {"content": "a needle in the haystack"})
    store.append(message)
    store.append(message)
    store.append(NewEvent("c", "t", "user/message", {"content": "another needle"}))
    await store.flush()
    assert [text for _, text in await _indexed(store, "c")] == [
        "a needle in the haystack",
        "another needle",
    ]
