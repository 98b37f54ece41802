"""Event payloads reach the database as the same JSON text, however they are handed over: JSON
bytes (what orjson makes), or a DeferredPayload encoded as it is written; on a real SQLite file
and a real PostgreSQL, and through the spool."""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.config import StoreConfig
from gateway.storage.backends import make_store
from gateway.storage.db import Db
from gateway.storage.payload import DeferredPayload, as_text, encoded
from gateway.storage.records import Conversation, NewEvent
from gateway.storage.store import Store
from gateway.storage.writes import Write
from gateway.stream.compact import Batches

MakeStore = Callable[[], Awaitable[Store]]


def plain_and_deferred() -> tuple[dict[str, Any], DeferredPayload]:
    """The same payload with its long lists as plain lists, and as Batches read when written."""
    strings = [f"pärt “{i}” \n\\ 😀" for i in range(50)]
    gaps = list(range(49))
    plain: dict[str, Any] = {
        "content": [{"type": "text", "text": "".join(strings)}],
        "interrupted": False,
        "empty": {},
        "none": [],
        "stream": [
            {"type": "text", "index": 0, "t0": 3, "dt": gaps, "parts": strings},
            {"type": "finish", "t": 99, "reason": "stop"},
        ],
        "route": {"provider": "p", "ratio": 0.1, "flag": True, "nothing": None},
        "attempt": 1,
    }
    deferred = DeferredPayload(
        {
            **plain,
            "stream": [
                {
                    "type": "text",
                    "index": 0,
                    "t0": 3,
                    "dt": Batches([lambda: (gaps[:10], [], gaps[10:])]),
                    "parts": Batches([lambda: (strings[:7],), lambda: (strings[7:],)]),
                },
                plain["stream"][1],
            ],
        }
    )
    return plain, deferred


def test_a_deferred_payload_encodes_as_orjson_does_every_time() -> None:
    plain, deferred = plain_and_deferred()
    assert bytes(deferred.encode()) == orjson.dumps(plain)
    assert bytes(deferred.encode()) == orjson.dumps(plain)  # its sources are read again
    assert bytes(encoded(deferred)) == orjson.dumps(plain)
    assert encoded(plain) == orjson.dumps(plain)
    assert as_text(deferred) == as_text(orjson.dumps(plain)) == orjson.dumps(plain).decode()
    with pytest.raises(TypeError):
        DeferredPayload({"a": {1: "not a string key"}}).encode()


def test_a_spooled_write_carries_the_payload_as_text() -> None:
    plain, deferred = plain_and_deferred()
    for payload in (deferred, orjson.dumps(plain), orjson.dumps(plain).decode()):
        write = Write("event", {"type": "x", "payload": payload})
        assert Write.decode(write.encode()).row["payload"] == orjson.dumps(plain).decode()


def test_a_spooled_event_line_holds_its_payload_verbatim_and_old_lines_still_read() -> None:
    text = orjson.dumps({"content": 'say "hi"\tthen\nstop', "é": ["\\", None, 1.5]}).decode()
    write = Write("event", {"type": "x", "turn_id": "t1", "payload": text})
    line = write.encode()
    assert b"\n" not in line
    assert line.endswith(b"\t" + text.encode())  # not escaped into a string of the row
    back = Write.decode(line)
    assert back.kind == "event" and back.row == {"type": "x", "turn_id": "t1", "payload": text}
    # What an earlier version spooled: the payload a string inside the row.
    old = orjson.dumps({"k": "event", "r": {"type": "x", "turn_id": "t1", "payload": text}})
    assert Write.decode(old).row == back.row
    turn = Write("turn", {"id": "t1", "request": orjson.dumps({"a": "\t"}).decode()})
    assert turn.encode().endswith(b'\t{"a":"\\t"}')
    assert Write.decode(turn.encode()) == turn
    # Text that is not orjson's may hold a newline, the line's end: it stays inside the row.
    odd = Write("event", {"type": "x", "payload": '{\n"a": 1}'})
    assert b"\n" not in odd.encode() and Write.decode(odd.encode()) == odd
    assert Write.decode(Write("usage", {"id": "u\t1"}).encode()) == Write("usage", {"id": "u\t1"})


