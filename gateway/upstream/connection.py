"""One upstream HTTP/1.1 connection: the request out, the response's framing in.

`Connection` is the asyncio protocol of one socket. `exchange` writes a request (the head an
`Endpoint` encoded once, its Content-Length, the body) and waits for the status line and headers
(1xx interim answers skipped); `data_received` then frames the body as it arrives: by
Content-Length, chunked (extensions ignored, trailers skipped), or up to the connection's close.
`Response` holds the body received and not yet read, undoes gzip and deflate 64 KiB a step, and
pauses the socket while too much waits unread.

It speaks to the pool that made it only through `Pool` (`opened`, `release`, `discard`); the
pool drives it by `exchange`, `fail` and `abort`, and keeps its bookkeeping on it (`key`,
`in_pool`, `idle_since`, `reused`).
"""

from __future__ import annotations

import asyncio
import re
import zlib
from itertools import repeat
from typing import Protocol, cast

from gateway.errors import UpstreamConnectError, UpstreamProtocolError

# Unread body bytes held before the socket stops being read (the upstream then waits on TCP).
HIGH_WATER = 64 * 1024
# How long a response closed with keep_alive waits for its body's end before it is dropped.
KEEP_ALIVE_WAIT_S = 5.0
# The most one decompression step may produce: a small gzip bomb is undone step by step as it
# is read, never all at once into memory.
_INFLATE_STEP = HIGH_WATER
_MAX_HEAD = 64 * 1024
_MAX_LINE = 4 * 1024  # a chunk-size line, extensions included
_MAX_TRAILERS = 64 * 1024
# Bodies up to this size go out in one write with their head (one send, one segment or few).
_JOIN_WRITE = 64 * 1024
# The most one `read()` returns. A socket read can be 256 KiB (uvloop's), and a reader's work
# on it (a stream's frames split out, the slice held for the client) is as big again, several
# times over; in pieces of 64 KiB those copies are a quarter the size.
READ_MAX = 64 * 1024

# Parser states of a connection.
_IDLE, _HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _CHUNK_END, _TRAILERS, _UNTIL_CLOSE = range(8)
_GZIP, _DEFLATE = 1, 2

_HEX = re.compile(rb"[0-9A-Fa-f]{1,15}")
_HEX_DIGITS = b"0123456789ABCDEFabcdef"
_FOLDED = re.compile(rb"\r\n[ \t]")  # obsolete line folding, refused
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})(?:[ \r]|\Z)")
_CONNECTION = b"\r\nconnection:"
_TRANSFER_ENCODING = b"\r\ntransfer-encoding:"
_CONTENT_LENGTH = b"\r\ncontent-length:"
_CONTENT_ENCODING = b"\r\ncontent-encoding:"

# (scheme, host, port, route): the origin a connection is open to and how (the route: its
# proxy and TLS context, "" for a direct one with the pool's default), and the pool's key for it.
PoolKey = tuple[str, str, int, str]


class _Inflater(Protocol):
    """What a body's decoder is: `zlib.decompressobj()` (whose class zlib does not name)."""

    @property
    def unconsumed_tail(self) -> bytes: ...

    @property
    def eof(self) -> bool: ...

    def decompress(self, data: bytes, max_length: int = ..., /) -> bytes: ...

    def flush(self, length: int = ..., /) -> bytes: ...


class Pool(Protocol):
    """What a connection tells the pool that made it."""

    def opened(self, conn: Connection, /) -> None:
        """`conn`'s socket is connected: count it open until it is lost."""

    def release(self, conn: Connection, /) -> None:
        """`conn`'s response ended cleanly and it may carry another request: keep it idle."""

    def discard(self, conn: Connection, /, *, lost: bool = False) -> None:
        """`conn` is closed (and, once `lost`, its transport gone): never hand it out again."""


