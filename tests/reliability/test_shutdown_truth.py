"""Shutdown as the operator reads it: the access log says what the store recorded (a stream
cut at shutdown is `interrupted`, with the `shutdown` error its client got; an unknown model's
record names the model asked for)."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp

from tests.fakes import FakeUpstream
from tests.reliability.test_shutdown import SLOW, Stream, script
from tests.test_cli import free_port
from tests.test_process import start
from tests.test_reload import Log

GRACE_S = 2.0
STREAMS = 256
BOUND_S = GRACE_S + 1.0


def write_config(tmp_path: Path, upstream: FakeUpstream, grace_s: float = GRACE_S) -> Path:
    config = tmp_path / "gw.yaml"
    config.write_text(
        json.dumps(
            {
                "server": {"shutdown_grace_s": grace_s},
                "store": {"url": f"sqlite:///{tmp_path}/gw.db", "spool_path": str(tmp_path)},
                "logging": {"format": "json"},
                "models": [{"name": "m", "deployments": [upstream.deployment()]}],
            }
        )
    )
    return config


def access_records(lines: list[str]) -> list[dict[str, Any]]:
    records = [json.loads(line) for line in lines if line.startswith("{")]
    return [r for r in records if r.get("logger") == "gateway.access"]


def turn_ends(db: Path) -> dict[str, dict[str, Any]]:
    """Each conversation's `turn/end` payload."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT conversation_id, payload FROM events WHERE type = ?", ("turn/end",)
        )
        return {c: json.loads(p) for c, p in rows}


async def test_the_access_log_says_what_the_store_recorded(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    upstream.push(script(upstream, asyncio.Event(), asyncio.Event()))
    config = write_config(tmp_path, upstream, grace_s=0.5)
    port = free_port()
    process = await start(config, port)
    log = Log(process)
    stream = Stream("chat", SLOW)
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            body = {"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]}
            async with session.post(url, json=body) as response:
                assert response.status == 404
        client = asyncio.create_task(stream.run(port))
        await asyncio.wait_for(stream.started.wait(), 30)
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
        await asyncio.wait_for(client, 5)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await log.reader
    records = access_records(log.lines)
    [unknown] = [r for r in records if r["status"] == 404]
    assert (unknown["alias"], unknown["error"]) == ("no-such-model", "model_not_found")

    end = turn_ends(tmp_path / "gw.db")[stream.conversation]
    assert (end["status"], end["reason"]) == ("aborted", "shutdown")
    [cut] = [r for r in records if r["conversation_id"] == stream.conversation]
    assert cut["status"] == 200  # what the client was sent: the stream had begun
    assert (cut["interrupted"], cut["error"], cut["alias"]) == (True, "shutdown", "m"), cut