@pytest.fixture(params=["sqlite", "postgresql"])
async def make(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MakeStore]:
    url = (
        f"sqlite:///{tmp_path}/store.db"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    made: list[Store] = []

    async def start() -> Store:
        store = make_store(StoreConfig(url=url, spool_path=str(tmp_path / "spool")), "test")
        await store.start()
        made.append(store)
        return store

    yield start
    for store in made:
        await store.close()


async def test_every_payload_is_stored_as_its_json_text(make: MakeStore, tmp_path: Path) -> None:
    store = await make()
    plain, deferred = plain_and_deferred()
    store.create_conversation(Conversation("c", 1.0))
    store.append(NewEvent("c", "t", "assistant/message", deferred))
    store.append(NewEvent("c", "t", "user/message", {"content": "héllo"}))
    await store.flush()
    events = await store.events("c")
    assert [e.payload for e in events] == [plain, {"content": "héllo"}]
    if store.dialect == "sqlite":
        # A long stream's payload sits in a table of its own (written in pieces, see below).
        with sqlite3.connect(tmp_path / "store.db") as db:
            rows = db.execute(
                "SELECT typeof(payload), payload, body FROM events"
                " LEFT JOIN event_payloads ON id = payload_id ORDER BY seq"
            ).fetchall()
        assert rows == [
            ("text", "", orjson.dumps(plain)),
            ("text", '{"content":"héllo"}', None),
        ]


def test_a_deferred_payload_is_handed_on_in_pieces_never_whole() -> None:
    plain, deferred = plain_and_deferred()
    whole = orjson.dumps(plain)
    for piece in (1, 100, 1000, len(whole), 10 * len(whole)):
        pieces: list[bytes] = []
        assert deferred.write(lambda b, into=pieces: into.append(bytes(b)), piece) == len(whole)
        assert b"".join(pieces) == whole
        # A piece is handed on as soon as it reaches `piece`: past it by one append at most
        # (the longest here: the content's text, or all the parts in one batch).
        longest = max(len(orjson.dumps(plain["content"][0]["text"])),
                      len(orjson.dumps(plain["stream"][0]["parts"])))  # fmt: skip
        assert max(map(len, pieces)) < piece + longest
    assert deferred.size() == len(whole)


async def test_a_long_payload_lands_whole_through_small_pieces_once_per_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import gateway.storage.payload as payload_module

    monkeypatch.setattr(payload_module, "PIECE", 7)  # hundreds of blob writes
    store = make_store(StoreConfig(url=f"sqlite:///{tmp_path}/s.db", spool_path=str(tmp_path)), "t")
    await store.start()
    try:
        plain, deferred = plain_and_deferred()
        store.create_conversation(Conversation("c", 1.0))
        store.append(NewEvent("c", "t", "assistant/message", deferred, uid="u1"))
        await store.flush()
        # The same event again (a replay): it is stored already, so nothing more is written.
        again = Write("event", {"conversation_id": "c", "turn_id": "t", "type": "x",
                                "created_at": 2.0, "payload": deferred, "uid": "u1"})  # fmt: skip
        await store.backend.apply([again])
        assert [e.payload for e in await store.events("c")] == [plain]
        # Written through a small page cache, and the usual one is back for what follows.
        assert await store.backend.run(_cache_size) == -2000
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT count(*), max(length(body)) FROM event_payloads").fetchall() == [
            (1, len(orjson.dumps(plain)))
        ]


async def test_a_long_payload_that_changes_while_written_is_not_stored_cut(
    tmp_path: Path,
) -> None:
    store = make_store(StoreConfig(url=f"sqlite:///{tmp_path}/s.db", spool_path=str(tmp_path)), "t")
    await store.start()
    try:
        store.create_conversation(Conversation("c", 1.0))
        await store.flush()
        for step in (1, -1):  # one part more, or one fewer, each time it is read
            passes: list[list[str]] = []

            def parts(step: int = step, passes: list[list[str]] = passes) -> Any:
                passes.append(["p"] * (5 + step * len(passes)))
                return (passes[-1],)

            changing = DeferredPayload({"parts": Batches([parts])})
            row = {"conversation_id": "c", "turn_id": "t", "type": "x", "created_at": 2.0,
                   "payload": changing, "uid": "u2"}  # fmt: skip
            with pytest.raises(RuntimeError, match="changed as it was written"):
                await store.backend.apply([Write("event", row)])
            assert len(passes) == 2
        assert await store.events("c") == []
        assert await store.backend.run(_cache_size) == -2000
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "s.db") as db:
        assert db.execute("SELECT count(*) FROM event_payloads").fetchone() == (0,)


async def _cache_size(db: Db) -> int:
    return int(await db.fetchval("PRAGMA cache_size"))
