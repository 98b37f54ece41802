"""What one attempt received, kept compactly while it streams.

A stream is mostly deltas, and a long one must not cost a Python object per chunk (the
performance issue's target: a 100,000-chunk stream within 2 MB beyond its text). So a delta
costs only:
- its text, appended to a buffer (pending strings are joined into one every `_JOIN_AT` deltas);
- its length, a byte (4 bytes each once a delta is longer than 255 code points);
- its time, whole milliseconds (what the compact stream records) since the delta before, a
  byte (a gap that does not fit, such as the first delta's or a stall's, is a 0 there and the
  gap itself aside);
and consecutive deltas of one block form a *run* (four array items per run, not per delta).
Every other event (block starts and ends, usage, finish, in-stream errors) is rare and kept as
the object it is, with its position and exact time. A frame written to the client is marked
with how many events had been received by its end (its *mark*); as nearly every frame carries
one more event than the frame before it, only the frames where that step is broken are kept
(two array items each), so a run of text frames costs nothing per frame.

A length and a time gap are a byte because bytearray.append is the cheapest append CPython
has (cheaper than a 4-byte array item's; 2-byte items go through a conversion). A gap costs
keeping the last time on the per-delta path (text frames come a read at a time: one gap a
read, then zeros, cheaper than the time repeated), and holds far less for a long stream than
a 4-byte time each: most of what stood between a long stream and its memory target
(docs/performance.md).

What is recorded is capped per kind (`cap`): text and reasoning deltas together, and tool-call
arguments, each up to a number of characters. A delta past its kind's cap is counted as an
event (the frames written to the client keep their marks) but its text is not kept, nor any
later delta of that kind: the record ends there, marked `truncated` (the relay still sends
every byte). The delta that crosses the cap keeps the part that fits. Below the cap a delta
costs one subtraction and a comparison more.

Everything a turn's end needs is read from that, up to any mark (the delivered prefix): the
events with each run merged into one delta (what BlockAssembler needs, one string per run
rather than per part), the provider's usage, and the compact timed stream (docs/recording.md)
built from the arrays (a long run's parts encoded to JSON a batch at a time, never a string
each for the whole stream).
"""

from __future__ import annotations

from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, pairwise
from time import monotonic
from typing import Any, NamedTuple, overload

from gateway import metrics
from gateway.stream.assembler import BlockAssembler
from gateway.stream.compact import BATCH, CompactRecords, Parts, Timed
from gateway.stream.events import (
    TOOL_CALL,
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamEvent,
    Usage,
)
from gateway.stream.narrow import Items, widened

_JOIN_AT = 256  # delta strings waiting before they are joined into one piece of the buffer
_BOUNDS = (BlockStart, BlockEnd)  # (a tuple: `A | B` makes a union object every time)
UNCAPPED = 2**62  # characters: a cap no stream reaches
_TEXT, _TOOL = 0, 1  # the kinds a cap counts apart: text and reasoning, tool-call arguments
_KIND_NAMES = ("text", TOOL_CALL)


class _Clock:
    """Deltas' times, whole ms since the log's start, summed from their gaps; read in order
    (each read starts where the last one ended), as many times as asked. Reads copy what they
    take: no buffer export, so the log may still grow (a drain, on the loop's thread, while the
    store's thread reads a long run)."""

    __slots__ = ("_at", "_gaps", "_late_at", "_late_gap", "_t")

    def __init__(self, gaps: bytearray, late_at: array[int], late_gap: array[int]) -> None:
        self._gaps, self._late_at, self._late_gap = gaps, late_at, late_gap
        self._at = self._t = 0  # the time of delta `_at - 1` (0 before any)

    def times(self, first: int, stop: int) -> list[int]:
        """The times of deltas `first` to `stop`."""
        if first < self._at:
            self._at = self._t = 0
        t = self._t + self._sum(self._at, first)
        gaps: bytearray | list[int] = self._gaps[first:stop]
        i, j = bisect_left(self._late_at, first), bisect_left(self._late_at, stop)
        if i < j:
            gaps = list(gaps)
            for k in range(i, j):
                gaps[self._late_at[k] - first] = self._late_gap[k]
        out = list(accumulate(gaps, initial=t))
        del out[0]
        self._at, self._t = stop, out[-1] if out else t
        return out

    def _sum(self, first: int, stop: int) -> int:
        if first >= stop:
            return 0
        late = self._late_at
        i, j = bisect_left(late, first), bisect_left(late, stop)
        return sum(self._gaps[first:stop]) + (sum(self._late_gap[i:j]) if i < j else 0)


