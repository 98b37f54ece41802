"""After `kill -9`, every turn that was streaming is closed with what its client had been
delivered, and metered: by the same instance when it starts again, or by another replica once
the dead one's heartbeat is stale (docs/operations.md, "Stopping and crashing")."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from gateway.conversations.recovery import checkpoint_of
from tests.fakes import DONE, FakeUpstream, chunk, paused
from tests.postgres_server import PostgresServer, throwaway_postgres
from tests.test_cli import free_port
from tests.test_process import start

PRICE = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
BODY = {"model": "m", "messages": [{"role": "user", "content": "tell me"}], "stream": True}


def write_config(path: Path, store: dict[str, Any], deployment: dict[str, Any]) -> Path:
    path.write_text(
        json.dumps(
            {
                "store": store,
                "models": [{"name": "m", "deployments": [{**deployment, "price": PRICE}]}],
            }
        )
    )
    return path


class Reader:
    """One client's stream: the text it has received, read as it arrives."""

    def __init__(self) -> None:
        self.text = ""
        self.conversation = ""
        self.answer_id = ""  # the chunks' id
        self.moved = asyncio.Event()  # more text came

    async def read(self, session: aiohttp.ClientSession, url: str) -> None:
        try:
            async with session.post(url + "/v1/chat/completions", json=BODY) as response:
                self.conversation = response.headers["X-Conversation-Id"]
                async for line in response.content:
                    if not line.startswith(b"data: {"):
                        continue
                    chunk = json.loads(line[6:])
                    self.answer_id = chunk["id"]
                    for choice in chunk["choices"]:
                        self.text += choice["delta"].get("content") or ""
                    self.moved.set()
        except aiohttp.ClientError:
            pass  # the gateway died under it

    async def until(self, text: str) -> None:
        async with asyncio.timeout(20):
            while self.text != text:
                self.moved.clear()
                await self.moved.wait()


def stored_events(db: Path, conversation: str) -> list[tuple[str, dict[str, Any]]]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT type, payload FROM events WHERE conversation_id = ? ORDER BY seq",
            (conversation,),
        ).fetchall()
    return [(kind, json.loads(payload)) for kind, payload in rows]


def text_of(payload: dict[str, Any]) -> str:
    return "".join(b.get("text", "") for b in payload["content"] if b["type"] == "text")


