"""Process faults: SIGTERM drains and records, kill -9 is recovered at the next start."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.test_cli import free_port


async def start(config: Path, port: int) -> asyncio.subprocess.Process:
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "gateway",
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        stderr=asyncio.subprocess.PIPE,
        env={
            **{k: v for k, v in os.environ.items() if k != "GATEWAY_MASTER_KEY"},
            "PYTHONUNBUFFERED": "1",
        },
    )
    assert process.stderr is not None
    async with asyncio.timeout(30):
        while b"listening on" not in (line := await process.stderr.readline()):
            assert line, "the gateway exited before listening"
    return process


def write_config(tmp_path: Path, grace: float = 10) -> Path:
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"server: {{shutdown_grace_s: {grace}}}\n"
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db'}}\n"
        "models: [{name: demo, deployments: [{provider: demo, chunk_delay_ms: 100}]}]\n"
    )
    return config


def events(db: Path) -> list[tuple[str, dict[str, Any]]]:
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT type, payload FROM events ORDER BY conversation_id, seq")
        return [(kind, json.loads(payload)) for kind, payload in rows]


def text_of(body: bytes) -> str:
    out = ""
    for frame in body.split(b"\n\n"):
        if frame.startswith(b"data: {"):
            choices = json.loads(frame[6:]).get("choices")
            if choices:
                out += choices[0]["delta"].get("content") or ""
    return out


async def test_sigterm_lets_streams_go_then_records_them_as_shutdown(tmp_path: Path) -> None:
    port = free_port()
    process = await start(write_config(tmp_path, grace=0.3), port)
    body = b""
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={
                    "model": "demo",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                },
            ) as response:
                body += await response.content.readany()
                process.send_signal(signal.SIGTERM)
                try:
                    async for piece in response.content.iter_any():
                        body += piece
                except aiohttp.ClientPayloadError:
                    pass  # the stream was cut when the grace period ran out
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    recorded = events(tmp_path / "gw.db")
    assert [kind for kind, _ in recorded] == ["user/message", "assistant/message", "turn/end"]
    message, end = recorded[1][1], recorded[2][1]
    assert message["interrupted"] is True
    assert message["content"][0]["text"] == text_of(body)  # exactly what this client received
    assert (end["status"], end["reason"]) == ("aborted", "shutdown")


async def test_kill_9_leaves_a_turn_that_the_next_start_closes(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    port = free_port()
    process = await start(config, port)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{port}/v1/chat/completions",
                json={
                    "model": "demo",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": True,
                },
            ) as response:
                await response.content.readany()
                process.kill()
                await process.wait()
    except aiohttp.ClientError:
        pass
    assert [kind for kind, _ in events(tmp_path / "gw.db")] == ["user/message"]
    # The restart (same host and port: the same instance) knows its previous life is over.
    again = await start(config, port)
    try:
        recorded = events(tmp_path / "gw.db")
        assert [kind for kind, _ in recorded] == ["user/message", "turn/end"]
        assert (recorded[1][1]["status"], recorded[1][1]["reason"]) == (
            "aborted",
            "crash_recovered",
        )
        # And counted, for the alert on crash recoveries.
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                scraped = await response.text()
        assert 'gateway_turns_total{reason="crash_recovered",status="aborted"} 1.0' in scraped, (
            scraped
        )
    finally:
        again.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(again.wait(), 30) == 0


async def test_a_burst_of_new_connections_waits_for_a_busy_gateway(tmp_path: Path) -> None:
    """Clients that connect while the gateway is too busy to accept them are held by the
    kernel until it does (up to 1,024 of them), not dropped: a dropped connection's client
    tries again only a second later, then two, then four."""
    process = await start(write_config(tmp_path), port := free_port())
    burst = 400  # past aiohttp's own default of 128
    try:
        process.send_signal(signal.SIGSTOP)
        try:
            # A connection the kernel did not queue is retried after a second: not within 0.9.
            opened = await asyncio.gather(
                *(
                    asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 0.9)
                    for _ in range(burst)
                ),
                return_exceptions=True,
            )
        finally:
            process.send_signal(signal.SIGCONT)
        connected = [pair for pair in opened if isinstance(pair, tuple)]
        assert len(connected) == burst
        for _, writer in connected:
            writer.write(b"GET /health/live HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n")
        answers = await asyncio.gather(*(reader.read() for reader, _ in connected))
        assert all(answer.startswith(b"HTTP/1.1 200") for answer in answers)
    finally:
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
