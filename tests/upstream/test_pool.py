"""The upstream HTTP client (gateway.upstream.pool) against real servers on loopback.

aiohttp servers for well-formed answers; raw asyncio servers for what aiohttp would never send
(malformed heads, chunk extensions and trailers, resets, answers cut off, connections closed
without an answer). Tests synchronise on what the server saw (events), never on sleeps. The
connection's parser fed directly, split at every byte, is tests/upstream/test_connection.py.
"""

from __future__ import annotations

import asyncio
import gzip
import shutil
import socket
import ssl
import struct
import subprocess
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.errors import (
    UpstreamConnectError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamTimeout,
)
from gateway.upstream.pool import HIGH_WATER, USER_AGENT, Endpoint, UpstreamPool
from gateway.upstream.seam import post
from tests.upstream.test_connection import ok, read_all

MakeServer = Callable[..., Awaitable[TestServer]]
KEY = "sk-test-0123456789"


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    pool = UpstreamPool()
    yield pool
    await pool.close()


async def fetch(pool: UpstreamPool, url: str, body: bytes = b"{}", **headers: str) -> bytes:
    response = await pool.post(Endpoint(url, headers), body)
    assert response.status == 200, response.status
    return await read_all(response)


# -- servers -----------------------------------------------------------------------------------


@dataclass
class Seen:
    """What an aiohttp upstream saw: each request's client port, headers and body."""

    ports: list[int] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    bodies: list[bytes] = field(default_factory=list)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def aiohttp_upstream(make: MakeServer, handler: Handler, **server: Any) -> tuple[str, Seen]:
    seen = Seen()

    async def record(request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        seen.ports.append(peer[1] if peer else 0)
        seen.headers.append(dict(request.headers))
        seen.bodies.append(await request.read())
        return await handler(request)

    app = web.Application()
    app.router.add_post("/{tail:.*}", record)
    test_server = await make(app, **server)
    return str(test_server.make_url("/v1/chat")), seen


RawHandler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "RawServer"], Awaitable[None]]


