"""Delivered means acknowledged by the client's side, not written by the gateway."""

from __future__ import annotations

import asyncio
import json
import socket
import struct

from aiohttp import web

from tests.client_bytes import dechunk, unread
from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, chunk

PIECE = "lorem ipsum dolor sit amet " * 3  # 81 characters a chunk


def flood(count: int) -> object:
    """Push `count` text chunks as fast as the gateway takes them, then stall."""

    async def script(request: web.Request) -> web.StreamResponse:
        from tests.fakes import FAKE

        fake = request.app[FAKE]
        response = await fake.start_sse(request)
        for i in range(count):
            await fake.write(response, chunk(f"[{i}]{PIECE}"))
        await fake.stall()
        return response

    return script


def _complete_sse_text(payload: bytes) -> str:
    text = ""
    for frame in payload.split(b"\n\n")[:-1]:  # the last piece has no blank line yet
        data = frame.removeprefix(b"data: ")
        if data != b"[DONE]":
            text += json.loads(data)["choices"][0]["delta"].get("content") or ""
    return text


def _request(body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: [::1]\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(data)}\r\n\r\n".encode()
        + data
    )


STREAM = {"model": "fake", "messages": [{"role": "user", "content": "go"}], "stream": True}


async def _read_then_stop(sock: socket.socket, first: int) -> bytes:
    """Read `first` bytes, then stop reading until the gateway's writes have filled every
    buffer, and reset the connection: returns exactly what reached the client's side."""
    loop = asyncio.get_running_loop()
    received = bytearray()
    while len(received) < first:
        received += await loop.sock_recv(sock, first - len(received))
    # Wait until the flow has stopped: the client's receive queue is full (zero window) and
    # unchanged across consecutive checks, so every byte it holds has been acknowledged.
    stable, last = 0, -1
    async with asyncio.timeout(20):
        while stable < 10:
            await asyncio.sleep(0.02)
            now = unread(sock)
            stable = stable + 1 if now == last and now > 0 else 0
            last = now
    # Take what the kernel holds without reading it (reading would reopen the window), then
    # reset the connection: this is exactly what reached the client's side.
    received += sock.recv(unread(sock), socket.MSG_PEEK)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()
    return bytes(received)


async def _connect(gw: GatewayUnderTest) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    assert gw.server.port is not None
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", gw.server.port))
    return sock


async def _assert_recorded_as_received(
    gw: GatewayUnderTest, upstream: FakeUpstream, received: bytes
) -> None:
    head, _, chunked = received.partition(b"\r\n\r\n")
    conversation_id = next(
        line.split(b": ", 1)[1].decode()
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"x-conversation-id")
    )
    client_text = _complete_sse_text(dechunk(chunked))
    await asyncio.wait_for(upstream.disconnected.wait(), 10)
    events = await gw.wait_turn_end(conversation_id)
    message = events[1]["payload"]
    assert events[1]["type"] == "assistant/message"
    assert message["interrupted"] is True
    assert message["delivery"] == "acked"
    recorded = message["content"][0]["text"]
    assert recorded == client_text


async def test_a_client_that_stops_reading_gets_only_what_it_received(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(flood(40_000))  # about 9 MB of SSE
    sock = await _connect(gw)
    await asyncio.get_running_loop().sock_sendall(sock, _request(STREAM))
    received = await _read_then_stop(sock, 4000)
    await _assert_recorded_as_received(gw, upstream, received)
    # The gateway handed far more to the kernel than the client ever received.
    assert upstream.bytes_sent > 20 * len(received)


async def test_the_second_stream_of_a_kept_alive_connection_is_measured_from_its_own_start(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """The connection's one socket duplicate serves both responses; the second's delivered
    prefix counts from its own first byte, not the connection's."""
    sock = await _connect(gw)
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, _request(STREAM))  # a captured stream, whole
    first = bytearray()
    while not first.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):  # its body's end
        first += await loop.sock_recv(sock, 65536)
    assert b"Connection: close" not in first

    upstream.push(flood(40_000))
    await loop.sock_sendall(sock, _request(STREAM))
    received = await _read_then_stop(sock, 4000)
    await _assert_recorded_as_received(gw, upstream, received)
