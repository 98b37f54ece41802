"""The compact timed stream of contract section 4, and its lossless expansion.

Consecutive deltas of one block merge into one run record
`{"type": kind, "index", "t0", "dt": [...], "parts": [...]}` (a tool call adds `id` and
`name`; an unknown kind adds `data`); block ends, usage, finish and in-stream errors are single
records with a time `t`. Times are whole milliseconds from the start of the attempt; `dt` holds
the gaps after `t0`, computed from rounded absolute times so that replay never drifts.
`expand()` gives back every event with its time, so content rebuilds byte for byte.

`compact()` takes events one by one; `CompactRecords` builds the same records from runs of
deltas (what an AttemptLog holds), and a long run's `dt` and `parts` as already-encoded JSON.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
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

# A run with more deltas than this has its `dt` and `parts` encoded to JSON a batch at a time
# (orjson.Fragment), so a long stream never holds an object per part; a shorter one (the usual
# answer) keeps plain lists, exactly as compact() makes them.
BATCH = 4096


class CompactRecords:
    """compact()'s records, fed a run of deltas at a time.

    In stream order: `event()` for anything but deltas, `run()` for consecutive deltas of one
    block (times in whole milliseconds, part strings in batches). `done()` then serialises,
    with the store's orjson.dumps, to exactly what `compact()` of the same events gives (a
    record's `dt` and `parts` are orjson.Fragment values when the run is long: JSON as far as
    orjson is concerned, not lists for anything that reads the payload before it is stored).
    """

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._starts: dict[int, BlockStart] = {}
        self._run: dict[str, Any] | None = None  # the open run record
        self._last: int | None = None  # the time of its last delta (None: it has none yet)
        # A long open run's `dt` and `parts`, each as encoded batches (inner JSON text).
        self._encoded: tuple[list[bytes], list[bytes]] | None = None

    def event(self, t_ms: float, event: StreamEvent) -> None:
        t = round(t_ms)
        if isinstance(event, BlockDelta):
            self.run(event.index, (t,), ([event.text],))
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
        parts: Iterable[list[str]],
        shift_ms: float = 0.0,
    ) -> None:
        """Deltas of block `index` at `times` (whole ms; `shift_ms` added, then rounded, for a
        later attempt of a continued answer), their strings given in order by `parts`."""
        if not times:
            return
        if shift_ms:
            times = [round(t + shift_ms) for t in times]
        run = self._run
        if run is None or run["index"] != index:
            self._close()
            run = self._open(index, times[0])
        last = self._last
        if last is None:
            run["t0"] = times[0]  # a run opened by its BlockStart: the first delta sets t0
        self._last = times[-1]
        if self._encoded is None and len(run["parts"]) + len(times) <= BATCH:
            dt: list[int] = run["dt"]
            if last is not None:
                dt.append(times[0] - last)
            dt += map(sub, times[1:], times[:-1])
            for strings in parts:
                run["parts"] += strings
            return
        if self._encoded is None:
            self._encoded = ([], [])
            _add(self._encoded[0], run["dt"])
            _add(self._encoded[1], run["parts"])
        gaps, strings_json = self._encoded
        for a in range(0, len(times), BATCH):
            batch = times[a : a + BATCH]
            before = times[a - 1] if a else last
            batch_gaps = list(map(sub, batch[1:], batch[:-1]))
            if before is not None:
                batch_gaps.insert(0, batch[0] - before)
            _add(gaps, batch_gaps)
        for strings in parts:
            _add(strings_json, strings)

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
        if self._encoded is not None:
            assert self._run is not None
            gaps, strings_json = self._encoded
            self._run["dt"] = orjson.Fragment(b"[" + b",".join(gaps) + b"]")
            self._run["parts"] = orjson.Fragment(b"[" + b",".join(strings_json) + b"]")
            self._encoded = None
        self._run, self._last = None, None


def _add(pieces: list[bytes], items: list[Any]) -> None:
    """Append `items` to encoded pieces as their JSON list's inner text."""
    if items:
        pieces.append(orjson.dumps(items)[1:-1])
