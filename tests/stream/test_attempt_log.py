"""The attempt log keeps what the old list of timed events kept, in a few bytes a delta.

The reference everywhere is the old representation: every event as `(ms, event)` in a list,
`events[:mark]` as the delivered prefix, `compact()` for the stream, `BlockAssembler.of()` for
the blocks. The log must give the same answers, and the same JSON byte for byte.
"""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.providers.wire import ANTHROPIC, OPENAI_CHAT, OPENAI_RESPONSES, stream_parser
from gateway.storage.payload import DeferredPayload
from gateway.stream import attempt_log
from gateway.stream import compact as compact_module
from gateway.stream.assembler import BlockAssembler
from gateway.stream.attempt_log import AttemptLog
from gateway.stream.compact import CompactRecords, Timed, compact
from gateway.stream.events import (
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamEvent,
    StreamFailure,
    Usage,
)
from gateway.stream.sse import SSEDecoder
from tests.fakes import FIXTURES, fixture_bytes

Frames = list[tuple[float, list[StreamEvent]]]  # what arrived together, and when


def _wire(name: str) -> str:
    if name.startswith("anthropic-"):
        return ANTHROPIC
    if name.startswith("openai-responses-"):
        return OPENAI_RESPONSES
    return OPENAI_CHAT


def fixture_frames(name: str) -> Frames:
    parser = stream_parser(_wire(name))
    frames: Frames = []
    for i, frame in enumerate(SSEDecoder().feed(fixture_bytes(name))):
        events = parser.feed(frame)[0]
        if events:
            frames.append((i * 7.3 + 0.4, events))
    return frames


def logged(frames: Frames) -> tuple[AttemptLog, list[Timed]]:
    """The log of `frames` (a mark after each), and the old representation of them."""
    log = AttemptLog(started=0.0)
    timed: list[Timed] = []
    for t, events in frames:
        log.add(events, t)
        log.mark()
        timed += [(t, e) for e in events]
    return log, timed


def replayed(log: AttemptLog, end: int) -> tuple[bytes, BlockAssembler]:
    """The compact stream's JSON as the store writes it, and the blocks."""
    stream = CompactRecords()
    assembler = BlockAssembler()
    log.replay(end, stream, assembler)
    records = stream.done()
    # Long runs are written from the log when stored, as often as asked (a retried write):
    # the same bytes each time, and the same through orjson's `default`.
    stored = bytes(DeferredPayload({"stream": records}).encode())
    assert bytes(DeferredPayload({"stream": records}).encode()) == stored
    by_default = orjson.dumps(records, default=compact_module.default)
    assert stored == b'{"stream":' + by_default + b"}"
    assert stream.deferred == (b"Batches" in repr(records).encode())
    return by_default, assembler


def contents(assembler: BlockAssembler) -> tuple[object, ...]:
    return (
        [b.to_content() for b in assembler.blocks()],
        [b.to_content() for b in assembler.interrupted_blocks()],
        [b.closed for b in assembler.blocks()],
        assembler.finish_reason,
        assembler.usage,
    )


def assert_same_at_every_mark(frames: Frames) -> None:
    log, timed = logged(frames)
    assert log.count == len(timed)
    for frames_sent in range(len(frames) + 1):
        end = log.cut(frames_sent)
        prefix = timed[:end]
        # The delivered prefix, event for event (deltas at whole milliseconds).
        assert log.timed(end) == [
            (float(round(t)) if isinstance(e, BlockDelta) else t, e) for t, e in prefix
        ]
        encoded, assembler = replayed(log, end)
        assert encoded == orjson.dumps(compact(prefix))
        reference = BlockAssembler.of(e for _, e in prefix)
        assert contents(assembler) == contents(reference)
        assert contents(BlockAssembler.of(log.events(end))) == contents(reference)
        assert log.usage(end) == reference.usage
        assert log.finished(end) == any(isinstance(e, Finish) for _, e in prefix)
    assert log.usage() == BlockAssembler.of(e for _, e in timed).usage


