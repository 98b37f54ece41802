"""Process faults under load, measured: SIGTERM drains and records every stream; after a
`kill -9` the restart closes what was open, and no turn a client saw complete is lost."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from tests.fakes import FakeUpstream, frames, sse
from tests.test_cli import free_port
from tests.test_process import start

CLIENTS = 16


@dataclass
class Outcome:
    conversation: str | None = None  # from the response headers: the request reached a turn
    completed: bool = False  # the client saw the stream's end ([DONE])


def write_config(tmp_path: Path) -> Path:
    config = tmp_path / "gw.yaml"
    config.write_text(
        json.dumps(
            {
                "server": {"shutdown_grace_s": 0.3},
                "store": {"url": f"sqlite:///{tmp_path}/gw.db", "spool_path": str(tmp_path)},
                "models": [
                    {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 15}]}
                ],
            }
        )
    )
    return config


async def load(port: int, outcomes: list[Outcome], enough: asyncio.Event) -> None:
    """Streams one after another until the gateway goes away."""
    body = {"model": "demo", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        while True:
            outcome = Outcome()
            outcomes.append(outcome)
            try:
                async with session.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions", json=body
                ) as response:
                    outcome.conversation = response.headers.get("X-Conversation-Id")
                    payload = await response.read()
                    outcome.completed = payload.endswith(b"data: [DONE]\n\n")
            except aiohttp.ClientError:
                return
            if sum(o.completed for o in outcomes) >= 3 * CLIENTS:
                enough.set()
            if not outcome.completed:
                return


def turns(db: Path) -> dict[str, dict[str, object]]:
    """Conversation id -> its turn/end payload (or {} when the turn never ended)."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT t.conversation_id, e.payload FROM turns t LEFT JOIN events e"
            " ON e.turn_id = t.id AND e.type = 'turn/end'"
        ).fetchall()
    return {cid: json.loads(payload) if payload else {} for cid, payload in rows}


async def run_load_then(
    sig: signal.Signals, tmp_path: Path, *, open_in_db: bool = False
) -> tuple[list[Outcome], int, Path, int]:
    """Streams from CLIENTS clients, then `sig` once enough have completed and one is in
    flight; `open_in_db`: also once the database holds an open turn (a stream's start reaches
    it on the journal's next commit, which a loaded machine can hold back past the moment a
    client has its first bytes)."""
    config = write_config(tmp_path)
    port = free_port()
    process = await start(config, port)
    outcomes: list[Outcome] = []
    enough = asyncio.Event()
    clients = [asyncio.create_task(load(port, outcomes, enough)) for _ in range(CLIENTS)]
    await asyncio.wait_for(enough.wait(), 60)
    async with asyncio.timeout(30):  # and a stream whose client has part of it
        while not any(o.conversation and not o.completed for o in outcomes):
            await asyncio.sleep(0.001)
        while open_in_db and all(turns(tmp_path / "gw.db").values()):
            await asyncio.sleep(0.005)
    process.send_signal(sig)
    code = await asyncio.wait_for(process.wait(), 30)
    await asyncio.wait_for(asyncio.gather(*clients), 30)
    return outcomes, code, config, port


async def test_sigterm_under_load_records_every_stream(tmp_path: Path) -> None:
    outcomes, code, _, _ = await run_load_then(signal.SIGTERM, tmp_path)
    assert code == 0
    recorded = turns(tmp_path / "gw.db")
    reached = [o for o in outcomes if o.conversation]
    in_flight = [o for o in reached if not o.completed]
    lost = [o for o in reached if not recorded.get(o.conversation or "")]
    wrong = [o for o in reached if o.completed and recorded[o.conversation or ""].get("status")
             != "completed"]  # fmt: skip
    cut = [recorded[o.conversation or ""] for o in in_flight]
    print(
        f"\nSIGTERM under {CLIENTS} streams: {len(reached)} requests, {len(in_flight)} in flight"
        f" at the signal, {len(recorded)} turns recorded, {len(lost)} lost"
    )
    assert not lost and not wrong
    assert in_flight, "the signal came while streams were running"
    assert all(
        (end.get("status"), end.get("reason")) in (("aborted", "shutdown"), ("completed", None))
        for end in cut
    ), cut


