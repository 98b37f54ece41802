"""Shutdown on time: SIGTERM lets streams run for `server.shutdown_grace_s`, then cuts the
ones still open with their dialect's `shutdown` error event, records each as an interrupted
answer holding exactly what its client received, and exits within the grace and a second,
alone or as `serve --workers 2`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import DONE, FakeUpstream, chunk
from tests.test_cli import free_port
from tests.test_process import start

GRACE_S = 2.0
BOUND_S = GRACE_S + 1.0
SLOW = "slow"  # the question of a stream that would outlast the grace
QUICK = "quick"  # ... of one that finishes inside it, once the test lets it
HANG = "hang"  # ... of a non-streaming request whose upstream never answers
FLOOD = "flood"  # ... of a stream sent faster than its client reads it


def write_config(tmp_path: Path, upstream: FakeUpstream) -> Path:
    config = tmp_path / "gw.yaml"
    config.write_text(
        json.dumps(
            {
                "server": {"shutdown_grace_s": GRACE_S},
                "store": {"url": f"sqlite:///{tmp_path}/gw.db", "spool_path": str(tmp_path)},
                "models": [{"name": "m", "deployments": [upstream.deployment()]}],
            }
        )
    )
    return config


def script(upstream: FakeUpstream, finish: asyncio.Event, hung: asyncio.Event) -> Any:
    """A slow answer: a piece of text every 50 ms for a minute; for the quick question, one
    piece, then the rest and the end once `finish` is set; for the hanging one, nothing
    (`hung` is set)."""

    async def answer(request: web.Request) -> web.StreamResponse:
        question = upstream.question(await request.json())
        if question == HANG:
            hung.set()
            await upstream.stall()
        response = await upstream.start_sse(request)
        if question == FLOOD:  # megabytes more than the socket buffers between hold
            for i in range(8000):
                await upstream.write(response, chunk(f"{i:04d}" + "x" * 996))
            await upstream.stall()
        if question == QUICK:
            await upstream.write(response, chunk("first "))
            await finish.wait()
            await upstream.write(response, chunk("and last.") + chunk(finish="stop") + DONE)
            await response.write_eof()
            return response
        for i in range(1200):
            await upstream.write(response, chunk(f"w{i} "))
            await asyncio.sleep(0.05)
        await upstream.write(response, chunk(finish="stop") + DONE)
        await response.write_eof()
        return response

    return answer


# -- the three dialects: the request, and what a client reads of the answer --------------------


def request_for(dialect: str, question: str) -> tuple[str, dict[str, Any]]:
    if dialect == "chat":
        messages = [{"role": "user", "content": question}]
        return "/v1/chat/completions", {"model": "m", "messages": messages, "stream": True}
    if dialect == "messages":
        messages = [{"role": "user", "content": question}]
        body = {"model": "m", "max_tokens": 500, "messages": messages, "stream": True}
        return "/v1/messages", body
    return "/v1/responses", {"model": "m", "input": question, "stream": True}


def sse_events(body: bytes) -> list[tuple[str | None, Any]]:
    """(event name, parsed data) of each SSE event; `[DONE]` as the string."""
    out: list[tuple[str | None, Any]] = []
    for frame in body.split(b"\n\n"):
        name, data = None, None
        for line in frame.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                raw = line[6:]
                data = raw.decode() if raw == b"[DONE]" else json.loads(raw)
        if data is not None:
            out.append((name, data))
    return out


def text_received(dialect: str, events: list[tuple[str | None, Any]]) -> str:
    """The answer's text as the client's SDK would show it."""
    text = ""
    for name, data in events:
        if dialect == "chat" and isinstance(data, dict) and data.get("choices"):
            text += data["choices"][0]["delta"].get("content") or ""
        elif dialect == "messages" and name == "content_block_delta":
            text += data["delta"].get("text", "")
        elif dialect == "responses" and name == "response.output_text.delta":
            text += data["delta"]
    return text


def is_shutdown_event(dialect: str, event: tuple[str | None, Any]) -> bool:
    name, data = event
    if dialect == "chat":  # as the OpenAI SDKs read an in-stream error: a data event
        error = data.get("error") if name is None and isinstance(data, dict) else None
        return error is not None and (error["type"], error["code"]) == ("shutdown", "shutdown")
    if dialect == "messages":
        return name == "error" and data["type"] == "error" and data["error"]["type"] == "shutdown"
    response = data.get("response", {}) if isinstance(data, dict) else {}
    return (
        name == "response.failed"
        and response.get("status") == "failed"
        and response["error"]["code"] == "shutdown"
    )


@dataclass
class Stream:
    dialect: str
    question: str
    body: bytes = b""
    conversation: str = ""
    started: asyncio.Event = field(default_factory=asyncio.Event)  # content has arrived
    ended_at: float = 0.0  # when its body ended

    async def run(self, port: int) -> None:
        path, payload = request_for(self.dialect, self.question)
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}{path}", json=payload) as response:
                assert response.status == 200, await response.text()
                self.conversation = response.headers["X-Conversation-Id"]
                # A truncated body raises ClientPayloadError here: the stream must end cleanly.
                async for piece in response.content.iter_any():
                    self.body += piece
                    if text_received(self.dialect, sse_events(self.body)):
                        self.started.set()
        self.ended_at = time.monotonic()

    @property
    def events(self) -> list[tuple[str | None, Any]]:
        return sse_events(self.body)


async def answer_of(port: int, question: str) -> tuple[int, dict[str, Any], str]:
    """A non-streaming chat request: its status, its error, its conversation."""
    _, payload = request_for("chat", question)
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        async with session.post(url, json={**payload, "stream": False}) as response:
            body = await response.json()
            conversation = response.headers.get("X-Conversation-Id", "")
            return response.status, body.get("error", {}), conversation


async def drain(stream: asyncio.StreamReader | None, lines: list[bytes]) -> None:
    """Keep reading a process's stderr (so it never blocks on a full pipe), for the report."""
    assert stream is not None
    while line := await stream.readline():
        lines.append(line)


