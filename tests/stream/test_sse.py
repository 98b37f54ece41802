"""The SSE decoder: real provider streams split at every byte offset decode identically."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.stream.sse import SSEDecoder, SSEFrame, SSEFrameTooLarge
from tests.fakes import FIXTURES, fixture_bytes

ALL = sorted(p.name for p in FIXTURES.glob("*.sse"))
SMALL = [n for n in ALL if len(fixture_bytes(n)) <= 8_000]


def decode(*pieces: bytes) -> list[SSEFrame]:
    decoder = SSEDecoder()
    frames: list[SSEFrame] = []
    for piece in pieces:
        frames += decoder.feed(piece)
    return frames + decoder.flush()


@pytest.mark.parametrize("name", ALL)
def test_one_byte_at_a_time_equals_all_at_once(name: str) -> None:
    body = fixture_bytes(name)
    whole = decode(body)
    assert b"".join(f.raw for f in whole) == body
    assert all(f.complete for f in whole)
    assert decode(*(body[i : i + 1] for i in range(len(body)))) == whole


@pytest.mark.parametrize("name", SMALL)
def test_split_in_two_at_every_offset(name: str) -> None:
    body = fixture_bytes(name)
    whole = decode(body)
    for i in range(len(body) + 1):
        assert decode(body[:i], body[i:]) == whole, f"split at {i}"


@pytest.mark.parametrize("name", sorted(set(ALL) - set(SMALL)))
def test_large_streams_split_in_two_at_a_stride(name: str) -> None:
    body = fixture_bytes(name)
    whole = decode(body)
    for i in range(0, len(body) + 1, 211):
        assert decode(body[:i], body[i:]) == whole, f"split at {i}"


def test_fields_comments_and_line_endings() -> None:
    body = (
        b': keep-alive\r\nevent: error\r\ndata: {"a":\r\ndata:  1}\r\nid: 7\r\n\r\n'
        b"data: x\rdata: y\r\r"
    )
    frames = decode(body)
    assert [(f.event, f.data, f.id) for f in frames] == [
        ("error", '{"a":\n 1}', "7"),
        (None, "x\ny", None),
    ]
    assert b"".join(f.raw for f in frames) == body


def test_a_cr_at_the_end_of_a_piece_waits_for_its_lf() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\r\n\r") == []
    frames = decoder.feed(b"\ndata: b\n\n")
    assert [f.raw for f in frames] == [b"data: a\r\n\r\n", b"data: b\n\n"]


def test_comment_only_frames_have_no_data_but_keep_their_bytes() -> None:
    frames = decode(b": OPENROUTER PROCESSING\n\n")
    assert frames == [SSEFrame(raw=b": OPENROUTER PROCESSING\n\n")]


def test_a_torn_tail_is_flushed_incomplete() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"x": 1}\n') == []
    [tail] = decoder.flush()
    assert tail.complete is False
    assert tail.data == '{"x": 1}'
    assert tail.raw == b'data: {"x": 1}\n'
    assert decoder.flush() == []


def test_a_leading_bom_is_ignored() -> None:
    assert decode(b"\xef\xbb\xbfdata: 1\n\n")[0].data == "1"


def test_an_endless_frame_is_refused() -> None:
    decoder = SSEDecoder(max_frame_bytes=1000)
    with pytest.raises(SSEFrameTooLarge):
        for _ in range(20):
            decoder.feed(b"data: " + b"x" * 100)


LINES = st.sampled_from(
    [b"data: x", b'data: {"a":1}', b"data:", b"data", b"event: e", b"id: 7", b": c", b"", b"z: q"]
)


@st.composite
def lf_streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """`\\n`-only streams (the fast mode's) with empty frames, runs of blank lines, comments and
    multi-line data, perhaps after a byte order mark or a first frame, and where to cut them."""
    body = b"".join(line + b"\n" for line in draw(st.lists(LINES, max_size=40)))
    body = draw(st.sampled_from([b"", b"\xef\xbb\xbf", b"data: first\n\n"])) + body
    cuts = sorted(draw(st.lists(st.integers(0, len(body)), max_size=6)))
    return body, cuts


@given(lf_streams())
@settings(max_examples=300, deadline=None)
def test_fast_mode_frames_equal_the_line_by_line_reading(case: tuple[bytes, list[int]]) -> None:
    body, cuts = case
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    reference = SSEDecoder()
    reference._lines_mode = True  # the general reader, as a `\r` in the stream would pick
    want = [f for piece in pieces for f in reference.feed(piece)] + reference.flush()
    assert decode(*pieces) == want


def split_decode(*pieces: bytes) -> tuple[list[SSEFrame], list[bytes]]:
    """What the relay's fast path does: `split` a read where it can (each piece back through
    `frame`), `feed` it where not; and the bytes each split read's frames spanned."""
    decoder = SSEDecoder()
    frames: list[SSEFrame] = []
    spans: list[bytes] = []
    for piece in pieces:
        split = decoder.split(piece) if piece else None
        if split is None:
            frames += decoder.feed(piece)
            continue
        span, parts = split
        assert span == b"".join(part + b"\n\n" for part in parts)
        spans.append(span)
        frames += [decoder.frame(part + b"\n\n") for part in parts]
    return frames + decoder.flush(), spans


@given(lf_streams(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_split_reads_give_the_frames_feed_gives(
    case: tuple[bytes, list[int]], with_cr: bool
) -> None:
    body, cuts = case
    if with_cr:  # a `\r` somewhere: the line-by-line reading takes over from that read on
        body = body.replace(b"x\n", b"x\r\n", 1)
        cuts = [min(c, len(body)) for c in cuts]
    pieces = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    frames, spans = split_decode(*pieces)
    assert frames == decode(*pieces)
    assert all(span in body for span in spans)  # the upstream's bytes, unchanged


@pytest.mark.parametrize("name", SMALL)
def test_real_streams_split_in_two_at_every_offset_give_the_same_frames(name: str) -> None:
    body = fixture_bytes(name)
    want = decode(body)
    for cut in range(1, len(body), 7):
        assert split_decode(body[:cut], body[cut:])[0] == want


def test_split_refuses_an_endless_frame_too() -> None:
    decoder = SSEDecoder(max_frame_bytes=1000)
    with pytest.raises(SSEFrameTooLarge):
        for _ in range(20):
            decoder.split(b"data: " + b"x" * 100)