class RawServer:
    """A TCP server that speaks whatever its handler writes; counts connections and requests,
    and sets `client_left` when a client closes its side."""

    def __init__(self, handler: RawHandler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self.received = asyncio.Event()  # a request has arrived
        self.client_left = asyncio.Event()
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/chat"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer, self)
        except (ConnectionError, asyncio.IncompleteReadError):
            self.client_left.set()
        finally:
            writer.close()

    async def request(self, reader: asyncio.StreamReader) -> bytes | None:
        """The next request's head and body; None when the client closed the connection."""
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            self.client_left.set()
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        self.received.set()
        return request

    async def wait_client_left(self, reader: asyncio.StreamReader) -> None:
        """Until the client closes its side (whatever it sends meanwhile is ignored)."""
        while await reader.read(65536):
            pass
        self.client_left.set()


def serve_each(*answers: bytes) -> RawHandler:
    """Answer the requests of each connection with `answers` in turn, keeping it alive."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        for answer in answers:
            if await server.request(reader) is None:
                return
            writer.write(answer)
            await writer.drain()
        await server.wait_client_left(reader)

    return handler


def head_then_stall(head: bytes) -> RawHandler:
    """Answer with `head` (and any body bytes in it), then wait for the client to leave."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        writer.write(head)
        await writer.drain()
        await server.wait_client_left(reader)

    return handler


PARTIAL = b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nfirst part"


# -- bodies over real sockets ----------------------------------------------------------------------


async def test_the_request_carries_framing_defaults_and_the_callers_headers(
    aiohttp_server: MakeServer, pool: UpstreamPool
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    url, seen = await aiohttp_upstream(aiohttp_server, handler)
    headers = {"Authorization": f"Bearer {KEY}", "accept-encoding": "identity", "X-Extra": "1"}
    endpoint = Endpoint(url + "?api-version=2024-10-21", headers)
    response = await pool.post(endpoint, b'{"model": "m"}')
    assert orjson.loads(await read_all(response)) == {"ok": True}
    [sent] = seen.headers
    port = url.split(":")[2].split("/")[0]
    assert sent["Host"] == f"127.0.0.1:{port}"
    assert sent["Content-Length"] == "14"
    assert sent["Connection"] == "keep-alive"
    assert sent["User-Agent"] == USER_AGENT
    assert sent["Authorization"] == f"Bearer {KEY}"
    assert sent["Accept-Encoding"] == "identity"  # the caller's, replacing the default
    assert sent["X-Extra"] == "1"
    assert seen.bodies == [b'{"model": "m"}']


async def test_a_content_length_body_and_a_chunked_body_of_many_small_chunks(
    aiohttp_server: MakeServer, pool: UpstreamPool
) -> None:
    big = bytes(range(256)) * 4096  # 1 MiB, read in pieces

    async def handler(request: web.Request) -> web.StreamResponse:
        if request.path.endswith("/whole"):
            return web.Response(body=big)
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(2000):
            await response.write(b"data: %d\n\n" % i)
        await response.write_eof()
        return response

    url, seen = await aiohttp_upstream(aiohttp_server, handler)
    assert await fetch(pool, url + "/whole") == big
    expected = b"".join(b"data: %d\n\n" % i for i in range(2000))
    assert await fetch(pool, url + "/chunks") == expected
    assert seen.ports[0] == seen.ports[1]  # one connection, kept alive


async def test_a_large_request_body_arrives_whole(
    aiohttp_server: MakeServer, pool: UpstreamPool
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="got it")

    url, seen = await aiohttp_upstream(aiohttp_server, handler)
    sent = orjson.dumps({"messages": [{"content": "x" * (512 << 10)}]})
    assert await fetch(pool, url, sent) == b"got it"
    assert seen.bodies == [sent]


async def test_a_body_delimited_by_the_close_of_the_connection(pool: UpstreamPool) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\n")
        for i in range(100):
            writer.write(b"line %d\n" % i)
            await writer.drain()

    async with RawServer(handler) as server:
        assert await fetch(pool, server.url) == b"".join(b"line %d\n" % i for i in range(100))
        assert pool.idle_connections == 0
        assert await fetch(pool, server.url) == b"".join(b"line %d\n" % i for i in range(100))
        assert server.connections == 2


async def test_an_http_1_0_answer_is_not_kept_alive(pool: UpstreamPool) -> None:
    answer = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    async with RawServer(serve_each(answer)) as server:
        assert await fetch(pool, server.url) == b"ok"
        assert await fetch(pool, server.url) == b"ok"
        assert server.connections == 2


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate"])
@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
async def test_compressed_bodies_are_decompressed(
    aiohttp_server: MakeServer, pool: UpstreamPool, encoding: str, chunked: bool
) -> None:
    text = b"".join(b'data: {"n": %d}\n\n' % i for i in range(3000))
    if encoding == "gzip":
        packed = gzip.compress(text)
    elif encoding == "deflate":
        packed = zlib.compress(text)
    else:  # what some servers send as deflate: no zlib header
        squeezer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        packed = squeezer.compress(text) + squeezer.flush()
    header = "gzip" if encoding == "gzip" else "deflate"

    async def handler(request: web.Request) -> web.StreamResponse:
        if not chunked:
            return web.Response(body=packed, headers={"Content-Encoding": header})
        response = web.StreamResponse(headers={"Content-Encoding": header})
        await response.prepare(request)
        for i in range(0, len(packed), 100):
            await response.write(packed[i : i + 100])
        await response.write_eof()
        return response

    url, seen = await aiohttp_upstream(aiohttp_server, handler)
    assert await fetch(pool, url) == text
    assert await fetch(pool, url) == text
    assert seen.headers[0]["Accept-Encoding"] == "gzip, deflate"
    assert seen.ports[0] == seen.ports[1]


# -- keep-alive ----------------------------------------------------------------------------------


async def test_keep_alive_reuses_one_connection_and_honours_connection_close(
    aiohttp_server: MakeServer, pool: UpstreamPool
) -> None:
    async def handler(request: web.Request) -> web.Response:
        response = web.Response(text="hi")
        if request.path.endswith("/last"):
            response.force_close()  # answers `Connection: close`
        return response

    url, seen = await aiohttp_upstream(aiohttp_server, handler)
    for path in ("/a", "/b", "/last", "/c"):
        assert await fetch(pool, url + path) == b"hi"
    assert seen.ports[0] == seen.ports[1] == seen.ports[2]  # same server-side connection
    assert seen.ports[3] != seen.ports[2]  # the closed one was not reused
    assert pool.idle_connections == 1 and pool.open_connections == 1


async def test_connection_close_is_honoured_even_when_the_server_keeps_it_open(
    pool: UpstreamPool,
) -> None:
    answer = ok(b"hi", "Connection: close")
    async with RawServer(serve_each(answer, answer)) as server:
        assert await fetch(pool, server.url) == b"hi"
        await asyncio.wait_for(server.client_left.wait(), 10)  # the client closed it
        assert await fetch(pool, server.url) == b"hi"
        assert server.connections == 2


async def test_keep_alive_is_per_host_and_port(
    aiohttp_server: MakeServer, pool: UpstreamPool
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    url_a, seen_a = await aiohttp_upstream(aiohttp_server, handler)
    url_b, seen_b = await aiohttp_upstream(aiohttp_server, handler)
    for url in (url_a, url_b, url_a, url_b):
        assert await fetch(pool, url) == b"hi"
    assert len(set(seen_a.ports)) == len(set(seen_b.ports)) == 1
    assert pool.idle_connections == 2


async def test_an_error_answer_read_whole_keeps_its_connection(
    aiohttp_server: MakeServer, pool: UpstreamPool
) -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.path.endswith("/limited"):
            error = {"error": {"message": "slow down", "type": "rate_limit_error"}}
            return web.json_response(error, status=429, headers={"Retry-After": "2"})
        return web.Response(text="fine")

    url, seen = await aiohttp_upstream(aiohttp_server, handler)
    with pytest.raises(UpstreamHTTPError) as info:
        await post(pool, Endpoint(url + "/limited", {}), {"model": "m"})
    assert (info.value.status, info.value.retry_after) == (429, 2.0)
    assert info.value.to_openai()["error"]["message"] == "slow down"
    assert await fetch(pool, url) == b"fine"
    assert seen.ports[0] == seen.ports[1]


async def test_a_pooled_connection_closed_by_the_server_is_retried_once(
    pool: UpstreamPool,
) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        writer.write(ok(b"connection %d" % server.connections))
        await writer.drain()
        # Its keep-alive ran out just as the next request came: closed without an answer.
        await server.request(reader)

    async with RawServer(handler) as server:
        assert await fetch(pool, server.url) == b"connection 1"
        assert await fetch(pool, server.url) == b"connection 2"  # sent again, on a new one
        assert (server.connections, len(server.requests)) == (2, 3)


async def test_the_retry_is_only_once_and_only_for_a_reused_connection(
    pool: UpstreamPool,
) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        if server.connections == 1:
            writer.write(ok(b"first"))
            await writer.drain()
            await server.request(reader)
        # every other request: closed without an answer

    async with RawServer(handler) as server:
        assert await fetch(pool, server.url) == b"first"
        with pytest.raises(UpstreamConnectError):
            await fetch(pool, server.url)
        assert (server.connections, len(server.requests)) == (2, 3)
        # A new connection closed before an answer: never sent twice.
        with pytest.raises(UpstreamConnectError):
            await fetch(pool, server.url)
        assert (server.connections, len(server.requests)) == (3, 4)


async def test_a_connection_the_server_closes_while_idle_is_not_reused(
    pool: UpstreamPool,
) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        writer.write(ok(b"connection %d" % server.connections))
        await writer.drain()  # then closed, idle, with no `Connection: close` said

    async with RawServer(handler) as server:
        assert await fetch(pool, server.url) == b"connection 1"
        # Whether the close is seen while idle or on reuse, the answer comes from a new one.
        assert await fetch(pool, server.url) == b"connection 2"
        assert server.connections == 2


async def test_idle_connections_expire() -> None:
    left = asyncio.Event()

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        writer.write(ok(b"hi"))
        await writer.drain()
        await server.wait_client_left(reader)
        left.set()

    pool = UpstreamPool(idle_s=0.05)
    async with RawServer(handler) as server:
        assert await fetch(pool, server.url) == b"hi"
        await asyncio.wait_for(left.wait(), 10)  # the client closed it, unasked
        assert pool.idle_connections == 0
    await pool.close()


async def test_closing_the_pool_closes_idle_and_busy_connections() -> None:
    pool = UpstreamPool()
    async with (
        RawServer(serve_each(ok(b"idle"))) as idle,
        RawServer(head_then_stall(PARTIAL)) as busy,
    ):
        assert await fetch(pool, idle.url) == b"idle"
        response = await pool.post(Endpoint(busy.url, {}), b"{}")
        assert await response.read() == b"first part"
        assert (pool.open_connections, pool.idle_connections) == (2, 1)
        await pool.close()
        with pytest.raises(UpstreamProtocolError):
            await response.read()
        await asyncio.wait_for(idle.client_left.wait(), 10)
        await asyncio.wait_for(busy.client_left.wait(), 10)
        with pytest.raises(UpstreamConnectError):
            await pool.post(Endpoint(idle.url, {}), b"{}")


# -- dropping connections ------------------------------------------------------------------------


async def test_close_before_the_end_drops_the_connection(pool: UpstreamPool) -> None:
    async with RawServer(head_then_stall(PARTIAL)) as server:
        response = await pool.post(Endpoint(server.url, {}), b"{}")
        assert await response.read() == b"first part"
        response.close()
        await asyncio.wait_for(server.client_left.wait(), 10)  # the upstream saw it go
        assert pool.idle_connections == 0 and pool.open_connections == 0
        with pytest.raises(UpstreamProtocolError):
            await response.read()


async def test_a_cancelled_read_pools_nothing_and_may_read_on(pool: UpstreamPool) -> None:
    go_on = asyncio.Event()

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        writer.write(PARTIAL)
        await go_on.wait()
        writer.write(b"x" * 90)
        await server.wait_client_left(reader)

    async with RawServer(handler) as server:
        response = await pool.post(Endpoint(server.url, {}), b"{}")
        assert await response.read() == b"first part"
        reading = asyncio.ensure_future(response.read())
        await asyncio.sleep(0)  # it waits for more
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        assert pool.idle_connections == 0
        go_on.set()  # a drain reads on after the cancel, to the end
        assert await read_all(response) == b"x" * 90
        assert pool.idle_connections == 1  # whole, so kept


async def test_a_request_cancelled_before_its_answer_drops_the_connection(
    pool: UpstreamPool,
) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        await server.wait_client_left(reader)

    async with RawServer(handler) as server:
        posting = asyncio.ensure_future(pool.post(Endpoint(server.url, {}), b"{}"))
        await server.received.wait()
        posting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await posting
        await asyncio.wait_for(server.client_left.wait(), 10)
        assert pool.idle_connections == 0 and pool.open_connections == 0


# -- faults ----------------------------------------------------------------------------------------


async def test_connection_refused_is_a_connect_error(pool: UpstreamPool) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens once it is closed
    with pytest.raises(UpstreamConnectError):
        await pool.post(Endpoint(f"http://127.0.0.1:{port}/v1", {}), b"{}")


async def test_no_such_host_is_a_connect_error(pool: UpstreamPool) -> None:
    with pytest.raises(UpstreamConnectError):
        await pool.post(Endpoint("http://gateway-client-test.invalid/v1", {}), b"{}")


async def test_a_connect_that_does_not_finish_in_time_is_a_connect_timeout(
    pool: UpstreamPool,
) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.wait_client_left(reader)  # never answers the TLS handshake

    async with RawServer(handler) as server:
        url = server.url.replace("http://", "https://")
        with pytest.raises(UpstreamTimeout) as info:
            await pool.post(Endpoint(url, {}, connect_s=0.2), b"{}")
        assert info.value.phase == "connect"
        assert info.value.code == "upstream_timeout_connect"
        await asyncio.wait_for(server.client_left.wait(), 10)


@pytest.mark.parametrize("how", ["eof", "reset"])
async def test_a_connection_broken_mid_body_is_a_protocol_error(
    pool: UpstreamPool, how: str
) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        writer.write(PARTIAL)
        await writer.drain()
        if how == "reset":  # RST, not FIN
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    async with RawServer(handler) as server:
        response = await pool.post(Endpoint(server.url, {}), b"{}")
        parts = []
        with pytest.raises(UpstreamProtocolError):
            while chunk := await response.read():
                parts.append(chunk)
        assert b"".join(parts) == b"first part"  # what came before the break, then the error
        assert pool.open_connections == 0


async def test_a_connection_closed_before_the_answer_is_a_connect_error(
    pool: UpstreamPool,
) -> None:
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.request(reader)
        writer.write(b"HTTP/1.1 200 O")  # not even the whole status line

    async with RawServer(handler) as server:
        with pytest.raises(UpstreamConnectError):
            await pool.post(Endpoint(server.url, {}), b"{}")
        assert len(server.requests) == 1


async def test_error_statuses_become_http_errors_with_the_key_redacted(
    aiohttp_server: MakeServer, pool: UpstreamPool
) -> None:
    async def handler(request: web.Request) -> web.Response:
        if request.path.endswith("/html"):
            return web.Response(status=502, text="<html>Bad Gateway</html>")
        error = {"error": {"message": f"invalid key {KEY}", "type": "invalid_request_error"}}
        return web.json_response(error, status=401)

    url, _ = await aiohttp_upstream(aiohttp_server, handler)
    endpoint = Endpoint(url, {"Authorization": f"Bearer {KEY}"})
    with pytest.raises(UpstreamHTTPError) as info:
        await post(pool, endpoint, {"model": "m"})
    assert (info.value.status, info.value.retryable) == (401, False)
    assert info.value.to_openai()["error"]["message"] == "invalid key [redacted]"
    with pytest.raises(UpstreamHTTPError) as info:
        await post(pool, Endpoint(url + "/html", {}), {"model": "m"})
    assert (info.value.status, info.value.retryable) == (502, True)
    assert "Bad Gateway" in info.value.message


@pytest.mark.parametrize("code", [301, 302, 307, 308])
async def test_a_redirect_is_refused_never_followed(
    aiohttp_server: MakeServer, pool: UpstreamPool, code: int
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(status=code, headers={"Location": "http://127.0.0.1:9/elsewhere"})

    url, seen = await aiohttp_upstream(aiohttp_server, handler)
    with pytest.raises(UpstreamProtocolError) as info:
        await post(pool, Endpoint(url, {}), {"model": "m"})
    assert info.value.code == "upstream_redirect"
    assert len(seen.bodies) == 1


def test_headers_that_could_smuggle_a_line_are_refused() -> None:
    with pytest.raises(ValueError):
        Endpoint("http://upstream.test/v1", {"X-Evil": "a\r\nHost: elsewhere"})
    with pytest.raises(ValueError):
        Endpoint("http://upstream.test/v1", {"Bad Name": "x"})
    with pytest.raises(ValueError):
        Endpoint("ftp://upstream.test/v1", {})


def test_headers_merge_case_insensitively_and_the_client_owns_the_framing() -> None:
    endpoint = Endpoint(
        "https://user:p%40ss@upstream.test:8443/v1/x y?a=b c",
        {"anthropic-version": "1", "Anthropic-Version": "2", "content-length": "99"},
    )
    head = endpoint.prefix.decode()
    assert head.startswith("POST /v1/x%20y?a=b%20c HTTP/1.1\r\nHost: upstream.test:8443\r\n")
    assert "Anthropic-Version: 2\r\n" in head and "anthropic-version" not in head
    assert "99" not in head and head.endswith("\r\nContent-Length: ")
    assert endpoint.headers["Authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss
    assert endpoint.key == ("https", "upstream.test", 8443, "")


# -- TLS -----------------------------------------------------------------------------------------


def certificate(directory: Path) -> tuple[Path, Path] | None:
    """A self-signed certificate for 127.0.0.1 and its key (None without openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


@pytest.fixture
async def tls_upstream(
    aiohttp_server: MakeServer, tmp_path: Path
) -> tuple[str, Seen, ssl.SSLContext]:
    """An https upstream with a self-signed certificate, and a client context that trusts it."""
    made = await asyncio.to_thread(certificate, tmp_path)
    if made is None:
        pytest.skip("no openssl to make a certificate")
    cert, key = made
    server_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_context.load_cert_chain(cert, key)

    async def handler(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(50):
            await response.write(b"data: %d\n\n" % i)
        await response.write_eof()
        return response

    url, seen = await aiohttp_upstream(aiohttp_server, handler, ssl=server_context)
    assert url.startswith("https://")
    return url, seen, ssl.create_default_context(cafile=str(cert))


async def test_tls_with_a_trusted_certificate_and_keep_alive(
    tls_upstream: tuple[str, Seen, ssl.SSLContext],
) -> None:
    url, seen, trusting = tls_upstream
    pool = UpstreamPool(ssl_context=trusting)
    expected = b"".join(b"data: %d\n\n" % i for i in range(50))
    assert await fetch(pool, url) == expected
    assert await fetch(pool, url) == expected
    assert seen.ports[0] == seen.ports[1]
    await pool.close()


async def test_tls_with_an_untrusted_certificate_is_a_connect_error(
    tls_upstream: tuple[str, Seen, ssl.SSLContext], pool: UpstreamPool
) -> None:
    url, seen, _ = tls_upstream
    with pytest.raises(UpstreamConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        await fetch(pool, url)  # the system's CAs do not know this one
    assert seen.bodies == []


async def test_tls_to_a_plain_http_port_is_a_connect_error(
    aiohttp_server: MakeServer, pool: UpstreamPool
) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text="plain")

    url, seen = await aiohttp_upstream(aiohttp_server, handler)
    with pytest.raises(UpstreamConnectError):
        await fetch(pool, url.replace("http://", "https://"))
    assert seen.bodies == []


# -- uvloop ----------------------------------------------------------------------------------------


def test_the_client_works_under_uvloop(tmp_path: Path) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        body = b"".join(b"data: %d\n\n" % i for i in range(500))
        packed = gzip.compress(body)
        big = b"y" * (4 * HIGH_WATER)

        async def handler(request: web.Request) -> web.StreamResponse:
            if request.path.endswith("/gzip"):
                return web.Response(body=packed, headers={"Content-Encoding": "gzip"})
            if request.path.endswith("/big"):
                return web.Response(body=big)
            response = web.StreamResponse()
            await response.prepare(request)
            for i in range(500):
                await response.write(b"data: %d\n\n" % i)
            await response.write_eof()
            return response

        app = web.Application()
        app.router.add_post("/{tail:.*}", handler)
        server = TestServer(app)
        await server.start_server()
        pool = UpstreamPool()
        try:
            url = str(server.make_url("/v1"))
            assert await fetch(pool, url + "/chunked") == body
            assert await fetch(pool, url + "/gzip") == body
            response = await pool.post(Endpoint(url + "/big", {}), b"{}")
            got = []
            while piece := await response.read():
                got.append(piece)
            assert b"".join(got) == big
            assert pool.open_connections == 1  # all three over one connection
            async with RawServer(head_then_stall(PARTIAL)) as stalled:
                response = await pool.post(Endpoint(stalled.url, {}), b"{}")
                assert await response.read() == b"first part"
                response.close()
                await asyncio.wait_for(stalled.client_left.wait(), 10)
        finally:
            await pool.close()
            await server.close()

    uvloop.run(scenario())
