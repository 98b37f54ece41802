"""A real forward HTTP proxy on loopback for the tests, recording what it saw.

It does what a corporate proxy (squid, tinyproxy) does for the gateway: `CONNECT host:port`
answered `200` and then bytes piped both ways (the TLS inside is the client's and the
upstream's), and absolute-form requests (`POST http://host:port/path HTTP/1.1`) sent on to the
origin in origin form, without the `Proxy-*` headers. It can require credentials (`407` without
them) or refuse every request with a status of its own.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit


@dataclass
class ProxyRequest:
    """One request the proxy received (a CONNECT, or an absolute-form request)."""

    method: str
    target: str
    headers: dict[str, str]  # by lowercased name


@dataclass
class ForwardProxy:
    credentials: str | None = None  # "user:password": required as Proxy-Authorization: Basic
    refuse: int | None = None  # answer every request with this status
    silent: bool = False  # accept connections and never answer (a connect timeout)
    requests: list[ProxyRequest] = field(default_factory=list)
    connections: int = 0  # client connections accepted
    url: str = ""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)
    _writers: set[asyncio.StreamWriter] = field(default_factory=set)

    @property
    def port(self) -> int:
        return int(self.url.rpartition(":")[2])

    def url_with(self, userinfo: str) -> str:
        return self.url.replace("http://", f"http://{userinfo}@")

    async def __aenter__(self) -> ForwardProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        assert self._server is not None
        self._server.close()
        for writer in list(self._writers):
            writer.transport.abort()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    # -- serving ---------------------------------------------------------------------------------

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.add(writer)
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            await self._first(reader, writer)
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass
        finally:
            self._tasks.discard(task)

    async def _head(self, reader: asyncio.StreamReader) -> ProxyRequest:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        line, *fields = head[:-4].split("\r\n")
        method, target, _ = line.split(" ", 2)
        headers = {}
        for item in fields:
            name, _, value = item.partition(":")
            headers[name.strip().lower()] = value.strip()
        request = ProxyRequest(method, target, headers)
        self.requests.append(request)
        return request

    def _refusal(self, request: ProxyRequest) -> bytes | None:
        if self.refuse is not None:
            body = b"no tunnels here"
            return b"HTTP/1.1 %d Forbidden\r\nContent-Length: %d\r\n\r\n%s" % (
                self.refuse,
                len(body),
                body,
            )
        if self.credentials is not None:
            expected = "Basic " + base64.b64encode(self.credentials.encode()).decode()
            if request.headers.get("proxy-authorization") != expected:
                return (
                    b"HTTP/1.1 407 Proxy Authentication Required\r\n"
                    b'Proxy-Authenticate: Basic realm="test"\r\nContent-Length: 0\r\n\r\n'
                )
        return None

    async def _first(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.silent:
            await reader.read()  # until the client gives up
            return
        request = await self._head(reader)
        refusal = self._refusal(request)
        if refusal is not None:
            writer.write(refusal)
            await writer.drain()
            writer.close()
            return
        if request.method == "CONNECT":
            host, _, port = request.target.rpartition(":")
            try:
                up_reader, up_writer = await asyncio.open_connection(host.strip("[]"), int(port))
            except OSError:
                writer.write(b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\n\r\n")
                writer.close()
                return
            self._writers.add(up_writer)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            self._spawn(_pipe(up_reader, writer))
            await _pipe(reader, up_writer)
            return
        # Absolute form: this request and the ones after it on this connection go to the origin
        # of the first (the gateway pools a connection per origin and proxy).
        origin = urlsplit(request.target)
        assert origin.scheme == "http" and origin.hostname, request.target
        up_reader, up_writer = await asyncio.open_connection(origin.hostname, origin.port or 80)
        self._writers.add(up_writer)
        self._spawn(_pipe(up_reader, writer))
        while True:
            target = urlsplit(request.target)
            path = target.path + (f"?{target.query}" if target.query else "")
            lines = [f"{request.method} {path} HTTP/1.1"]
            lines += [
                f"{name}: {value}"
                for name, value in request.headers.items()
                if not name.startswith("proxy-")
            ]
            up_writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            length = int(request.headers.get("content-length", "0"))
            if length:
                up_writer.write(await reader.readexactly(length))
            await up_writer.drain()
            try:
                request = await self._head(reader)
            except asyncio.IncompleteReadError:
                up_writer.close()
                return
            refusal = self._refusal(request)
            if refusal is not None:
                writer.write(refusal)
                writer.close()
                return


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()
