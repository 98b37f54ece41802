"""A lean, pooled HTTP/1.1 client for the gateway's upstream POSTs, on asyncio protocols.

aiohttp's client request path cost about a fifth of the gateway's CPU per request (request and
response objects, multidicts, a StreamReader, timers, tracing hooks). The gateway needs far
less: POST a prebuilt body to a URL from its config, read the status and the few headers that
frame the body, and hand the body out piece by piece as it arrives. This module does only that:

- `Endpoint`: a URL and its headers, encoded once per deployment; a request then costs the
  length of its body and one write.
- `UpstreamPool`: keep-alive connections per (scheme, host, port). A connection goes back only
  after a response that ended cleanly without `Connection: close`; one found closed by the
  server when reused is replaced once by a fresh connection; idle ones expire.
- `Response`: the status, the headers (parsed only when asked for), and `read()`, which
  returns whatever body has arrived (gzip and deflate undone) and pauses the socket while too
  much waits unread.

Faults come out as the gateway's own errors, the same ones whatever the provider: connecting
fails -> `UpstreamConnectError` (also a connection closed before a response began: the request
was not answered), the connect timeout -> `UpstreamTimeout(phase="connect")`, a connection
broken mid-body or a malformed response -> `UpstreamProtocolError`. Only connecting is timed
here: the pipeline owns the first-token, idle and total timeouts and cancels the awaiting task.
A cancelled request drops its connection; a cancelled read leaves its response to be read on
(a drain) or closed, and a connection is pooled only after a clean end: none is reused half-read.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import time
import zlib
from collections.abc import Mapping
from typing import cast
from urllib.parse import quote, unquote, urlsplit

from gateway import __version__
from gateway.errors import UpstreamConnectError, UpstreamProtocolError, UpstreamTimeout

USER_AGENT = f"llm-gateway/{__version__}"
IDLE_S = 30.0
# Unread body bytes held before the socket stops being read (the upstream then waits on TCP).
HIGH_WATER = 64 * 1024
# The most one decompression step may produce: a small gzip bomb is undone step by step as it
# is read, never all at once into memory.
_INFLATE_STEP = HIGH_WATER
_MAX_HEAD = 64 * 1024
_MAX_LINE = 4 * 1024  # a chunk-size line, extensions included
_MAX_TRAILERS = 64 * 1024
# Bodies up to this size go out in one write with their head (one send, one segment or few).
_JOIN_WRITE = 64 * 1024

# Parser states of a connection.
_IDLE, _HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE = range(8)
_GZIP, _DEFLATE = 1, 2

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_FOLDED = re.compile(rb"\r\n[ \t]")  # obsolete line folding, refused
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?:[ \r]|\Z)")
_CONNECTION = b"\r\nconnection:"
_TRANSFER_ENCODING = b"\r\ntransfer-encoding:"
_CONTENT_LENGTH = b"\r\ncontent-length:"
_CONTENT_ENCODING = b"\r\ncontent-encoding:"
# Framing is the client's: a caller's value for these would contradict the bytes it sends.
_OWN_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})

_default_context: ssl.SSLContext | None = None

PoolKey = tuple[str, str, int]


def default_ssl_context() -> ssl.SSLContext:
    """Certificates verified against the system's CAs, made once (loading them takes ms)."""
    global _default_context
    if _default_context is None:
        _default_context = ssl.create_default_context()
    return _default_context