async def test_kill_9_under_load_loses_no_completed_turn(tmp_path: Path) -> None:
    outcomes, code, config, port = await run_load_then(signal.SIGKILL, tmp_path, open_in_db=True)
    assert code == -signal.SIGKILL
    recorded_before = turns(tmp_path / "gw.db")
    open_before = [cid for cid, end in recorded_before.items() if not end]
    # The restart (same host and port: the same instance) closes what its previous life left.
    process = await start(config, port)
    try:
        recorded = turns(tmp_path / "gw.db")
    finally:
        process.send_signal(signal.SIGTERM)
        await process.wait()
    reached = [o for o in outcomes if o.conversation]
    completed = [o for o in reached if o.completed]
    lost = [o for o in completed if recorded.get(o.conversation or "", {}).get("status")
            != "completed"]  # fmt: skip
    unended = [cid for cid, end in recorded.items() if not end]
    print(
        f"\nkill -9 under {CLIENTS} streams: {len(reached)} requests, {len(completed)} completed"
        f" for their clients, {len(open_before)} turns open at the kill,"
        f" {len(lost)} completed turns lost, {len(unended)} left open after the restart"
    )
    assert not lost and not unended
    assert open_before, "the kill came while streams were running"
    # Open in the database at the kill: a turn whose client saw its end had it in the journal,
    # and the restart put it in; the others were cut off by the kill.
    seen_whole = {o.conversation for o in completed}
    journaled = [cid for cid in open_before if cid in seen_whole]
    print(f"  {len(journaled)} of the turns open in the database were completed from the journal")
    assert all(recorded[cid].get("status") == "completed" for cid in journaled)
    assert all(
        recorded[cid].get("reason") == "crash_recovered"
        for cid in open_before
        if cid not in seen_whole
    )
    # A stream its client had begun to read is recorded, however young it was at the kill.
    part_seen = [o.conversation or "" for o in reached if not o.completed]
    assert part_seen and all(recorded[cid].get("reason") == "crash_recovered" for cid in part_seen)


async def test_kill_9_just_after_a_lone_streams_first_chunk_keeps_its_turn(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """No other turn ends to commit or journal this one's start, and the store holds a turn's
    start back for a moment to commit it with its end: the relay journals it before the
    client gets its first byte, so a kill right after cannot lose what the user sent."""
    # The answer stops after its first piece.
    first = sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi"}}]})
    upstream.push(frames(first, then="stall"))
    config = write_config(tmp_path)
    settings = json.loads(config.read_text())
    settings["models"] = [{"name": "demo", "deployments": [upstream.deployment()]}]
    config.write_text(json.dumps(settings))
    port = free_port()
    process = await start(config, port)
    body = {"model": "demo", "messages": [{"role": "user", "content": "keep me"}], "stream": True}
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as r:
            conversation = r.headers["X-Conversation-Id"]
            assert b'"Hi"' in await r.content.readline()  # the client has the first piece
            process.send_signal(signal.SIGKILL)
            assert await process.wait() == -signal.SIGKILL
    process = await start(config, port)  # the same instance: it puts its journal in first
    with sqlite3.connect(tmp_path / "gw.db") as db:
        events = db.execute(
            "SELECT type, payload FROM events WHERE conversation_id = ? ORDER BY seq",
            (conversation,),
        ).fetchall()
    process.send_signal(signal.SIGTERM)
    await process.wait()
    kinds = [t for t, _ in events]
    # With the piece delivered and checkpointed before the kill, the turn also keeps it.
    assert kinds in (
        ["user/message", "turn/end"],
        ["user/message", "assistant/message", "turn/end"],
    )
    assert json.loads(events[0][1])["content"] == "keep me"
    if len(kinds) == 3:
        assert json.loads(events[1][1])["content"] == [{"type": "text", "text": "Hi"}]
    assert json.loads(events[-1][1])["reason"] == "crash_recovered"
