"""A client that stops reading a stream without closing it (LlamaIndex `aclose()`, smolagents
`close()`): past `server.client_idle_timeout_s` with nothing acknowledged, its connection is
reset and the turn recorded as interrupted at exactly what its side received
(docs/recording.md, "How a turn ends")."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

from gateway.downstream.idle_readers import IdleReaderWatch
from tests.client_bytes import dechunk
from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream

PARTS = [f"word{i:05d} " for i in range(20_000)]  # far more than the client's window


def frames_text(body: bytes) -> str:
    """The text of the complete chat chunks in a chunked SSE body."""
    text = ""
    for frame in dechunk(body).split(b"\n\n")[:-1]:  # after the last blank line: torn
        if frame.startswith(b"data: {"):
            choices = json.loads(frame[6:])["choices"]
            text += choices[0]["delta"].get("content") or "" if choices else ""
    return text


def request_bytes(port: int, body: dict[str, Any]) -> bytes:
    raw = json.dumps(body).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: localhost:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


async def test_a_client_that_stops_reading_is_recorded_at_what_it_received(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(upstream=upstream, server={"client_idle_timeout_s": 0.3})
    upstream.text(PARTS)
    body = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "Count."}]}
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window fills at once
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    port = gw.server.port
    assert port is not None
    await loop.sock_connect(sock, ("127.0.0.1", port))
    await loop.sock_sendall(sock, request_bytes(port, body))
    received = b""
    while b"\r\n\r\n" not in received or b"word00001" not in received:
        received += await loop.sock_recv(sock, 1024)
    head = received.partition(b"\r\n\r\n")[0].decode()
    conversation_id = next(
        line.split(": ", 1)[1]
        for line in head.split("\r\n")
        if line.startswith("X-Conversation-Id")
    )
    # Now the client reads nothing more, and does not close: the gateway must give up on it.
    recorded = await gw.wait_turn_end(conversation_id, timeout=15)
    end = recorded[-1]["payload"]
    assert (end["status"], end["reason"]) == ("aborted", "client_idle")
    answer = next(e["payload"] for e in recorded if e["type"] == "assistant/message")
    assert answer["interrupted"] is True and answer["delivery"] == "acked"
    text = answer["content"][0]["text"]
    assert "".join(PARTS).startswith(text) and len(text) < len("".join(PARTS))

    # What the client's kernel holds, read after the reset, is what was recorded.
    while True:
        try:
            data = await loop.sock_recv(sock, 65536)
        except ConnectionResetError:
            break
        if not data:
            break
        received += data
    sock.close()
    assert frames_text(received.partition(b"\r\n\r\n")[2]) == text


async def looks(progress: list[tuple[int, bool]], timeout_s: float = 0.02) -> tuple[int, int]:
    """Run a watch whose client's side reports `progress` at each look, one after the other;
    how many looks it took, and at which look it called the client idle (0: never)."""
    done = asyncio.Event()
    seen = [0, 0]

    def look() -> tuple[int, bool]:
        seen[0] += 1
        if seen[0] == len(progress):
            done.set()
        return progress[min(seen[0], len(progress)) - 1]

    def idle() -> None:
        seen[1] = seen[0]
        done.set()

    watch = IdleReaderWatch(timeout_s, look, idle)
    await asyncio.wait_for(done.wait(), 5)
    watch.stop()
    return seen[0], seen[1]


async def test_a_slow_reader_or_a_waiting_stream_is_never_idle() -> None:
    slow = [(n, True) for n in range(24)]  # more sent than taken, but it takes some
    assert await looks(slow) == (24, 0)
    waiting = [(100, False)] * 24  # everything acknowledged, the upstream quiet
    assert await looks(waiting) == (24, 0)


async def test_a_reader_that_takes_nothing_more_is_idle_once_past_the_timeout() -> None:
    stuck = [(1, True), (2, True)] + [(2, True)] * 40
    taken, idle_at = await looks(stuck)
    # Its last byte at the second look; idle a timeout later: 4 looks on, or fewer when the
    # loop ran the looks late, never before the next look; and looked at no more after it.
    assert 3 <= idle_at <= 7 and taken == idle_at