class Endpoint:
    """One upstream URL and its request headers, encoded once.

    Headers merge case-insensitively, later ones winning: the defaults (`Host`, `User-Agent`,
    `Accept`, `Accept-Encoding: gzip, deflate`), then `headers` in order. `Content-Length`,
    `Transfer-Encoding` and `Connection` are always the client's own.
    """

    __slots__ = ("connect_s", "headers", "host", "key", "port", "prefix", "tls", "url")

    def __init__(self, url: str, headers: Mapping[str, str], connect_s: float = 10.0) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.tls = scheme == "https"
        self.host = parts.hostname
        default_port = 443 if self.tls else 80
        self.port = parts.port or default_port  # .port raises ValueError for a bad port
        self.key: PoolKey = (scheme, self.host, self.port)
        self.connect_s = connect_s
        authority = f"[{self.host}]" if ":" in self.host else self.host
        if self.port != default_port:
            authority += f":{self.port}"
        merged: dict[str, tuple[str, str]] = {}
        defaults = {
            "Host": authority,
            "User-Agent": USER_AGENT,
            "Accept": "*/*",
            "Accept-Encoding": "gzip, deflate",
        }
        if parts.username is not None:
            userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            basic = base64.b64encode(userinfo.encode()).decode()
            defaults["Authorization"] = f"Basic {basic}"
        for name, value in [*defaults.items(), *headers.items()]:
            if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
                raise ValueError(f"invalid header for {url}: {name!r}")
            if name.lower() not in _OWN_HEADERS:
                merged[name.lower()] = (name, value)
        # What the caller may see of them (credentials() reads the secrets from these).
        self.headers = dict(merged.values())
        target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=~")
        if parts.query:
            target += "?" + quote(parts.query, safe="/?%:@!$&'()*+,;=~")
        lines = [f"POST {target} HTTP/1.1", *(f"{n}: {v}" for n, v in merged.values())]
        lines += ["Connection: keep-alive", "Content-Length: "]
        self.prefix = "\r\n".join(lines).encode("utf-8")