def stored_checkpoints(db: Path) -> dict[str, dict[str, Any]]:
    """Each open turn's checkpoint in the store, by conversation: its row and its parts, as
    recovery reads them."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT turn_id, conversation_id, body FROM turn_checkpoints"
        ).fetchall()
        parts = connection.execute(
            "SELECT turn_id, body FROM turn_checkpoint_parts ORDER BY turn_id, seq"
        ).fetchall()
    return {c: checkpoint_of(b, [p for t, p in parts if t == turn]) for turn, c, b in rows}


async def checkpointed(db: Path, texts: dict[str, str]) -> None:
    """Until the store's checkpoint of each conversation's turn holds exactly its text."""

    def done() -> bool:
        held = {c: checkpoint["message"] for c, checkpoint in stored_checkpoints(db).items()}
        return all(held.get(c) and text_of(held[c]) == t for c, t in texts.items())

    async with asyncio.timeout(20):
        while not done():
            await asyncio.sleep(0.02)


async def test_a_restart_closes_each_killed_stream_with_its_delivered_text(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    answers = [[f"s{i}p{j} " for j in range(2 + 2 * i)] for i in range(4)]
    for parts in answers:
        upstream.stall_after(parts)
    db = tmp_path / "gw.db"
    store = {"url": f"sqlite:///{db}", "spool_path": str(tmp_path / "spool")}
    config = write_config(tmp_path / "gw.yaml", store, upstream.deployment())
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = await start(config, port)
    readers = [Reader() for _ in answers]
    async with aiohttp.ClientSession() as session:
        tasks = []
        for reader, parts in zip(readers, answers, strict=True):
            # One at a time: each request takes the next script the fake upstream holds.
            tasks.append(asyncio.create_task(reader.read(session, url)))
            await reader.until("".join(parts))
        await checkpointed(db, {r.conversation: r.text for r in readers})
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL
        await asyncio.gather(*tasks)
    process = await start(config, port)  # the same instance
    process.send_signal(signal.SIGTERM)
    await process.wait()
    for reader, parts in zip(readers, answers, strict=True):
        events = stored_events(db, reader.conversation)
        assert [kind for kind, _ in events] == ["user/message", "assistant/message", "turn/end"]
        message, end = events[1][1], events[2][1]
        assert message["interrupted"] is True
        assert text_of(message) == reader.text == "".join(parts)
        assert end["status"] == "aborted" and end["reason"] == "crash_recovered"
        assert end["response_id"] == reader.answer_id  # it still finds the conversation
        metered = end["metered"]
        assert metered["completion_delivered"] > 0 and metered["prompt_tokens"] > 0
        assert metered["usage_source"] == "estimated_lower_bound"
        assert metered["cost_usd"] > 0
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT conversation_id, status, completion_delivered FROM usage"
        ).fetchall()
        left = connection.execute("SELECT count(*) FROM turn_checkpoints").fetchone()[0]
        parts = connection.execute("SELECT count(*) FROM turn_checkpoint_parts").fetchone()[0]
    assert sorted(c for c, _, _ in rows) == sorted(r.conversation for r in readers)
    assert all(status == "interrupted" and tokens > 0 for _, status, tokens in rows)
    assert left == parts == 0


async def test_a_recovered_prefix_never_holds_more_than_the_client_received(
    tmp_path: Path,
) -> None:
    """Streams still moving when the process dies: what each turn keeps is a prefix of what its
    client got (checkpoints lag, never lead)."""
    db = tmp_path / "gw.db"
    store = {"url": f"sqlite:///{db}", "spool_path": str(tmp_path / "spool")}
    config = write_config(tmp_path / "gw.yaml", store, {"provider": "demo", "chunk_delay_ms": 10})
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = await start(config, port)
    readers = [Reader() for _ in range(4)]
    async with aiohttp.ClientSession() as session:
        tasks = [asyncio.create_task(r.read(session, url)) for r in readers]
        # Each client has part of its answer and the store a checkpoint of each stream.
        async with asyncio.timeout(20):
            while not all(len(r.text) > 40 for r in readers):
                await asyncio.sleep(0.01)
        await checkpointed_any(db, len(readers))
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL
        await asyncio.gather(*tasks)
    process = await start(config, port)
    process.send_signal(signal.SIGTERM)
    await process.wait()
    for reader in readers:
        events = dict(stored_events(db, reader.conversation))
        assert events["turn/end"]["reason"] == "crash_recovered"
        kept = text_of(events["assistant/message"])
        assert kept and reader.text.startswith(kept)


async def checkpointed_any(db: Path, turns: int) -> None:
    async with asyncio.timeout(20):
        while True:
            checkpoints = stored_checkpoints(db).values()
            if sum(c["message"] is not None for c in checkpoints) >= turns:
                return
            await asyncio.sleep(0.02)


async def serve(config: Path, port: int) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port),
        stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "GATEWAY_MASTER_KEY": ""},
    )  # fmt: skip
    async with asyncio.timeout(60), aiohttp.ClientSession() as session:
        while True:
            try:
                async with session.get(f"http://127.0.0.1:{port}/health/ready") as response:
                    if response.status == 200:
                        return process
            except aiohttp.ClientError:
                pass
            assert process.returncode is None, "the replica exited at start"
            await asyncio.sleep(0.05)


async def test_a_peer_closes_a_dead_replicas_stream_within_the_recovery_bound(
    tmp_path: Path, upstream: FakeUpstream, postgres: PostgresServer
) -> None:
    recovery_s = 3.0
    parts = ["one ", "two ", "three "]
    upstream.stall_after(parts)
    store = {"url": postgres.create_database(), "recovery_s": recovery_s}
    configs = [
        write_config(
            tmp_path / f"r{n}.yaml",
            {**store, "spool_path": str(tmp_path / f"spool{n}")},
            upstream.deployment(),
        )
        for n in (1, 2)
    ]
    ports = [free_port(), free_port()]
    doomed, peer = [await serve(c, p) for c, p in zip(configs, ports, strict=True)]
    reader = Reader()
    try:
        async with aiohttp.ClientSession() as session:
            task = asyncio.create_task(reader.read(session, f"http://127.0.0.1:{ports[0]}"))
            await reader.until("".join(parts))
            events_url = f"http://127.0.0.1:{ports[1]}/v1/conversations/{reader.conversation}"
            await postgres_checkpointed(postgres, store["url"], reader.text)
            # Its start is stored too (written apart from the checkpoint, and a kill before
            # that write leaves nothing to close).
            await beaten_since(store["url"], 0, replicas=2, turns=1)
            doomed.send_signal(signal.SIGKILL)
            await doomed.wait()
            killed = time.monotonic()
            await task
            # The peer closes it: within the bound of the last heartbeat, so of the kill.
            async with asyncio.timeout(recovery_s + 5):
                while True:
                    async with session.get(events_url + "/events") as response:
                        events = (await response.json())["data"]
                    if any(e["type"] == "turn/end" for e in events):
                        break
                    await asyncio.sleep(0.1)
            closed_after = time.monotonic() - killed
    finally:
        for process in (doomed, peer):
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
                await process.wait()
    kinds = [e["type"] for e in events]
    assert kinds == ["user/message", "assistant/message", "turn/end"]
    assert text_of(events[1]["payload"]) == reader.text == "".join(parts)
    assert events[2]["payload"]["reason"] == "crash_recovered"
    assert events[2]["payload"]["metered"]["completion_delivered"] > 0
    # Two missed heartbeats and one sweep: the configured bound, with the test's own
    # polling and a loaded machine's scheduling on top.
    assert closed_after < recovery_s + 2, closed_after


async def postgres_checkpointed(postgres: PostgresServer, url: str, text: str) -> None:
    import asyncpg  # type: ignore[import-untyped]

    connection = await asyncpg.connect(url)
    try:
        async with asyncio.timeout(20):
            while True:
                parts = await connection.fetch(
                    "SELECT turn_id, body FROM turn_checkpoint_parts ORDER BY turn_id, seq"
                )
                rows = await connection.fetch("SELECT turn_id, body FROM turn_checkpoints")
                messages = [
                    checkpoint_of(r["body"], [p["body"] for p in parts if p[0] == r[0]])["message"]
                    for r in rows
                ]
                if any(m and text_of(m) == text for m in messages):
                    return
                await asyncio.sleep(0.02)
    finally:
        await connection.close()


async def test_a_replica_silent_through_a_store_outage_keeps_its_stream(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """When PostgreSQL comes back, every replica's last heartbeat is old, the living ones' too:
    the first replica back gives the others two beats of its own before it takes their turns.
    A replica held still through the outage (SIGSTOP) and resumed at the first beat back keeps
    its stream, which ends as it would have, once."""
    recovery_s = 9.0  # a beat every 3 s; a peer is dead after 6 s of watching
    beat_s = recovery_s / 3
    upstream.push(
        paused([chunk("one "), chunk("two ")], [chunk("three"), chunk(finish="stop"), DONE])
    )
    with throwaway_postgres("gw-pg-outage-") as postgres:
        store = {"url": postgres.create_database(), "recovery_s": recovery_s}
        ports = [free_port(), free_port()]
        runner, watcher = [
            await serve(
                write_config(
                    tmp_path / f"r{n}.yaml",
                    {**store, "spool_path": str(tmp_path / f"spool{n}")},
                    upstream.deployment(),
                ),
                port,
            )
            for n, port in enumerate(ports)
        ]
        reader = Reader()
        try:
            async with aiohttp.ClientSession() as session:
                task = asyncio.create_task(reader.read(session, f"http://127.0.0.1:{ports[0]}"))
                await reader.until("one two ")
                await postgres_checkpointed(postgres, store["url"], "one two ")
                await beaten_since(store["url"], 0, replicas=2, turns=1)  # the turn is stored
                runner.send_signal(signal.SIGSTOP)
                await asyncio.to_thread(postgres.stop)
                # An outage longer than a peer may be silent: every last beat is stale after it.
                await asyncio.sleep(2 * beat_s + 1)
                await asyncio.to_thread(postgres.start)
                back = time.time()
                await beaten_since(store["url"], back, replicas=1)  # the watcher's first beat
                runner.send_signal(signal.SIGCONT)
                await beaten_since(store["url"], back, replicas=2)
                upstream.release.set()
                await task
                events_url = f"http://127.0.0.1:{ports[1]}/v1/conversations/{reader.conversation}"
                async with asyncio.timeout(30):
                    while True:
                        async with session.get(events_url + "/events") as response:
                            events = (await response.json()).get("data", [])
                        if any(e["type"] == "turn/end" for e in events):
                            break
                        await asyncio.sleep(0.1)
        finally:
            for process in (runner, watcher):
                if process.returncode is None:
                    process.send_signal(signal.SIGCONT)
                    process.send_signal(signal.SIGTERM)
                    await process.wait()
    assert reader.text == "one two three"
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    assert text_of(events[1]["payload"]) == "one two three"
    assert not events[1]["payload"]["interrupted"]
    assert events[2]["payload"]["status"] == "completed"


async def beaten_since(url: str, since: float, replicas: int, turns: int = 0) -> None:
    """Until `replicas` replicas have heartbeat at or after `since` (and the store holds
    `turns` turns)."""
    import asyncpg

    async with asyncio.timeout(30):
        while True:
            try:
                connection = await asyncpg.connect(url)
            except (OSError, asyncpg.PostgresError):
                await asyncio.sleep(0.05)
                continue
            try:
                count = await connection.fetchval(
                    "SELECT COUNT(*) FROM instances WHERE heartbeat_at >= $1", since
                )
                stored = await connection.fetchval("SELECT COUNT(*) FROM turns")
            finally:
                await connection.close()
            if count >= replicas and stored >= turns:
                return
            await asyncio.sleep(0.05)
