"""The compact timed stream (docs/recording.md, "The compact stream"), and its lossless
expansion.

Consecutive deltas of one block merge into one run record
`{"type": kind, "index", "t0", "dt": [...], "parts": [...]}` (a tool call adds `id` and
`name`; an unknown kind adds `data`); block ends, usage, finish and in-stream errors are single
records with a time `t`. Times are whole milliseconds from the start of the attempt; `dt` holds
the gaps after `t0`, computed from rounded absolute times so that replay never drifts.
`expand()` gives back every event with its time, so content rebuilds byte for byte.

`compact()` takes events one by one; `CompactRecords` builds the same records from runs of
deltas (what an AttemptLog holds), a long run's `dt` and `parts` as JSON written when stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from operator import sub
from typing import Any

import orjson

from gateway.stream.events import (
    TEXT,
    TOOL_CALL,
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamEvent,
    StreamFailure,
    Usage,
)

Timed = tuple[float, StreamEvent]  # (milliseconds since the attempt started, event)


def _run_record(start: BlockStart, t: int) -> dict[str, Any]:
    """A run record, still without its times and parts."""
    record: dict[str, Any] = {
        "type": start.kind,
        "index": start.index,
        "t0": t,
        "dt": [],
        "parts": [],
    }
    if start.kind == TOOL_CALL:
        record["id"] = start.id
        record["name"] = start.name
    if start.data is not None:
        record["data"] = start.data
    return record


def compact(events: Iterable[Timed]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    starts: dict[int, BlockStart] = {}
    run: dict[str, Any] | None = None  # the open run record
    last_t = 0

    def open_run(index: int, t: int) -> dict[str, Any]:
        record = _run_record(starts.get(index) or BlockStart(index, TEXT), t)
        records.append(record)
        return record

    for t_ms, event in events:
        t = round(t_ms)
        if isinstance(event, BlockDelta):
            if run is None or run["index"] != event.index:
                run = open_run(event.index, t)
            if run["parts"]:
                run["dt"].append(t - last_t)
            else:
                run["t0"] = t  # a run opened by its BlockStart: the first delta sets t0
            last_t = t
            run["parts"].append(event.text)
            continue
        if isinstance(event, BlockStart):
            starts[event.index] = event
            run = open_run(event.index, t)
            continue
        run = None
        if isinstance(event, BlockEnd):
            end: dict[str, Any] = {"type": "end", "index": event.index, "t": t}
            if event.data is not None:
                end["data"] = event.data
            records.append(end)
        elif isinstance(event, Usage):
            records.append({"type": "usage", "t": t, "usage": event.usage})
        elif isinstance(event, Finish):
            records.append({"type": "finish", "t": t, "reason": event.reason})
        elif isinstance(event, StreamFailure):
            records.append(
                {"type": "error", "t": t, "message": event.message, "upstream": event.upstream}
            )
    return records


def expand(records: Iterable[dict[str, Any]]) -> list[Timed]:
    out: list[Timed] = []
    started: set[int] = set()
    for record in records:
        kind = record["type"]
        if kind == "end":
            out.append((record["t"], BlockEnd(record["index"], record.get("data"))))
        elif kind == "usage":
            out.append((record["t"], Usage(record["usage"])))
        elif kind == "finish":
            out.append((record["t"], Finish(record["reason"])))
        elif kind == "error":
            out.append((record["t"], StreamFailure(record["message"], record["upstream"])))
        else:
            index, t = record["index"], record["t0"]
            if index not in started:
                started.add(index)
                out.append(
                    (
                        t,
                        BlockStart(
                            index, kind, record.get("id"), record.get("name"), record.get("data")
                        ),
                    )
                )
            for i, part in enumerate(record["parts"]):
                if i:
                    t += record["dt"][i - 1]
                out.append((t, BlockDelta(index, part)))
    return out


# -- the same records, built from runs of deltas ---------------------------------------------

# A run with more deltas than this keeps its `dt` and `parts` as `Batches` (JSON written a batch
# at a time when the payload is stored), so a long stream never holds an object per part nor
# its whole JSON before the store writes it; a shorter one (the usual answer) keeps plain lists,
# exactly as compact() makes them.
BATCH = 4096

Parts = Callable[[], Iterable[list[str]]]  # a run's part strings, in batches, as often as asked


class Batches:
    """A JSON array written a batch at a time (`write_json`, what the store's deferred payload
    calls), from sources read again each time it is written: nothing is encoded until then.
    Each source gives lists of items in order."""

    __slots__ = ("_sources",)

    def __init__(self, sources: list[Callable[[], Iterable[list[Any]]]]) -> None:
        self._sources = sources

    def write_json(self, out: bytearray) -> None:
        # (Appends only: `out` may hand its bytes on as it goes, see gateway.storage.payload.)
        sep = b"["
        for source in self._sources:
            for items in source():
                if items:
                    out += sep
                    out += memoryview(orjson.dumps(items))[1:-1]
                    sep = b","
        out += b"]" if sep == b"," else b"[]"

    def to_json(self) -> bytes:
        out = bytearray()
        self.write_json(out)
        return bytes(out)

    def items(self) -> list[Any]:
        """Every item (one object each: for tests and small runs)."""
        return [item for source in self._sources for items in source() for item in items]


def default(value: Any) -> Any:
    """orjson's `default` for records holding `Batches` (`orjson.dumps(records, default=...)`)."""
    if isinstance(value, Batches):
        return orjson.Fragment(value.to_json())
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _gaps(times: Sequence[int], before: int | None, shift_ms: float) -> Iterator[list[int]]:
    """The `dt` items of deltas at `times` (shifted by `shift_ms`, then rounded), a batch at a
    time; `before`: the time of the delta before the first, if the run has one."""
    for a in range(0, len(times), BATCH):
        batch: Sequence[int] = times[a : a + BATCH]
        if shift_ms:
            batch = [round(t + shift_ms) for t in batch]
        gaps = list(map(sub, batch[1:], batch[:-1]))
        if before is not None:
            gaps.insert(0, batch[0] - before)
        before = batch[-1]
        yield gaps