class StaleConnection(UpstreamConnectError):
    """A reused connection closed before any byte of its response: what a server's keep-alive
    timeout does to a request sent just as it closed the idle connection. `UpstreamPool.post`
    sends such a request once more on a new connection. (A server that read the request and
    then closed without answering gets it twice; the pipeline would have retried that connect
    error too, after a backoff and with a mark against the deployment's health.)"""


class Connection(asyncio.Protocol):
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

    def __init__(self, pool: Pool, key: PoolKey, loop: asyncio.AbstractEventLoop):
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

    async def exchange(self, prefix: bytes, body: bytes, extra: bytes | None = None) -> Response:
        """Send a request, `prefix` (an `Endpoint`'s head up to its Content-Length's value),
        the header lines `extra` if any, and `body`; wait for the response's status and
        headers."""
        transport = self.transport
        assert transport is not None
        response = Response(self, self.loop)
        self._response = response
        self._state = _HEAD
        self._received = False
        if extra is None:
            head = prefix + b"%d\r\n\r\n" % len(body)
        else:
            head = prefix + b"%d\r\n%s\r\n" % (len(body), extra)
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
        self._pool.opened(self)

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
        """Transfer-Encoding: chunked, from wherever the previous piece stopped.

        A streaming upstream sends one chunk per event, so a busy stream's read holds many
        small chunks: a read of nothing but whole ones is split in one go (`_whole_chunks`);
        any other is walked, each whole chunk taken in a few C calls. Either way the read's
        data is handed on at once."""
        pos, end, state = 0, len(data), self._state
        parts: list[bytes] = []  # this read's chunk data, handed on together
        if state == _CHUNK_SIZE and data.count(b"\r\n") > 4:
            # The usual read of a busy stream: whole chunks, perhaps then the body's last one
            # (walked below). One or two chunks are walked: fewer steps than the checks.
            whole = data[:-5] if data.endswith(b"\r\n0\r\n\r\n") else data
            if taken := _whole_chunks(whole):
                parts, pos = taken, len(whole)
        while pos < end:
            if state == _CHUNK_SIZE:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > _MAX_LINE:
                        raise UpstreamProtocolError("the upstream's chunk-size line is too long")
                    break
                size = data[pos:eol]
                if eol - pos > 15 or size.strip(_HEX_DIGITS) or not size:
                    size = size.split(b";", 1)[0].strip(b" \t")  # extensions are ignored
                    if not _HEX.fullmatch(size):
                        raise UpstreamProtocolError(f"the upstream sent a bad chunk size {size!r}")
                pos = eol + 2
                left = int(size, 16)
                if not left:
                    state = _TRAILERS
                    self._trailers = 0
                    continue
                stop = pos + left
                if data[stop : stop + 2] == b"\r\n":  # the whole chunk is in this read
                    parts.append(data[pos:stop])
                    pos = stop + 2
                    continue
                self._left, state = left, _CHUNK_DATA
            elif state == _CHUNK_DATA:
                take = min(self._left, end - pos)
                parts.append(data if take == end else data[pos : pos + take])
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
            else:  # _TRAILERS: header lines after the last chunk, up to an empty line
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    if end - pos > _MAX_TRAILERS:
                        raise UpstreamProtocolError("the upstream's trailers are too large")
                    break
                if eol == pos:
                    if parts:
                        response._feed_all(parts)
                    self._finish(eol + 2 == end)
                    return
                self._trailers += eol + 2 - pos
                if self._trailers > _MAX_TRAILERS:
                    raise UpstreamProtocolError("the upstream's trailers are too large")
                pos = eol + 2
        if parts:
            response._feed_all(parts)
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
                self.fail(StaleConnection("the upstream closed a kept-alive connection" + detail))
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
        "_discarding",
        "_done",
        "_encoding",
        "_exc",
        "_give_up",
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

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.status = 0
        self.usage_injected = False
        self._conn: Connection | None = conn
        self._loop = loop
        # (a memoryview: the rest of a received piece bigger than READ_MAX, not copied)
        self._buf: list[bytes | memoryview] = []
        self._size = 0
        self._waiter: asyncio.Future[None] | None = None
        self._exc: Exception | None = None
        self._done = False  # the whole body is in `_buf`
        self._raw_done = False  # ... before decompression
        self._head = b""
        self._encoding = 0
        self._decoder: _Inflater | None = None
        self._ztail = b""  # compressed bytes not yet decompressed
        self._zmore = False  # the decompressor may have more output for `_ztail`
        self._discarding = False  # closed with keep_alive: the rest of the body is dropped
        self._give_up: asyncio.TimerHandle | None = None  # ... unless it ends before this

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
                if self._size <= READ_MAX:
                    data = buf[0] if len(buf) == 1 else b"".join(buf)
                    buf.clear()
                    self._size = 0
                else:
                    data = self._take(READ_MAX)
                conn = self._conn
                resume = not self._zmore and self._size <= HIGH_WATER
                if conn is not None and conn._paused and resume:
                    conn.resume()
                return bytes(data)  # (a copy only where it was a memoryview)
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

    def _take(self, most: int) -> bytes:
        """The first `most` bytes of the buffer (which holds more), in order."""
        buf, taken, size = self._buf, [], 0
        while size < most:
            piece = buf[0]
            if size + len(piece) <= most:
                taken.append(piece)
                size += len(piece)
                del buf[0]
                continue
            view = piece if type(piece) is memoryview else memoryview(piece)
            taken.append(view[: most - size])
            buf[0] = view[most - size :]
            size = most
        self._size -= size
        return b"".join(taken)

    def close(self, *, keep_alive: bool = False) -> None:
        """Drop the connection unless the body has already arrived whole (then it is pooled).

        `keep_alive`: the reader has all it needs, though the body may not have ended yet (a
        provider's last chunk often follows its `[DONE]` in a read of its own): what still
        comes is dropped as it arrives, and the connection is pooled once the body ends,
        within `KEEP_ALIVE_WAIT_S`, else dropped then. Dropped at once, every stream would
        cost the next request a new connection (a TLS handshake, for a real provider)."""
        conn = self._conn
        if conn is not None and keep_alive and self._exc is None and not conn.closed:
            self._buf.clear()
            self._size = 0
            self._zmore = False
            self._discarding = True
            if conn._paused:
                conn.resume()
            self._give_up = self._loop.call_later(KEEP_ALIVE_WAIT_S, self.close)
            return
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
        self._feed_all((data,))

    def _feed_all(self, parts: list[bytes] | tuple[bytes]) -> None:
        """Body bytes received (in one read or more), for the reader, woken once."""
        if self._discarding:
            return
        if self._encoding:
            for data in parts:
                self._inflate(data)
        else:
            self._buf += parts
            self._size += sum(map(len, parts))
        if (self._size > HIGH_WATER or self._zmore) and self._conn is not None:
            self._conn.pause()
        self._wake()

    def _complete(self) -> None:
        self._raw_done = True
        if self._give_up is not None:
            self._give_up.cancel()
            self._give_up = None
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


def _whole_chunks(data: bytes) -> list[bytes] | None:
    """A read that is whole chunks one after another, each of data without a CRLF and none
    the last (zero-size) one, as their data; None for any other read (`_chunks` walks it).
    One split of the read at every CRLF, then its sizes checked all at once: a chunk whose
    data holds a CRLF comes out shorter than its size says, so it fails the check."""
    lines = data.split(b"\r\n")
    if len(lines) < 3 or lines[-1]:  # (it ends inside a chunk)
        return None
    sizes, parts = lines[0:-1:2], lines[1::2]
    if (
        len(sizes) != len(parts)
        or b"".join(sizes).translate(None, _HEX_DIGITS)
        or not 0 < min(map(len, sizes)) <= max(map(len, sizes)) <= 15
    ):
        return None  # a chunk extension, a size that is no hex number, an empty line
    if list(map(len, parts)) != list(map(int, sizes, repeat(16))) or not all(parts):
        return None
    return parts