class UpstreamPool:
    """Keep-alive connections per (scheme, host, port), shared by every deployment.

    `ssl_context` replaces the default verifying context (tests trust their own CA with it).
    """

    def __init__(self, *, idle_s: float = IDLE_S, ssl_context: ssl.SSLContext | None = None):
        self._idle_s = idle_s
        self._ssl = ssl_context
        # Idle connections per key, oldest first: reuse takes the newest, expiry the oldest.
        self._idle: dict[PoolKey, list[_Connection]] = {}
        self._all: set[_Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def idle_connections(self) -> int:
        return sum(len(conns) for conns in self._idle.values())

    @property
    def open_connections(self) -> int:
        return len(self._all)

    async def post(self, endpoint: Endpoint, body: bytes) -> Response:
        """Send `body` and wait for the response's status and headers (any status)."""
        conn = self._take(endpoint.key)
        if conn is not None:
            try:
                return await conn.exchange(endpoint, body)
            except _Stale:
                pass  # closed by the server while idle: the request reached nobody; once more
        conn = await self._connect(endpoint)
        return await conn.exchange(endpoint, body)

    async def close(self) -> None:
        """Close every connection; requests still reading fail with `UpstreamProtocolError`."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._idle.clear()
        for conn in list(self._all):
            conn.in_pool = False
            conn.fail(UpstreamProtocolError("the gateway closed its upstream connections"))
        await asyncio.sleep(0)  # the transports' connection_lost callbacks run

    # -- the pool ----------------------------------------------------------------------------

    def _take(self, key: PoolKey) -> _Connection | None:
        conns = self._idle.get(key)
        if not conns:
            return None
        conn = conns.pop()
        conn.in_pool = False
        if time.monotonic() - conn.idle_since < self._idle_s:
            conn.reused = True
            return conn
        for old in [conn, *conns]:  # the newest expired: so did every older one
            old.in_pool = False
            old.abort()
        conns.clear()
        return None

    def release(self, conn: _Connection) -> None:
        if self._closed:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        conn.in_pool = True
        conns = self._idle.get(conn.key)
        if conns is None:
            self._idle[conn.key] = [conn]
        else:
            conns.append(conn)
        if self._sweep is None:
            self._sweep = conn.loop.call_later(self._idle_s, self._expire, conn.loop)

    def discard(self, conn: _Connection, *, lost: bool = False) -> None:
        if lost:
            self._all.discard(conn)
        if conn.in_pool:
            conn.in_pool = False
            conns = self._idle.get(conn.key)
            if conns is not None and conn in conns:
                conns.remove(conn)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweep = None
        now = time.monotonic()
        next_at: float | None = None
        for key, conns in list(self._idle.items()):
            while conns and now - conns[0].idle_since >= self._idle_s:
                old = conns.pop(0)
                old.in_pool = False
                old.abort()
            if conns:
                due = conns[0].idle_since + self._idle_s
                next_at = due if next_at is None else min(next_at, due)
            else:
                del self._idle[key]
        if next_at is not None and not self._closed:
            self._sweep = loop.call_later(max(0.0, next_at - now) + 0.01, self._expire, loop)

    async def _connect(self, endpoint: Endpoint) -> _Connection:
        if self._closed:
            raise UpstreamConnectError("the gateway is closing its upstream connections")
        loop = asyncio.get_running_loop()
        conn = _Connection(self, endpoint.key, loop)
        context = (self._ssl or default_ssl_context()) if endpoint.tls else None
        try:
            try:
                # The TCP connect and the TLS handshake, both within connect_s.
                async with asyncio.timeout(endpoint.connect_s):
                    await loop.create_connection(
                        lambda: conn,
                        endpoint.host,
                        endpoint.port,
                        ssl=context,
                        server_hostname=endpoint.host if context is not None else None,
                    )
            except TimeoutError as exc:
                if exc.errno is None:  # ours, not the kernel's ETIMEDOUT
                    raise UpstreamTimeout(
                        "connecting to the upstream timed out", phase="connect"
                    ) from None
                raise UpstreamConnectError(f"cannot reach the upstream: {exc}") from None
            except OSError as exc:  # refused, DNS, TLS (ssl.SSLError is an OSError)
                raise UpstreamConnectError(f"cannot reach the upstream: {exc}") from None
        except BaseException:
            conn.abort()  # cancelled, or timed out just as the connection was made
            raise
        if self._closed:
            conn.abort()
            raise UpstreamConnectError("the gateway is closing its upstream connections")
        return conn


class _Stale(UpstreamConnectError):
    """A reused connection closed before any byte of its response: what a server's keep-alive
    timeout does to a request sent just as it closed the idle connection. `post` sends such a
    request once more on a new connection. (A server that read the request and then closed
    without answering gets it twice; the pipeline would have retried that connect error too,
    after a backoff and with a mark against the deployment's health.)"""


class _Connection(asyncio.Protocol):
    """One upstream socket and the parser of the response it is receiving."""

    __slots__ = (
        "_keep_alive",
        "_left",
        "_paused",
        "_pool",
        "_received",
        "_response",
        "_rest",
        "_state",
        "_trailers",
        "closed",
        "idle_since",
        "in_pool",
        "key",
        "loop",
        "reused",
        "transport",
    )

    def __init__(self, pool: UpstreamPool, key: PoolKey, loop: asyncio.AbstractEventLoop):
        self._pool = pool
        self.key = key
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._response: Response | None = None
        self._state = _IDLE
        self._rest = b""
        self._left = 0  # body bytes to come (Content-Length) or of the current chunk
        self._trailers = 0
        self._keep_alive = False
        self._received = False
        self._paused = False
        self.closed = False
        self.reused = False
        self.in_pool = False
        self.idle_since = 0.0

    # -- one request ---------------------------------------------------------------------------

    async def exchange(self, endpoint: Endpoint, body: bytes) -> Response:
        transport = self.transport
        assert transport is not None
        response = Response(self, self.loop)
        self._response = response
        self._state = _HEAD
        self._received = False
        head = endpoint.prefix + b"%d\r\n\r\n" % len(body)
        try:
            if len(body) <= _JOIN_WRITE:
                transport.write(head + body)
            else:
                transport.write(head)
                transport.write(body)
            while not response.status:
                if response._exc is not None:
                    raise response._exc
                waiter = response._waiter = self.loop.create_future()
                await waiter
        except BaseException:  # cancelled, or the connection failed before the headers
            response._conn = None
            self.abort()
            raise
        return response

    # -- asyncio.Protocol ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self._pool._all.add(self)

    def data_received(self, data: bytes) -> None:
        response = self._response
        if response is None:  # bytes while idle, or after a response's end: unusable
            self.abort()
            return
        self._received = True
        if self._rest:
            data = self._rest + data
            self._rest = b""
        try:
            if self._state == _HEAD:
                data = self._head(response, data)
                if not data or self._response is None:
                    return
            state = self._state
            if state == _LENGTH:
                left = self._left
                if len(data) < left:
                    self._left = left - len(data)
                    response._feed(data)
                elif len(data) == left:
                    response._feed(data)
                    self._finish(True)
                else:  # bytes after the body: a broken upstream, this socket is not reused
                    response._feed(data[:left])
                    self._finish(False)
            elif state == _UNTIL_CLOSE:
                response._feed(data)
            else:
                self._chunks(response, data)
        except UpstreamProtocolError as exc:
            self.fail(exc)

    def eof_received(self) -> bool:
        self._ended(None)
        return False  # the transport closes itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._pool.discard(self, lost=True)
        self._ended(exc)

    # -- parsing ---------------------------------------------------------------------------------

    def _head(self, response: Response, data: bytes) -> bytes:
        """Parse the status line and headers; the bytes after them (b"" if incomplete)."""
        while True:
            if data[:2] == b"\r\n":  # a stray empty line before the status line is allowed
                data = data.lstrip(b"\r\n")
            end = data.find(b"\r\n\r\n")
            if end < 0:
                if len(data) > _MAX_HEAD:
                    raise UpstreamProtocolError("the upstream's response headers are too large")
                self._rest = data
                return b""
            head, data = data[:end], data[end + 4 :]
            if (matched := _STATUS_LINE.match(head)) is None:
                line = head.split(b"\r\n", 1)[0][:100]
                raise UpstreamProtocolError(f"the upstream sent a malformed status line: {line!r}")
            status = int(matched[1])
            if status >= 200:
                break
            if status == 101:
                raise UpstreamProtocolError("the upstream switched protocols (HTTP 101)")
            # 1xx: an interim response (103 Early Hints, ...); the final one follows.
        if _FOLDED.search(head) is not None:
            raise UpstreamProtocolError("the upstream folded a header line (obsolete)")
        low = head.lower()
        connection = _field(low, _CONNECTION)
        if head[7:8] == b"1":
            self._keep_alive = connection is None or b"close" not in connection
        else:
            self._keep_alive = connection is not None and b"keep-alive" in connection
        encoding = _field(low, _CONTENT_ENCODING)
        if encoding:
            if encoding in (b"gzip", b"x-gzip"):
                response._encoding = _GZIP
            elif encoding == b"deflate":
                response._encoding = _DEFLATE
            elif encoding != b"identity":
                raise UpstreamProtocolError(
                    f"the upstream used a content-encoding it was not offered: {encoding!r}"
                )
        transfer = _field(low, _TRANSFER_ENCODING)
        if status in (204, 304):
            self._state, self._left = _LENGTH, 0
        elif transfer is not None:
            if transfer != b"chunked":
                raise UpstreamProtocolError(f"unsupported transfer-encoding {transfer!r}")
            self._state = _CHUNK_SIZE
        elif (length := _field(low, _CONTENT_LENGTH)) is not None:
            value = length
            if b"," in length:  # repeated: every copy must agree
                values = {v.strip() for v in length.split(b",")}
                value = values.pop() if len(values) == 1 else b""
            if not value.isdigit() or len(value) > 18:
                raise UpstreamProtocolError(f"the upstream sent a bad content-length {length!r}")
            self._left = int(value)
            self._state = _LENGTH
        else:
            self._state = _UNTIL_CLOSE
            self._keep_alive = False
        response.status = status
        response._head = head
        response._wake()
        if self._state == _LENGTH and not self._left:
            self._finish(not data)  # no body: bytes after the head would be a broken upstream
            return b""
        return data

    def _chunks(self, response: Response, data: bytes) -> None:
        """Transfer-Encoding: chunked, from wherever the previous piece stopped."""
        pos, end, state = 0, len(data), self._state
        while pos < end:
            if state == _CHUNK_DATA:
                take = min(self._left, end - pos)
                response._feed(data if take == end else data[pos : pos + take])
                pos += take
                self._left -= take
                if not self._left:
                    state = _CHUNK_END
            elif state == _CHUNK_END:
                if end - pos < 2:
                    if data[pos:] != b"\r":
                        raise UpstreamProtocolError("the upstream's chunked body is malformed")
                    break
                if data[pos : pos + 2] != b"\r\n":
                    raise UpstreamProtocolError("the upstream's chunked body is malformed")
                pos += 2
                state = _CHUNK_SIZE
            elif state == _CHUNK_SIZE:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > _MAX_LINE:
                        raise UpstreamProtocolError("the upstream's chunk-size line is too long")
                    break
                size = data[pos:eol].split(b";", 1)[0].strip(b" \t")  # extensions are ignored
                if not _HEX.fullmatch(size):
                    raise UpstreamProtocolError(f"the upstream sent a bad chunk size {size!r}")
                pos = eol + 2
                self._left = int(size, 16)
                if self._left:
                    state = _CHUNK_DATA
                else:
                    state = _TRAILERS
                    self._trailers = 0
            else:  # _TRAILERS: header lines after the last chunk, up to an empty line
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > _MAX_TRAILERS:
                        raise UpstreamProtocolError("the upstream's trailers are too large")
                    break
                if eol == pos:
                    self._finish(eol + 2 == end)
                    return
                self._trailers += eol + 2 - pos
                if self._trailers > _MAX_TRAILERS:
                    raise UpstreamProtocolError("the upstream's trailers are too large")
                pos = eol + 2
        self._state = state
        if pos < end:
            self._rest = data[pos:]

    # -- endings ---------------------------------------------------------------------------------

    def _finish(self, reusable: bool) -> None:
        """The response's body is complete: pool the connection, or close it."""
        response = self._response
        assert response is not None
        self._response = None
        self._state = _IDLE
        self._rest = b""
        response._conn = None
        if self._paused:
            self.resume()
        response._complete()
        if reusable and self._keep_alive and not self.closed:
            self._pool.release(self)
        else:
            self.abort()

    def _ended(self, exc: Exception | None) -> None:
        """The server closed the connection (EOF), or it broke (`exc`)."""
        self.closed = True
        self._pool.discard(self)
        response = self._response
        if response is None:
            return
        state = self._state
        if state == _UNTIL_CLOSE and exc is None:
            self._finish(False)
            return
        detail = f": {exc}" if exc else ""
        if state == _HEAD:
            if not self._received and self.reused:
                self.fail(_Stale("the upstream closed a kept-alive connection" + detail))
            else:
                self.fail(
                    UpstreamConnectError("the upstream closed the connection before answering"
                                         + detail)
                )  # fmt: skip
        else:
            self.fail(UpstreamProtocolError("the upstream connection broke mid-stream" + detail))

    def fail(self, exc: Exception) -> None:
        """End the response in progress with `exc`, and drop the connection."""
        response = self._response
        self.abort()
        if response is not None:
            response._conn = None
            response._exc = exc
            response._wake()

    def abort(self) -> None:
        """Close now, without waiting for writes: the upstream sees its client go away."""
        self._response = None
        self._state = _IDLE
        if not self.closed:
            self.closed = True
            self._pool.discard(self)
        if self.transport is not None:
            self.transport.abort()

    def pause(self) -> None:
        if not self._paused and not self.closed:
            self._paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def resume(self) -> None:
        if self._paused:
            self._paused = False
            if not self.closed:
                assert self.transport is not None
                self.transport.resume_reading()


def _field(low: bytes, key: bytes) -> bytes | None:
    """A header's value in a lowercased head (`key` is b"\\r\\nname:"); repeats joined by ","."""
    found = low.find(key)
    if found < 0:
        return None
    start = found + len(key)
    stop = low.find(b"\r\n", start)
    if stop < 0:
        stop = len(low)
    if low.find(key, stop) < 0:  # the usual case: said once
        return low[start:stop].strip(b" \t")
    values = []
    while found >= 0:
        start = found + len(key)
        stop = low.find(b"\r\n", start)
        if stop < 0:
            stop = len(low)
        values.append(low[start:stop].strip(b" \t"))
        found = low.find(key, stop)
    return values[0] if len(values) == 1 else b",".join(values)


class Response:
    """An upstream response whose status and headers have arrived; its body comes by `read()`.

    `usage_injected` is the pipeline's note (gateway.providers.base.UpstreamResponse).
    """

    __slots__ = (
        "_buf",
        "_conn",
        "_decoder",
        "_done",
        "_encoding",
        "_exc",
        "_head",
        "_loop",
        "_raw_done",
        "_size",
        "_waiter",
        "_zmore",
        "_ztail",
        "status",
        "usage_injected",
    )

    def __init__(self, conn: _Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0
        self.usage_injected = False
        self._conn: _Connection | None = conn
        self._loop = loop
        self._buf: list[bytes] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._exc: Exception | None = None
        self._done = False  # the whole body is in `_buf`
        self._raw_done = False  # ... before decompression
        self._head = b""
        self._encoding = 0
        self._decoder: zlib._Decompress | None = None
        self._ztail = b""  # compressed bytes not yet decompressed
        self._zmore = False  # the decompressor may have more output for `_ztail`

    @property
    def headers(self) -> dict[str, str]:
        """The response's headers by lowercased name (repeats joined with ", ")."""
        found: dict[str, str] = {}
        for line in self._head.split(b"\r\n")[1:]:
            name, colon, value = line.partition(b":")
            if colon:
                key = name.strip().lower().decode("latin-1")
                text = value.strip().decode("latin-1")
                found[key] = f"{found[key]}, {text}" if key in found else text
        return found

    async def read(self) -> bytes:
        """The body received so far and not yet read, as soon as there is some; b"" at its end.
        Raises `UpstreamProtocolError` when the connection broke (after what came before it)."""
        while True:
            buf = self._buf
            if buf:
                data = buf[0] if len(buf) == 1 else b"".join(buf)
                buf.clear()
                self._size = 0
                conn = self._conn
                if conn is not None and conn._paused and not self._zmore:
                    conn.resume()
                return data
            if self._zmore:
                self._inflate_more()
                continue
            if self._done:
                return b""
            if self._exc is not None:
                raise self._exc
            # Cancelled here (a pipeline timeout, the client gone), the response stays as it
            # is: a drain may read on, else close() drops it. The connection is pooled only
            # once its body has ended cleanly, so it is never reused half-read.
            waiter = self._waiter = self._loop.create_future()
            await waiter

    def close(self) -> None:
        """Drop the connection unless the body has already arrived whole (then it is pooled)."""
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abort()
        self._buf.clear()
        self._zmore = False
        if not self._done and self._exc is None:
            self._exc = UpstreamProtocolError("the upstream response was closed")
        self._wake()

    # -- fed by the connection -------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _feed(self, data: bytes) -> None:
        if self._encoding:
            self._inflate(data)
        else:
            self._buf.append(data)
            self._size += len(data)
        if (self._size > HIGH_WATER or self._zmore) and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _complete(self) -> None:
        self._raw_done = True
        if not self._zmore:
            self._end_body()
        self._wake()

    def _inflate(self, data: bytes) -> None:
        if self._zmore:  # earlier input still waits for its turn: keep the order
            self._ztail += data
            return
        if not data:
            return
        if self._decoder is None:
            # RFC 1950 zlib stream for deflate, or raw deflate as some servers send it.
            raw = self._encoding == _DEFLATE and data[0] & 0x0F != 8
            wbits = 16 + zlib.MAX_WBITS if self._encoding == _GZIP else zlib.MAX_WBITS
            self._decoder = zlib.decompressobj(-zlib.MAX_WBITS if raw else wbits)
        self._ztail = data
        self._inflate_more()

    def _inflate_more(self) -> None:
        decoder = self._decoder
        assert decoder is not None
        try:
            out = decoder.decompress(self._ztail, _INFLATE_STEP)
        except zlib.error:
            raise self._bad_encoding() from None
        self._ztail = decoder.unconsumed_tail
        self._zmore = bool(self._ztail) or len(out) >= _INFLATE_STEP
        if out:
            self._buf.append(out)
            self._size += len(out)
        if not self._zmore:
            if self._raw_done:
                self._end_body()
            elif (conn := self._conn) is not None and conn._paused and self._size <= HIGH_WATER:
                conn.resume()

    def _end_body(self) -> None:
        decoder = self._decoder
        if decoder is not None:
            try:
                rest = decoder.flush()
            except zlib.error:
                raise self._bad_encoding() from None
            if rest:
                self._buf.append(rest)
            if not decoder.eof:
                raise self._bad_encoding()
        self._done = True

    def _bad_encoding(self) -> UpstreamProtocolError:
        """Fail the response (the connection is dropped); the error, for the caller to raise."""
        self._zmore = False
        conn = self._conn
        if conn is not None:
            self._conn = None
            conn.abort()
        self._exc = UpstreamProtocolError("the upstream's compressed body is invalid")
        return self._exc