class CompactRecords:
    """compact()'s records, fed a run of deltas at a time.

    In stream order: `event()` for anything but deltas, `run()` for consecutive deltas of one
    block (times in whole milliseconds, part strings in batches). `done()` then gives records
    that serialise to exactly what `compact()` of the same events gives: with the store's
    payload encoder (`gateway.storage.payload`) or `orjson.dumps(records, default=default)`.
    A long run's `dt` and `parts` are `Batches`, read from the run's sources when written
    (`deferred` says whether there are any): those sources must not change until then.
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.deferred = False  # some record holds Batches
        self._starts: dict[int, BlockStart] = {}
        self._run: dict[str, Any] | None = None  # the open run record
        self._last: int | None = None  # the time of its last delta (None: it has none yet)
        # A long open run's `dt` and `parts`, each as the sources of its batches.
        self._sources: tuple[list[Callable[[], Iterable[list[Any]]]], list[Parts]] | None = None

    def event(self, t_ms: float, event: StreamEvent) -> None:
        t = round(t_ms)
        if isinstance(event, BlockDelta):
            self.run(event.index, (t,), [event.text])
            return
        self._close()
        if isinstance(event, BlockStart):
            self._starts[event.index] = event
            self._open(event.index, t)
        elif isinstance(event, BlockEnd):
            end: dict[str, Any] = {"type": "end", "index": event.index, "t": t}
            if event.data is not None:
                end["data"] = event.data
            self.records.append(end)
        elif isinstance(event, Usage):
            self.records.append({"type": "usage", "t": t, "usage": event.usage})
        elif isinstance(event, Finish):
            self.records.append({"type": "finish", "t": t, "reason": event.reason})
        elif isinstance(event, StreamFailure):
            self.records.append(
                {"type": "error", "t": t, "message": event.message, "upstream": event.upstream}
            )

    def run(
        self,
        index: int,
        times: Sequence[int],
        parts: Parts | list[str],
        shift_ms: float = 0.0,
    ) -> None:
        """Deltas of block `index` at `times` (whole ms; `shift_ms` added, then rounded, for a
        later attempt of a continued answer), their strings given in order by `parts()` (or
        as one list). A long run reads `times` and calls `parts` again when its records are
        written."""
        n = len(times)
        if not n:
            return
        run = self._run
        if self._sources is None and n <= BATCH:  # the usual run: plain lists
            if shift_ms:
                times = [round(t + shift_ms) for t in times]
            if run is None or run["index"] != index:
                self._close()
                run = self._open(index, times[0])
            if len(run["parts"]) + n <= BATCH:
                last = self._last
                dt: list[int] = run["dt"]
                if last is None:
                    run["t0"] = times[0]  # a run opened by its BlockStart: its first delta's
                else:
                    dt.append(times[0] - last)
                dt += map(sub, times[1:], times[:-1])
                self._last = times[-1]
                if isinstance(parts, list):
                    run["parts"] += parts
                else:
                    for strings in parts():
                        run["parts"] += strings
                return
            shift_ms = 0.0  # (done above)
        first, last_t = times[0], times[n - 1]
        if shift_ms:
            first, last_t = round(first + shift_ms), round(last_t + shift_ms)
        if run is None or run["index"] != index:
            self._close()
            run = self._open(index, first)
        last = self._last
        if last is None:
            run["t0"] = first  # a run opened by its BlockStart: the first delta sets t0
        self._last = last_t
        if isinstance(times, memoryview):  # kept past this call: not a view of what may grow
            times = times.tolist()
        if self._sources is None:
            done_dt, done_parts = run["dt"], run["parts"]
            self._sources = ([lambda: (done_dt,)], [lambda: (done_parts,)])
        gaps_sources, parts_sources = self._sources
        gaps_sources.append(lambda: _gaps(times, last, shift_ms))
        if isinstance(parts, list):
            strings = parts
            parts_sources.append(lambda: (strings,))
        else:
            parts_sources.append(parts)

    def done(self) -> list[dict[str, Any]]:
        self._close()
        return self.records

    # -- helpers ------------------------------------------------------------------------------

    def _open(self, index: int, t: int) -> dict[str, Any]:
        record = _run_record(self._starts.get(index) or BlockStart(index, TEXT), t)
        self.records.append(record)
        self._run = record
        return record

    def _close(self) -> None:
        if self._sources is not None:
            assert self._run is not None
            gaps, parts = self._sources
            self._run["dt"] = Batches(gaps)
            self._run["parts"] = Batches(list(parts))
            self._sources = None
            self.deferred = True
        self._run, self._last = None, None
