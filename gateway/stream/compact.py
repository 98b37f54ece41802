"""The compact timed stream of contract section 4, and its lossless expansion.

Consecutive deltas of one block merge into one run record
`{"type": kind, "index", "t0", "dt": [...], "parts": [...]}` (a tool call adds `id` and
`name`; an unknown kind adds `data`); block ends, usage, finish and in-stream errors are single
records with a time `t`. Times are whole milliseconds from the start of the attempt; `dt` holds
the gaps after `t0`, computed from rounded absolute times so that replay never drifts.
`expand()` gives back every event with its time, so content rebuilds byte for byte.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

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


def compact(events: Iterable[Timed]) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    starts: dict[int, BlockStart] = {}
    run: dict[str, Any] | None = None  # the open run record
    last_t = 0

    def open_run(index: int, t: int) -> dict[str, Any]:
        start = starts.get(index) or BlockStart(index, TEXT)
        record: dict[str, Any] = {
            "type": start.kind,
            "index": index,
            "t0": t,
            "dt": [],
            "parts": [],
        }
        if start.kind == TOOL_CALL:
            record["id"] = start.id
            record["name"] = start.name
        if start.data is not None:
            record["data"] = start.data
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