class _Times(Sequence[int]):
    """Deltas `first` to `stop`'s times, read when asked (a long run's, when its record is
    written on the store's thread)."""

    __slots__ = ("_clock", "_first", "_stop")

    def __init__(self, clock: _Clock, first: int, stop: int) -> None:
        self._clock, self._first, self._stop = clock, first, stop

    def __len__(self) -> int:
        return self._stop - self._first

    @overload
    def __getitem__(self, key: int) -> int: ...

    @overload
    def __getitem__(self, key: slice) -> Sequence[int]: ...

    def __getitem__(self, key: int | slice) -> int | Sequence[int]:
        at = range(self._first, self._stop)[key]
        if isinstance(at, int):
            return self._clock.times(at, at + 1)[0]
        if at.step != 1:
            raise ValueError("times are read in order")
        return self._clock.times(at.start, at.stop)


class Run(NamedTuple):
    """Consecutive deltas of one block, cut at a prefix's end."""

    block: int  # its block index
    first: int  # its first delta's number
    stop: int  # after its last delta's
    start: int  # where its text starts in the buffer
    end: int  # and ends


class Other(NamedTuple):
    position: int  # among all events received
    t_ms: float
    event: StreamEvent


class AttemptLog:
    """The events one attempt received, in order, and the frames written from them."""

    __slots__ = (
        "_chars",
        "_done",
        "_frames",
        "_full",
        "_full_n",
        "_gaps",
        "_lane",
        "_last_t",
        "_late_at",
        "_late_gap",
        "_left",
        "_lefts",
        "_lens",
        "_mark_at",
        "_mark_off",
        "_offset",
        "_open",
        "_others",
        "_pending",
        "_runs",
        "_tools",
        "count",
        "first_ms",
        "started",
        "truncated",
    )

    def __init__(self, started: float | None = None) -> None:
        self.started = monotonic() if started is None else started  # times count from here
        self.first_ms: float | None = None  # when the first events came
        self.count = 0  # events received
        self._pending: list[str] = []  # delta strings not yet joined
        self._done: list[str] = []  # joined pieces of the text buffer
        self._full, self._full_n = "", 0  # the whole text, once read, and how many deltas
        self._lens: Items = bytearray()  # per delta: its length in code points
        self._chars = 0  # their sum: the text buffer's length
        # Per delta: whole ms since the delta before (the first: since `started`), a byte;
        # a gap that does not fit is a 0 there, and its number and the gap are kept aside.
        self._gaps = bytearray()
        self._late_at: array[int] = array("q")
        self._late_gap: array[int] = array("q")
        self._last_t = 0  # the last delta's time
        # Per run, four items: the event position of its first delta, that delta's number,
        # its block index, where its text starts in the buffer.
        self._runs: array[int] = array("q")
        self._open: int | None = None  # the block index of the run deltas extend, if any
        self._others: list[Other] = []
        # Per frame written, the mark (`count` at its end) is its number plus an offset; kept:
        # the numbers of the frames whose offset differs from the frame's before, and that
        # offset. Frames are numbered from 1.
        self._frames = 0
        self._mark_at: array[int] = array("q")
        self._mark_off: array[int] = array("q")
        self._offset: int | None = None  # the last frame's
        # Characters each kind may still record (`cap`): the kind of the run under way's in
        # `_left`, the others' in `_lefts`; -1 once a kind was cut. Tool-call blocks by index.
        self._lefts = [UNCAPPED, UNCAPPED]
        self._lane = _TEXT
        self._left = UNCAPPED
        self._tools: set[int] = set()
        self.truncated: list[str] = []  # the kinds whose record was cut, in order

    def cap(self, text_chars: int, tool_argument_chars: int) -> None:
        """Record at most this many characters of text and reasoning, and of tool-call
        arguments (before anything is received)."""
        self._lefts = [text_chars, tool_argument_chars]
        self._lane = _TEXT
        self._left = text_chars

    def left(self) -> tuple[int, int]:
        """The characters of text and reasoning, and of tool-call arguments, it may still
        record (0 for a kind cut): the caps of the turn's next attempt."""
        lefts = self._lefts.copy()
        lefts[self._lane] = self._left
        return max(0, lefts[_TEXT]), max(0, lefts[_TOOL])

    # -- while streaming (once per upstream frame: kept lean) ----------------------------

    def add(self, events: list[StreamEvent], t_ms: float | None = None) -> None:
        """Events received together, now (or `t_ms` after `started`)."""
        if not events:
            return
        if t_ms is None:
            t_ms = (monotonic() - self.started) * 1000.0
        if self.first_ms is None:
            self.first_ms = t_ms
        for event in events:
            if event.__class__ is BlockDelta:
                self.delta(event.index, event.text, t_ms)
            else:
                if event.__class__ is BlockStart and event.kind == TOOL_CALL:
                    self._tools.add(event.index)
                self._others.append(Other(self.count, t_ms, event))
                self.count += 1
                self._open = None  # a delta after this starts a new run, as in compact()

    def delta(self, index: int, text: str, t_ms: float) -> None:
        """One delta of block `index` received alone: `add([BlockDelta(index, text)], t_ms)`
        without the event object (the relay's fast path, once per frame)."""
        if self.first_ms is None:
            self.first_ms = t_ms
        if index != self._open:
            self._switch(index)
        n = len(text)
        left = self._left - n
        if left < 0:
            if self._left <= 0:
                self._cut()
                return
            text, n, left = text[: self._left], self._left, -1  # the part that fits
            self._cut_kind()
        self._left = left
        if index != self._open:
            self._runs.extend((self.count, len(self._lens), index, self._chars))
            self._open = index
        self._chars += n
        self.count += 1
        pending = self._pending
        pending.append(text)
        try:
            self._lens.append(n)
        except (ValueError, OverflowError):  # bytes, then wider items (gateway.stream.narrow)
            self._lens = widened(self._lens, [n])
        t = round(t_ms)
        try:
            self._gaps.append(t - self._last_t)
        except ValueError:
            self._late(t - self._last_t)
        self._last_t = t
        if len(pending) >= _JOIN_AT:
            self._done.append("".join(pending))
            pending.clear()

    def text_frames(self, index: int, texts: list[str], t_ms: float) -> None:
        """`delta(index, text, t_ms)` then `mark()` for each of `texts`, in bulk: frames that
        each carried one more piece of block `index`, received together and written as they
        came (the relay's fast path, once a read)."""
        if len(texts) == 1:  # a read of one frame, a slow stream's usual: fewer steps alone
            self.delta(index, texts[0], t_ms)
            self.mark()
            return
        t, count, n = round(t_ms), self.count, len(texts)
        if index != self._open:
            self._switch(index)
        lens = list(map(len, texts))
        size = sum(lens)
        left = self._left - size
        first = len(self._lens)
        try:
            if left < 0:  # past the cap: `delta` keeps what fits
                raise ValueError
            self._lens.extend(lens)
        except (ValueError, OverflowError):  # a length past what an item holds
            del self._lens[first:]  # (a bytearray takes all or none; an array what fit)
            for text in texts:
                self.delta(index, text, t_ms)
                self.mark()
            return
        self._left = left
        if self.first_ms is None:
            self.first_ms = t_ms
        if index != self._open:
            self._runs.extend((count, first, index, self._chars))
            self._open = index
        self._chars += size
        self.count = count + n
        gaps = self._gaps
        try:
            gaps.append(t - self._last_t)
        except ValueError:
            self._late(t - self._last_t)
        if n > 1:
            gaps += bytes(n - 1)
        self._last_t = t
        # Frame j of these (numbered frames + j) is marked count + j: one offset for all.
        if count - self._frames != self._offset:
            self._step_broken(self._frames + 1, count - self._frames)
        self._frames += n
        pending = self._pending
        pending += texts
        if len(pending) >= _JOIN_AT:
            self._done.append("".join(pending))
            pending.clear()

    def _switch(self, index: int) -> None:
        """A run of block `index` starts: the cap of its kind counts from here."""
        self._lefts[self._lane] = self._left
        self._lane = _TOOL if index in self._tools else _TEXT
        self._left = self._lefts[self._lane]

    def _cut(self) -> None:
        """A delta past its kind's cap: an event the record does not keep, nor any later delta
        of that kind."""
        self.count += 1
        self._open = None
        if self._left >= 0:
            self._cut_kind()

    def _cut_kind(self) -> None:
        """The kind of the run under way records nothing more."""
        self._left = self._lefts[self._lane] = -1
        kind = _KIND_NAMES[self._lane]
        self.truncated.append(kind)
        metrics.TRUNCATED_RECORDS.labels(kind).inc()

    @property
    def frames(self) -> int:
        """The frames written so far."""
        return self._frames

    def mark(self) -> None:
        """A frame was written to the client: everything received so far went into it."""
        frames = self._frames = self._frames + 1
        if self.count - frames != self._offset:
            self._step_broken(frames, self.count - frames)

    def _late(self, gap: int) -> None:
        """The next delta's gap does not fit in a byte."""
        self._late_at.append(len(self._gaps))
        self._late_gap.append(gap)
        self._gaps.append(0)

    def _step_broken(self, frame: int, offset: int) -> None:
        """From `frame` on, a frame's mark is its number plus `offset`."""
        self._offset = offset
        self._mark_at.append(frame)
        self._mark_off.append(offset)

    # -- reading ---------------------------------------------------------------------------

    def cut(self, frames: int) -> int:
        """How many events the first `frames` frames written were made from."""
        if not frames:
            return 0
        if not 0 < frames <= self._frames:
            raise IndexError(f"{frames} frames of {self._frames} written")
        return frames + self._mark_off[bisect_right(self._mark_at, frames) - 1]

    def text(self) -> str:
        """The text of every delta received, in order: one string, joined when read."""
        if self._full_n != len(self._lens):
            if self._done:  # a long stream: one buffer, nothing held twice
                self._done = ["".join([*self._done, *self._pending])]
                self._pending = []
                self._full = self._done[0]
            else:  # a short one keeps its part strings too: they are its compact `parts`
                self._full = "".join(self._pending)
            self._full_n = len(self._lens)
        return self._full

    def _parts(self, run: Run) -> Parts:
        """A run's part strings, a batch at a time, as often as asked (after `text()`): read
        from what the log holds now, so deltas that come later (a drain) change nothing, and
        without buffer exports (it may be read on the store's thread while the log grows)."""
        if not self._done:  # every part string is still at hand
            strings = self._pending[run.first : run.stop]
            return lambda: (strings,)
        text, lens, first, stop, start = self._full, self._lens, run.first, run.stop, run.start

        def batches() -> Iterator[list[str]]:
            at = start
            for a in range(first, stop, BATCH):
                ends = list(accumulate(lens[a : min(stop, a + BATCH)], initial=at))
                yield [text[i:j] for i, j in pairwise(ends)]
                at = ends[-1]

        return batches

    def segments(self, end: int) -> Iterator[Run | Other]:
        """The first `end` events, in order: each run of deltas as one Run, others as they are."""
        others, o = self._others, 0
        runs, lens = self._runs, memoryview(self._lens)
        total, items = len(lens), len(runs)
        for r in range(0, items, 4):
            position, first, index, start = runs[r], runs[r + 1], runs[r + 2], runs[r + 3]
            while o < len(others) and others[o].position < position:
                if others[o].position >= end:
                    return
                yield others[o]
                o += 1
            if position >= end:
                return
            if r + 4 < items:
                after, run_end = runs[r + 5], runs[r + 7]
            else:
                after, run_end = total, self._chars
            stop = min(after, first + end - position)
            # Where the run's first `stop` deltas end, summed over the shorter side: a look at
            # what a long stream delivered so far cuts it near its end.
            if after - stop < stop - first:
                yield Run(index, first, stop, start, run_end - sum(lens[stop:after]))
            else:
                yield Run(index, first, stop, start, start + sum(lens[first:stop]))
        while o < len(others) and others[o].position < end:
            yield others[o]
            o += 1

    def events(self, end: int, index_offset: int = 0) -> Iterator[StreamEvent]:
        """The first `end` events with each run merged into one delta (block indexes shifted
        by `index_offset`): what BlockAssembler needs, a string per run rather than per part."""
        text = self.text()
        for segment in self.segments(end):
            if isinstance(segment, Run):
                yield BlockDelta(segment.block + index_offset, text[segment.start : segment.end])
            else:
                yield _shifted(segment.event, index_offset) if index_offset else segment.event

    def timed(self, end: int) -> list[Timed]:
        """The first `end` events one by one with their times (deltas at whole ms): the old
        representation, for what still wants it. A long stream's worth of objects: avoid."""
        text, clock, lens = self.text(), self._clock(), self._lens
        out: list[Timed] = []
        for segment in self.segments(end):
            if isinstance(segment, Other):
                out.append((segment.t_ms, segment.event))
                continue
            at = segment.start
            times = clock.times(segment.first, segment.stop)
            for d, t in zip(range(segment.first, segment.stop), times, strict=True):
                out.append((float(t), BlockDelta(segment.block, text[at : at + lens[d]])))
                at += lens[d]
        return out

    def replay(
        self,
        end: int,
        stream: CompactRecords,
        assembler: BlockAssembler,
        *,
        shift_ms: float = 0.0,
        index_offset: int = 0,
    ) -> int:
        """Feed the first `end` events to a compact stream and an assembler, in one pass; times
        shifted by `shift_ms` and block indexes by `index_offset` (a later part of a continued
        answer). Returns the highest block index fed, -1 if none."""
        text = self.text()
        clock = self._clock()
        top = -1
        for segment in self.segments(end):
            if isinstance(segment, Run):
                index = segment.block + index_offset
                first, stop = segment.first, segment.stop
                # A long run's times are read when its record is written.
                if stop - first > BATCH:
                    times = _Times(self._clock(), first, stop)
                    stream.run(index, times, self._parts(segment), shift_ms)
                elif self._done:
                    stream.run(index, clock.times(first, stop), self._parts(segment), shift_ms)
                else:  # a short log: its part strings are at hand
                    strings = self._pending[first:stop]
                    stream.run(index, clock.times(first, stop), strings, shift_ms)
                assembler.feed(BlockDelta(index, text[segment.start : segment.end]))
            else:
                event = _shifted(segment.event, index_offset) if index_offset else segment.event
                stream.event(segment.t_ms + shift_ms, event)
                assembler.feed(event)
                if not isinstance(event, _BOUNDS):
                    continue
                index = event.index
            if index > top:
                top = index
        return top

    def _clock(self) -> _Clock:
        return _Clock(self._gaps, self._late_at, self._late_gap)

    def usage(self, end: int | None = None) -> dict[str, Any] | None:
        """The provider's own count, the last that came (among the first `end` events)."""
        for other in reversed(self._others):
            if isinstance(other.event, Usage) and (end is None or other.position < end):
                return other.event.usage
        return None

    def finished(self, end: int) -> bool:
        """Whether a finish is among the first `end` events."""
        return any(isinstance(o.event, Finish) and o.position < end for o in self._others)


def _shifted(event: StreamEvent, offset: int) -> StreamEvent:
    if isinstance(event, BlockStart):
        return BlockStart(event.index + offset, event.kind, event.id, event.name, event.data)
    if isinstance(event, BlockEnd):
        return BlockEnd(event.index + offset, event.data)
    return event
