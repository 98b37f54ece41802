"""Shutdown as the operator reads it: the access log says what the store recorded (a stream
cut at shutdown is `interrupted`, with the `shutdown` error its client got; an unknown model's
record names the model asked for), a request on a connection kept alive past SIGTERM gets a
503 with `Connection: close` rather than a reset, and under load the process is out within
`server.shutdown_grace_s` and a second."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import FakeUpstream, chunk
from tests.reliability.test_shutdown import SLOW, Stream, request_for, script
from tests.test_cli import free_port
from tests.test_process import start
from tests.test_reload import Log

GRACE_S = 2.0
STREAMS = 48
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


async def test_a_request_on_a_kept_alive_connection_after_sigterm_gets_503_and_close(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    upstream.push(script(upstream, asyncio.Event(), asyncio.Event()))
    config = write_config(tmp_path, upstream, grace_s=5)
    port = free_port()
    process = await start(config, port)
    log = Log(process)
    stream = Stream("chat", SLOW)  # keeps the process in its grace
    client = asyncio.create_task(stream.run(port))
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await asyncio.wait_for(stream.started.wait(), 30)
        writer.write(b"GET /v1/models HTTP/1.1\r\nHost: localhost\r\n\r\n")
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"Connection: close" not in head
        length = int(head.partition(b"Content-Length: ")[2].partition(b"\r\n")[0])
        await reader.readexactly(length)  # the connection is idle, kept alive

        process.send_signal(signal.SIGTERM)
        await log.wait_for("shutting down")
        _, body = request_for("chat", "after the signal")
        payload = json.dumps({**body, "stream": False}).encode()
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        answer = await asyncio.wait_for(reader.read(), 10)  # to the server's close
        assert process.returncode is None  # answered inside the grace, not at exit
    finally:
        writer.close()
        code = await asyncio.wait_for(process.wait(), 30)
        await asyncio.wait_for(client, 5)
        await log.reader
    assert code == 0
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer[:300]
    assert b"\r\nConnection: close" in head, head
    assert json.loads(rest)["error"]["code"] == "shutdown"


def busy(upstream: FakeUpstream) -> Any:
    """A stream that goes on for minutes, a piece every 50 ms (a model's pace)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = await upstream.start_sse(request)
        for i in range(100_000):
            await upstream.write(response, chunk(f"w{i} "))
            await asyncio.sleep(0.05)
        return response

    return answer


def exit_time(pid: int) -> float:
    """When the process `pid` ends, seen from a thread of its own: this test's event loop,
    busy with its clients, would notice it late."""
    try:  # WNOWAIT: asyncio's child watcher still collects it
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    except ChildProcessError:
        pass  # collected by the watcher at this same moment
    return time.monotonic()


async def read_stream(port: int, started: asyncio.Event) -> None:
    """A streaming client that reads to the end and parses nothing (the test's own process
    must not take the cores from the gateway's)."""
    _, body = request_for("chat", SLOW)
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with session.post(url, json=body) as response:
            assert response.status == 200
            try:
                async for _ in response.content.iter_any():
                    started.set()
            except aiohttp.ClientPayloadError:
                pass  # a client short of its last frames is reset at the cut


async def test_sigterm_under_load_exits_within_the_grace_and_a_second(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    streams = [asyncio.Event() for _ in range(STREAMS)]
    upstream.push(*[busy(upstream) for _ in streams])
    config = write_config(tmp_path, upstream)
    port = free_port()
    process = await start(config, port)
    log = Log(process)
    clients = [asyncio.create_task(read_stream(port, s)) for s in streams]
    stopping = asyncio.Event()

    async def keep_asking() -> None:
        """Requests on kept-alive connections until the gateway is gone: load to the end."""
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            body = {"model": "m", "messages": [{"role": "user", "content": "q"}], "stream": True}
            while not stopping.is_set():
                try:
                    async with session.post(url, json=body) as response:
                        await response.read()
                except aiohttp.ClientError:
                    await asyncio.sleep(0.01)

    askers = [asyncio.create_task(keep_asking()) for _ in range(4)]
    try:
        async with asyncio.timeout(60):
            await asyncio.gather(*(s.wait() for s in streams))
        ended = asyncio.get_running_loop().run_in_executor(None, exit_time, process.pid)
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(process.wait(), 30)
        exited = await ended - signalled
        stopping.set()
        await asyncio.wait_for(asyncio.gather(*clients, *askers, return_exceptions=True), 10)
    finally:
        stopping.set()
        if process.returncode is None:
            process.kill()
            await process.wait()
        await log.reader
    print(f"\nSIGTERM to exit under load, {STREAMS} streams, grace {GRACE_S:g} s: {exited:.2f} s")
    assert code == 0, "".join(log.lines[-20:])
    assert exited < BOUND_S, "".join(log.lines[-20:])
