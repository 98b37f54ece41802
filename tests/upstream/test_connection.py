"""One upstream HTTP/1.1 connection (gateway.upstream.connection), its parser fed directly.

Each response is handed to the protocol in pieces, split at every byte, with a fake transport
underneath: the framing (Content-Length, chunked with extensions and trailers, interim answers),
gzip undone step by step, the high-water pause, and what a malformed answer does. The same
client over real sockets is tests/upstream/test_pool.py.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import UpstreamProtocolError
from gateway.upstream import connection
from gateway.upstream.connection import HIGH_WATER, READ_MAX, Connection, Response
from gateway.upstream.pool import Endpoint, UpstreamPool


async def read_all(response: Response) -> bytes:
    parts = []
    while chunk := await response.read():
        parts.append(chunk)
    assert await response.read() == b""  # and it stays at its end
    return b"".join(parts)


def ok(body: bytes, *headers: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.aborted = False
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.aborted

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False


@dataclass
class Fed:
    pool: UpstreamPool
    conn: Connection
    transport: FakeTransport
    response: Response


async def feed(*pieces: bytes, url: str = "http://upstream.test/v1/chat") -> Fed:
    """A response parsed from `pieces`, each handed to the protocol as one read."""
    pool = UpstreamPool()
    endpoint = Endpoint(url, {})
    conn = Connection(pool, endpoint.key, asyncio.get_running_loop())
    transport = FakeTransport()
    conn.connection_made(transport)
    exchange = asyncio.ensure_future(conn.exchange(endpoint.prefix, b"{}"))
    await asyncio.sleep(0)  # the exchange sends its request and waits for the head
    assert transport.written.startswith(b"POST /v1/chat HTTP/1.1\r\n")
    for piece in pieces:
        if not conn.closed:
            conn.data_received(piece)
    return Fed(pool, conn, transport, await exchange)


CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/event-stream\r\n\r\n"
    b"7;name=value\r\ndata: a\r\n"
    b'B ; quoted="x;y" ; bare\r\n\n\ndata: bc\n\r\n'
    b"2\r\n\n\n\r\n"
    b"0;last\r\nX-Trailer: 1\r\nX-Other: two words\r\n\r\n"
)
CHUNKED_BODY = b"data: a\n\ndata: bc\n\n\n"
# A streaming upstream's shape: one chunk per event, many of them in one read (the parser's
# fast path), sizes in either case of hex, a chunk whose data holds CRLF itself.
EVENTS = [b'data: {"n":%d}\n\n' % i for i in range(12)] + [b"data: a\r\n\r\n", b"x" * 300]
SSE_CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%X\r\n%s\r\n" % (len(e), e) if i % 2 else b"%x\r\n%s\r\n" % (len(e), e)
               for i, e in enumerate(EVENTS))
    + b"0\r\n\r\n"
)  # fmt: skip


@pytest.mark.parametrize(
    ("raw", "body"),
    [
        (CHUNKED, CHUNKED_BODY),
        (SSE_CHUNKED, b"".join(EVENTS)),
        (ok(b'{"ok": true}'), b'{"ok": true}'),
        (
            ok(gzip.compress(b"squeezed " * 100), "Content-Encoding: gzip"),
            b"squeezed " * 100,
        ),
        (
            b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n" + ok(b"after the hint"),
            b"after the hint",
        ),
    ],
    ids=["chunked-extensions-trailers", "chunk-per-event", "content-length", "gzip", "interim-103"],
)
async def test_any_split_into_reads_gives_the_same_body_and_pools_the_connection(
    raw: bytes, body: bytes
) -> None:
    splits = [[raw], [raw[i : i + 1] for i in range(len(raw))]]
    splits += [[raw[:i], raw[i:]] for i in range(1, len(raw))]
    for pieces in splits:
        fed = await feed(*pieces)
        assert fed.response.status == 200
        assert await read_all(fed.response) == body, pieces
        assert fed.conn.in_pool and not fed.transport.aborted, pieces
        await fed.pool.close()


async def test_no_content_has_no_body() -> None:
    fed = await feed(b"HTTP/1.1 204 No Content\r\nContent-Length: 7\r\n\r\n")
    assert fed.response.status == 204
    assert await read_all(fed.response) == b""
    assert fed.conn.in_pool
    await fed.pool.close()


async def test_headers_are_parsed_only_when_asked_for_case_insensitively() -> None:
    fed = await feed(ok(b"x", "Retry-After: 7", "X-Repeated: a", "x-repeated: b"))
    assert fed.response.headers["retry-after"] == "7"
    assert fed.response.headers["x-repeated"] == "a, b"
    assert fed.response.headers["content-length"] == "1"
    await fed.pool.close()


async def test_reading_pauses_past_the_high_water_mark_and_resumes_when_drained() -> None:
    big = b"x" * (HIGH_WATER + 1)
    fed = await feed(ok(big + big)[: -len(big)])  # the head and the first half
    assert fed.transport.paused
    assert await fed.response.read() == big[:READ_MAX]
    assert not fed.transport.paused  # what is left is under the mark
    assert await fed.response.read() == big[READ_MAX:]
    fed.conn.data_received(big)
    assert await read_all(fed.response) == big
    assert fed.conn.in_pool
    await fed.pool.close()


async def test_a_read_returns_at_most_read_max_however_the_bytes_came() -> None:
    # One socket read of 256 KiB (uvloop's), then small ones, then another large one: the
    # reader gets them in order, in pieces of at most READ_MAX, and reading stays paused
    # while more than the high-water mark waits.
    body = bytes(range(256)) * 1024 * 2 + b"tail" + bytes(range(7, 256)) * 1000
    cuts = [0, 4 * READ_MAX + 5, 4 * READ_MAX + 9, 4 * READ_MAX + 300, len(body)]
    whole = ok(body)
    head = len(whole) - len(body)
    reads = [body[a:b] for a, b in itertools.pairwise(cuts[1:])]
    fed = await feed(whole[: head + cuts[1]], *reads)
    pieces = []
    while piece := await fed.response.read():
        assert len(piece) <= READ_MAX and type(piece) is bytes
        pieces.append(piece)
        if fed.transport.paused:
            assert fed.response._size > HIGH_WATER
    assert b"".join(pieces) == body
    assert len(pieces) == -(-len(body) // READ_MAX)  # each full but the last
    await fed.pool.close()


async def test_a_compression_bomb_is_undone_step_by_step_as_it_is_read() -> None:
    size = 64 * HIGH_WATER  # 16 MiB of zeros: about 16 KiB compressed
    fed = await feed(ok(gzip.compress(bytes(size)), "Content-Encoding: gzip"))
    pieces = []
    while piece := await fed.response.read():
        assert len(piece) <= 2 * HIGH_WATER  # never the whole body at once
        pieces.append(len(piece))
    assert sum(pieces) == size and len(pieces) > 10
    await fed.pool.close()


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 2000 OK\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
        b"SSH-2.0-OpenSSH_9.6\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello",
        b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 1\r\n\r\nx",
        b"HTTP/1.1 200 OK\r\nX-Folded: a\r\n b\r\nContent-Length: 1\r\n\r\nx",
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    ],
    ids=[
        "status",
        "version",
        "not-http",
        "conflicting-lengths",
        "negative-length",
        "transfer-coding",
        "unoffered-encoding",
        "folded-header",
        "switching-protocols",
    ],
)
async def test_a_malformed_head_is_a_protocol_error(raw: bytes) -> None:
    with pytest.raises(UpstreamProtocolError):
        fed = await feed(raw)
        await read_all(fed.response)


@pytest.mark.parametrize(
    "raw",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
        # What int(size, 16) would take but HTTP's hex digits are not.
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0_5\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\nhello\r\n0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"1" * 5000,
        ok(b"not gzip at all", "Content-Encoding: gzip"),
        ok(gzip.compress(b"cut short")[:-9], "Content-Encoding: gzip"),
    ],
    ids=[
        "chunk-size",
        "chunk-size-0x",
        "chunk-size-sign",
        "chunk-size-underscore",
        "chunk-size-empty",
        "chunk-end",
        "chunk-size-line",
        "bad-gzip",
        "truncated-gzip",
    ],
)
async def test_a_malformed_body_is_a_protocol_error_and_the_connection_is_dropped(
    raw: bytes,
) -> None:
    fed = await feed(raw)
    with pytest.raises(UpstreamProtocolError):
        await read_all(fed.response)
    assert fed.transport.aborted and not fed.conn.in_pool
    await fed.pool.close()


async def test_bytes_after_the_body_are_not_pooled() -> None:
    fed = await feed(ok(b"body") + b"garbage")
    assert await read_all(fed.response) == b"body"
    assert fed.transport.aborted and not fed.conn.in_pool
    await fed.pool.close()


# Many whole one-event chunks in a read, as a stream's reads hold them.
_MANY = b"".join(
    b"%x\r\n%s\r\n" % (len(e), e) for e in [b'data: {"i": %d}\n\n' % i for i in range(40)]
)
_CHUNKED_HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


@pytest.mark.parametrize(
    "bad",
    [b"zz\r\nhello\r\n", b"0x5\r\nhello\r\n", b"+5\r\nhello\r\n", b"0_5\r\nhello\r\n",
     b"\r\nhello\r\n", b"5\r\nhelloXX", b"1" * 5000],
    ids=["size", "size-0x", "size-sign", "size-underscore", "size-empty", "end", "size-line"],
)  # fmt: skip
@pytest.mark.parametrize("where", ["after", "between"])
async def test_a_malformed_chunk_among_many_whole_ones_is_a_protocol_error(
    bad: bytes, where: str
) -> None:
    body = _MANY + bad if where == "after" else _MANY + bad + _MANY
    # The last chunk in a read of its own: the read before it is all whole chunks.
    fed = await feed(_CHUNKED_HEAD + body, b"0\r\n\r\n")
    with pytest.raises(UpstreamProtocolError):
        await read_all(fed.response)
    assert fed.transport.aborted and not fed.conn.in_pool
    await fed.pool.close()


_chunk_data = st.binary(min_size=1, max_size=40) | st.sampled_from(
    [b"data: a\r\n\r\n", b"\r\n", b"\r", b"\n\n", b"data: {}\n\n"]
)


# A chunk's data and how its size line is written (extensions and padding included).
_sized_chunk = st.tuples(_chunk_data, st.sampled_from(["%x", "%X", "%03x", "%x;ext=1", "%x "]))


def _chunked(data: bytes, size: str) -> bytes:
    return (size % len(data)).encode() + b"\r\n" + data + b"\r\n"


async def _reads_back_whole(fed: Fed, chunks: list[tuple[bytes, str]]) -> None:
    assert await read_all(fed.response) == b"".join(data for data, _ in chunks)
    assert fed.conn.in_pool and not fed.transport.aborted
    await fed.pool.close()


@settings(max_examples=150, deadline=None)
@given(st.lists(_sized_chunk, min_size=1, max_size=60), st.lists(st.integers(0, 4000), max_size=6))
async def test_any_chunked_body_split_anywhere_reads_back_whole(
    chunks: list[tuple[bytes, str]], cuts: list[int]
) -> None:
    raw = _CHUNKED_HEAD + b"".join(_chunked(*chunk) for chunk in chunks) + b"0\r\n\r\n"
    head = len(_CHUNKED_HEAD)  # the head whole in the first read, the body cut anywhere
    at = sorted({head + c for c in cuts if head + c < len(raw)})
    pieces = [raw[a:b] for a, b in zip([0, *at], [*at, len(raw)], strict=True)]
    await _reads_back_whole(await feed(*pieces), chunks)


@settings(max_examples=150, deadline=None)
@given(st.lists(_sized_chunk, min_size=1, max_size=30), st.sets(st.integers(1, 30)))
async def test_a_chunked_body_read_a_few_whole_chunks_at_a_time_reads_back_whole(
    chunks: list[tuple[bytes, str]], ends: set[int]
) -> None:
    # Reads that end where a chunk ends, as a stream's usually do: one of three chunks or more,
    # all plain (no extension, no CRLF in their data), is read at once; any other is walked.
    whole = [_chunked(*chunk) for chunk in chunks]
    at = sorted(e for e in ends if e < len(whole))
    reads = [b"".join(whole[a:b]) for a, b in zip([0, *at], [*at, len(whole)], strict=True)]
    await _reads_back_whole(await feed(_CHUNKED_HEAD, *reads, b"0\r\n\r\n"), chunks)


def test_a_read_is_taken_whole_only_when_it_is_plain_whole_chunks() -> None:
    assert connection._whole_chunks(b"5\r\nhello\r\n2\r\nhi\r\n") == [b"hello", b"hi"]
    for read in [
        b"5\r\nhello\r\n2\r\nh",  # ends inside a chunk
        b"5\r\nhello\r\n2\r\n",  # ends after a size line
        b"7\r\nhe\r\nlo\r\n",  # its data holds a CRLF
        b"5;x=1\r\nhello\r\n",  # an extension
        b"0x5\r\nhello\r\n",
        b"5\r\nhello\r\n0\r\n\r\n",  # the last chunk
        b"\r\nhello\r\n",
    ]:
        assert connection._whole_chunks(read) is None, read


async def test_closed_once_read_enough_the_connection_is_pooled_when_its_body_ends() -> None:
    fed = await feed(_CHUNKED_HEAD + _MANY)  # the body not ended yet
    assert (await fed.response.read()).startswith(b'data: {"i": 0}')
    fed.response.close(keep_alive=True)
    assert not fed.conn.in_pool and not fed.transport.aborted
    fed.conn.data_received(b"9\r\ndata: x\n\n\r\n0\r\n\r\n")  # more, dropped, then the end
    assert fed.conn.in_pool and not fed.transport.aborted
    assert await fed.response.read() == b""
    await fed.pool.close()


async def test_closed_once_read_enough_a_body_that_never_ends_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(connection, "KEEP_ALIVE_WAIT_S", 0.0)
    fed = await feed(_CHUNKED_HEAD + _MANY)
    fed.response.close(keep_alive=True)
    async with asyncio.timeout(5):
        while not fed.transport.aborted:
            await asyncio.sleep(0)  # the wait's timer, due at once
    assert not fed.conn.in_pool
    await fed.pool.close()


async def test_closed_once_read_enough_a_broken_response_is_dropped_at_once() -> None:
    fed = await feed(_CHUNKED_HEAD + b"zz\r\n")
    with pytest.raises(UpstreamProtocolError):
        await read_all(fed.response)
    fed.response.close(keep_alive=True)
    assert fed.transport.aborted and not fed.conn.in_pool
    await fed.pool.close()