async def stop_and_time(process: asyncio.subprocess.Process) -> tuple[int, float]:
    """SIGTERM, then the exit code and the seconds from the signal to the exit."""
    signalled = time.monotonic()
    process.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(process.wait(), 30)
    return code, time.monotonic() - signalled


async def test_sigterm_cuts_streams_at_the_deadline_records_them_and_exits_on_time(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    finish, hung = asyncio.Event(), asyncio.Event()
    upstream.push(*[script(upstream, finish, hung) for _ in range(5)])
    config = write_config(tmp_path, upstream)
    port = free_port()
    process = await start(config, port)
    logged: list[bytes] = []
    reader = asyncio.create_task(drain(process.stderr, logged))
    slow = [Stream(dialect, SLOW) for dialect in ("chat", "messages", "responses")]
    quick = Stream("chat", QUICK)
    clients = [asyncio.create_task(s.run(port)) for s in (*slow, quick)]
    waiting = asyncio.create_task(answer_of(port, HANG))
    try:
        async with asyncio.timeout(30):  # every client has part of its answer
            await asyncio.gather(*(s.started.wait() for s in (*slow, quick)), hung.wait())
        signalled = time.monotonic()
        process.send_signal(signal.SIGTERM)
        finish.set()  # the quick answer ends now, well inside the grace
        code = await asyncio.wait_for(process.wait(), 30)
        exited = time.monotonic() - signalled
        await asyncio.wait_for(asyncio.gather(*clients), 5)
        status, error, hung_conversation = await asyncio.wait_for(waiting, 5)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await reader
    print(f"\nSIGTERM to exit, grace {GRACE_S:g} s: {exited:.2f} s")
    assert code == 0, b"".join(logged).decode()
    assert exited < BOUND_S, b"".join(logged).decode()

    # The quick stream finished as usual; the slow ones ran until the deadline, then each got
    # its dialect's shutdown event as the last event before the close.
    assert quick.events[-1] == (None, "[DONE]")
    assert text_received("chat", quick.events) == "first and last."
    assert not any(b"shutdown" in f for f in quick.body.split(b"\n\n"))
    for stream in slow:
        assert stream.ended_at - signalled >= GRACE_S - 0.05, stream.dialect
        assert is_shutdown_event(stream.dialect, stream.events[-1]), stream.body[-400:]
        assert not any(is_shutdown_event(stream.dialect, e) for e in stream.events[:-1])
        assert (None, "[DONE]") not in stream.events
    # A non-streaming request still waiting at the deadline: a 503 it may retry elsewhere.
    assert (status, error["code"]) == (503, "shutdown"), error

    # Each turn is recorded as an interrupted answer holding exactly what its client got.
    process = await start(config, port)
    reader = asyncio.create_task(drain(process.stderr, []))
    try:
        async with aiohttp.ClientSession() as session:
            for stream in (*slow, quick):
                url = f"http://127.0.0.1:{port}/v1/conversations/{stream.conversation}/events"
                async with session.get(url) as response:
                    assert response.status == 200
                    recorded = (await response.json())["data"]
                kinds = [e["type"] for e in recorded]
                assert kinds == ["user/message", "assistant/message", "turn/end"], kinds
                message, end = recorded[1]["payload"], recorded[2]["payload"]
                received = text_received(stream.dialect, stream.events)
                assert message["content"] == [{"type": "text", "text": received}], stream.dialect
                if stream is quick:
                    assert not message.get("interrupted") and end["status"] == "completed"
                else:
                    assert message["interrupted"] is True
                    assert (end["status"], end["reason"]) == ("aborted", "shutdown")
            url = f"http://127.0.0.1:{port}/v1/conversations/{hung_conversation}/events"
            async with session.get(url) as response:
                end = (await response.json())["data"][-1]
            assert end["type"] == "turn/end", end
            assert (end["payload"]["status"], end["payload"]["reason"]) == ("aborted", "shutdown")
    finally:
        code, _ = await stop_and_time(process)
        await reader
    assert code == 0


async def test_workers_exit_within_the_grace_and_a_second(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    streams = [Stream("chat", SLOW) for _ in range(4)]
    upstream.push(*[script(upstream, asyncio.Event(), asyncio.Event()) for _ in streams])
    config = write_config(tmp_path, upstream)
    port = free_port()
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        "--port", str(port), "--workers", "2",
        stderr=asyncio.subprocess.PIPE,
        env={**{k: v for k, v in os.environ.items() if k != "GATEWAY_MASTER_KEY"},
             "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    logged: list[bytes] = []
    reader = asyncio.create_task(drain(supervisor.stderr, logged))
    try:
        async with asyncio.timeout(60):  # both workers listen
            while sum(b"listening on" in line for line in logged) < 2:
                assert supervisor.returncode is None, b"".join(logged).decode()
                await asyncio.sleep(0.05)
        clients = [asyncio.create_task(s.run(port)) for s in streams]
        async with asyncio.timeout(30):
            await asyncio.gather(*(s.started.wait() for s in streams))
        code, exited = await stop_and_time(supervisor)
        await asyncio.wait_for(asyncio.gather(*clients), 5)
    finally:
        if supervisor.returncode is None:
            supervisor.kill()
            await supervisor.wait()
        await reader
    print(f"\nSIGTERM to exit, serve --workers 2, grace {GRACE_S:g} s: {exited:.2f} s")
    assert code == 0, b"".join(logged).decode()
    assert GRACE_S <= exited < BOUND_S, b"".join(logged).decode()
    for stream in streams:  # cut by whichever worker served it, at its deadline
        assert is_shutdown_event("chat", stream.events[-1]), stream.body[-400:]


def dechunked(raw: bytes) -> bytes:
    """The body of a raw HTTP/1.1 response with chunked transfer encoding, however cut."""
    body = raw.partition(b"\r\n\r\n")[2]
    out = b""
    while body:
        size_line, found, rest = body.partition(b"\r\n")
        if not found or not (size := int(size_line, 16)):
            break
        out += rest[:size]
        body = rest[size + 2 :]
    return out


async def test_a_client_that_stopped_reading_keeps_what_it_acknowledged(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    """Its stream cannot take the shutdown event: at the deadline its connection is reset,
    so what was queued for it never arrives, and the turn holds exactly what it did get."""
    upstream.push(script(upstream, asyncio.Event(), asyncio.Event()))
    config = write_config(tmp_path, upstream)
    port = free_port()
    process = await start(config, port)
    reader = asyncio.create_task(drain(process.stderr, []))
    loop = asyncio.get_running_loop()
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # full after a few frames
    client.setblocking(False)
    raw = b""
    try:
        await loop.sock_connect(client, ("127.0.0.1", port))
        body = json.dumps(request_for("chat", FLOOD)[1]).encode()
        head = (
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
        )
        await loop.sock_sendall(client, head.encode() + body)
        while b'"0000x' not in raw:  # the first piece; then the client stops reading
            raw += await loop.sock_recv(client, 65536)
        code, exited = await stop_and_time(process)
        reset = False
        try:  # what its kernel has, then the reset
            while piece := await loop.sock_recv(client, 65536):
                raw += piece
        except ConnectionResetError:
            reset = True
    finally:
        client.close()
        if process.returncode is None:
            process.kill()
            await process.wait()
        await reader
    print(f"\nSIGTERM to exit, a client not reading, grace {GRACE_S:g} s: {exited:.2f} s")
    assert code == 0 and exited < BOUND_S
    assert reset, "the connection ends with a reset, not after what was still queued"
    conversation = raw.partition(b"X-Conversation-Id: ")[2].partition(b"\r\n")[0].decode()
    whole_frames = dechunked(raw).rpartition(b"\n\n")[0] + b"\n\n"
    received = text_received("chat", sse_events(whole_frames))
    assert received.startswith("0000x") and "0001x" in received  # a few pieces

    process = await start(config, port)
    reader = asyncio.create_task(drain(process.stderr, []))
    try:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/conversations/{conversation}/events"
            async with session.get(url) as response:
                recorded = (await response.json())["data"]
    finally:
        code, _ = await stop_and_time(process)
        await reader
    assert [e["type"] for e in recorded] == ["user/message", "assistant/message", "turn/end"], [
        (e["type"], str(e["payload"])[:300]) for e in recorded
    ]
    message, end = recorded[1]["payload"], recorded[2]["payload"]
    assert (end["status"], end["reason"]) == ("aborted", "shutdown")
    assert message["interrupted"] is True and message["delivery"] == "acked"
    assert message["content"] == [{"type": "text", "text": received}]