@contextmanager
def batches_of(size: int, join_at: int = 2) -> Iterator[None]:
    """What a long stream does, at sizes small tests reach: its runs encoded in batches
    (orjson fragments), its delta strings joined into the buffer and cut back out of it."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compact_module, "BATCH", size)
        patch.setattr(attempt_log, "BATCH", size)
        patch.setattr(attempt_log, "_JOIN_AT", join_at)
        yield


FIXTURE_NAMES = sorted(p.name for p in Path(FIXTURES).glob("*.sse"))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_every_real_stream_reads_back_as_the_old_list_did(name: str) -> None:
    assert_same_at_every_mark(fixture_frames(name))


@pytest.mark.parametrize("name", FIXTURE_NAMES)
def test_long_runs_encoded_in_batches_give_the_same_json(name: str) -> None:
    with batches_of(3):
        assert_same_at_every_mark(fixture_frames(name))


@pytest.mark.parametrize("deltas", [10, 1000])
def test_a_run_is_one_string_for_the_assembler(deltas: int) -> None:
    frames: Frames = [(0.0, [BlockStart(0, "text")])]
    frames += [(float(i), [BlockDelta(0, "ab")]) for i in range(deltas)]
    log, _ = logged(frames)
    events = list(log.events(log.count))
    assert events == [BlockStart(0, "text"), BlockDelta(0, "ab" * deltas)]
    # The whole text of a one-run answer is the log's own buffer, not a copy.
    assert events[1].text is log.text()  # type: ignore[union-attr]


def test_interleaved_blocks_tool_calls_and_unicode() -> None:
    frames: Frames = [
        (0.2, [BlockStart(0, "reasoning")]),
        (1.4, [BlockDelta(0, "Think “quoted” \\ \n\t\x01")]),
        (2.5, [BlockStart(1, "text"), BlockDelta(1, "Héllo 👋🏽 ")]),
        (2.5, [BlockDelta(0, "more \U0001d518\U0001d52b")]),  # back to the first block: a new run
        (3.5, [BlockDelta(1, "中文"), BlockDelta(1, "")]),
        (4.5, [BlockEnd(0, {"signature": "sig"})]),
        (5.5, [BlockDelta(1, "after end of 0")]),
        (6.5, [BlockStart(2, "tool_call", id="call_1", name="get")]),
        (7.5, [BlockDelta(2, '{"a": '), BlockDelta(2, '"😀"}')]),
        (8.5, [BlockEnd(2)]),
        (9.5, [BlockDelta(2, "ignored after its end")]),
        (10.5, [BlockStart(3, "image", data={"url": "x"}), BlockEnd(3, {"more": 1})]),
        (11.5, [Finish("tool_calls")]),
        (12.5, [Usage({"prompt_tokens": 3, "completion_tokens": 9})]),
        (13.5, [StreamFailure("late", {"code": 1})]),
    ]
    assert_same_at_every_mark(frames)
    with batches_of(1):
        assert_same_at_every_mark(frames)


def test_long_deltas_crowded_frames_and_times_that_jump_or_go_back() -> None:
    """A delta longer than 255 code points (lengths widen from bytes), frames of hundreds of
    events, long gaps and times going back."""
    frames: Frames = [(400.0, [BlockStart(0, "text"), BlockDelta(0, "a")])]
    frames += [(400.0 + i, [BlockDelta(0, "b")]) for i in range(300)]
    frames.append((1000.0, [BlockDelta(0, "é" * 300)]))
    frames.append((900.0, [BlockDelta(0, "back")] * 3))
    frames.append((5e9, [BlockDelta(1, "days later")] * 600))
    frames.append((5e9 + 2, [BlockDelta(1, "z"), Finish("stop")]))
    assert_same_at_every_mark(frames)
    with batches_of(64, 7):
        assert_same_at_every_mark(frames)


def test_empty_and_start_only_blocks() -> None:
    frames: Frames = [
        (1.0, [BlockStart(0, "text"), BlockStart(1, "reasoning")]),
        (2.0, [BlockDelta(0, "x")]),  # a run for 0 after 1's start: 1's record stays empty
        (3.0, [BlockDelta(5, "no start")]),
        (4.0, [BlockEnd(1)]),
        (5.0, []),
        (6.0, [Finish("stop")]),
    ]
    assert_same_at_every_mark(frames)


# -- any stream --------------------------------------------------------------------------------

_indexes = st.integers(0, 3)
_event = st.one_of(
    st.builds(BlockDelta, _indexes, st.text(max_size=6)),
    st.builds(BlockDelta, _indexes, st.text(max_size=6)),
    st.builds(BlockDelta, _indexes, st.text(max_size=6)),
    st.builds(
        BlockStart,
        _indexes,
        st.sampled_from(["text", "reasoning", "tool_call", "other"]),
        st.none() | st.text(max_size=3),
        st.none() | st.text(max_size=3),
        st.none() | st.fixed_dictionaries({"k": st.integers(-(2**40), 2**40)}),
    ),
    st.builds(BlockEnd, _indexes, st.none() | st.fixed_dictionaries({"s": st.text(max_size=3)})),
    st.builds(Usage, st.fixed_dictionaries({"total_tokens": st.integers(0, 99)})),
    st.builds(Finish, st.sampled_from(["stop", "length"])),
)
_frames = st.lists(
    st.tuples(st.floats(0, 40, allow_nan=False), st.lists(_event, max_size=4)), max_size=30
)


def _in_time_order(frames: Frames) -> Frames:
    out: Frames = []
    t = 0.0
    for gap, events in frames:
        t += gap
        out.append((t, events))
    return out


@settings(max_examples=300, deadline=None)
@given(_frames, st.integers(1, 4), st.integers(1, 5))
def test_any_stream_reads_back_as_the_old_list_did(
    frames: Frames, batch: int, join_at: int
) -> None:
    frames = _in_time_order(frames)
    assert_same_at_every_mark(frames)
    with batches_of(batch, join_at):
        assert_same_at_every_mark(frames)


_jumps = st.lists(
    st.tuples(
        # Gaps that fit a byte, that just do not (255 ms is the last that does), stalls, clocks
        # going back, and one past 49 days.
        st.sampled_from([0.0, 0.4, 3.0, 255.0, 255.6, 256.0, 300.0, -2.0, -400.0, 5e9]),
        st.lists(_event, max_size=3),
    ),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(_jumps, st.integers(1, 4))
def test_times_that_jump_or_go_back_anywhere_read_back_the_same(frames: Frames, batch: int) -> None:
    """A delta's time is kept as the gap from the delta before, in a byte; those that do not
    fit are kept aside. Long runs (batches, read later) and short ones give the old times."""
    frames = _in_time_order(frames)
    assert_same_at_every_mark(frames)
    with batches_of(batch, 2):
        assert_same_at_every_mark(frames)


def assert_reads_back_the_same(fast: AttemptLog, slow: AttemptLog, frames: int) -> None:
    """Two logs of the same frames, one through a fast path: the same at every frame mark."""
    assert fast.count == slow.count and fast.first_ms == slow.first_ms
    for frames_sent in range(frames + 1):
        end = slow.cut(frames_sent)
        assert fast.cut(frames_sent) == end
        assert fast.timed(end) == slow.timed(end)
        assert replayed(fast, end)[0] == replayed(slow, end)[0]


@settings(max_examples=100, deadline=None)
@given(_frames)
def test_a_lone_delta_logged_without_its_event_reads_back_the_same(frames: Frames) -> None:
    frames = _in_time_order(frames)
    slow, fast = AttemptLog(started=0.0), AttemptLog(started=0.0)
    for t, events in frames:
        slow.add(events, t)
        slow.mark()
        if len(events) == 1 and isinstance(events[0], BlockDelta):
            fast.delta(events[0].index, events[0].text, t)
        else:
            fast.add(events, t)
        fast.mark()
    assert_reads_back_the_same(fast, slow, len(frames))


_long_text = st.text(min_size=250, max_size=300)  # past 255 code points: lengths widen
_huge_text = st.just("h" * 65_536)  # past 65,535: wider again, within a run of frames
_text_frames = st.lists(
    st.tuples(
        st.sampled_from([0.0, 0.0, 1.0, 2.5]),  # gaps: many frames arrive in one read
        st.one_of(
            st.lists(st.builds(BlockDelta, st.integers(0, 1), st.text(max_size=4)), max_size=1),
            st.lists(
                st.builds(BlockDelta, st.just(0), st.text(max_size=4) | _long_text | _huge_text),
                max_size=1,
            ),
            st.lists(_event, max_size=2),
        ),
    ),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(_text_frames, st.integers(1, 5))
def test_runs_of_text_frames_logged_at_once_read_back_as_each_alone(
    frames: Frames, join_at: int
) -> None:
    frames = _in_time_order(frames)
    with batches_of(4, join_at):
        slow, fast = AttemptLog(started=0.0), AttemptLog(started=0.0)
        run: list[str] = []
        run_key: tuple[float, int] | None = None

        def flush() -> None:
            if run_key is not None and run:
                fast.text_frames(run_key[1], list(run), run_key[0])
            run.clear()

        for t, events in frames:
            slow.add(events, t)
            slow.mark()
            lone = events[0] if len(events) == 1 else None
            key = (t, lone.index) if isinstance(lone, BlockDelta) else None
            if key is None or key != run_key:
                flush()
                run_key = key
            if isinstance(lone, BlockDelta):
                run.append(lone.text)
            else:
                fast.add(events, t)
                fast.mark()
        flush()
        assert_reads_back_the_same(fast, slow, len(frames))


def test_a_run_holding_a_length_past_what_its_items_hold_reads_back_as_each_alone() -> None:
    # 2-byte lengths (after a delta of 300 code points), then a read whose frames carry 2, then
    # 65,536, then 1: the run cannot go in at once, and what went in before the long one must
    # not stay twice.
    texts = ["ab", "h" * 65_536, "c"]
    slow, fast = AttemptLog(started=0.0), AttemptLog(started=0.0)
    for log in (slow, fast):
        log.add([BlockDelta(0, "x" * 300)], 1.0)
        log.mark()
    fast.text_frames(0, texts, 2.0)
    for text in texts:
        slow.add([BlockDelta(0, text)], 2.0)
        slow.mark()
    assert_reads_back_the_same(fast, slow, 4)
    assert fast.text() == "x" * 300 + "".join(texts)


# -- what it costs ---------------------------------------------------------------------------


def test_a_long_stream_costs_a_few_bytes_a_delta_beyond_its_text() -> None:
    n = 100_000
    words = [f"w{i % 10}r " for i in range(10)]  # 4 characters a delta
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        log = AttemptLog(started=0.0)
        log.add([BlockStart(0, "text")], 0.0)
        for i in range(n):
            # A new string and event per delta, as a parser makes them (then let go of).
            log.add([BlockDelta(0, words[i % 10][:2] + words[i % 10][2:])], i * 0.5)
            log.mark()
        log.text()
        added = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    text_bytes = 4 * n
    # A byte of length and a byte of time since the delta before: 2, and a little for
    # growth. A frame of one more delta each is no break in the marks' steps: nothing.
    assert (added - text_bytes) / n < 3


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("frame"), st.integers(0, 3)),  # a frame of that many events
            st.tuples(st.just("text"), st.integers(1, 6)),  # that many text frames at once
            st.tuples(st.just("received"), st.integers(1, 3)),  # events not yet in a frame
        ),
        max_size=30,
    )
)
def test_each_frame_cuts_at_the_count_its_end_had(steps: list[tuple[str, int]]) -> None:
    log, marks = AttemptLog(started=0.0), []  # marks: the plain list this stands for
    for step, n in steps:
        if step == "text":
            log.text_frames(0, ["x"] * n, 1.0)
            marks += range(log.count - n + 1, log.count + 1)
            continue
        log.add([Usage({"n": i}) for i in range(n)], 1.0)
        if step == "frame":
            log.mark()
            marks.append(log.count)
    assert [log.cut(f) for f in range(1, len(marks) + 1)] == marks
    assert log.cut(0) == 0
    with pytest.raises(IndexError):
        log.cut(len(marks) + 1)


def test_a_long_run_of_text_frames_keeps_no_mark_per_frame() -> None:
    log = AttemptLog(started=0.0)
    log.add([BlockStart(0, "text")], 0.0)
    log.mark()
    for read in range(1000):
        log.text_frames(0, ["word "] * 100, float(read))
    assert log.cut(100_001) == log.count == 100_001
    assert len(log._mark_at) <= 2  # the first frame's offset, then one for all text frames
