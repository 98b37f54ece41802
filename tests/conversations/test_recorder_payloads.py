"""The recorder stores, from the attempt log, byte for byte what it stored from the old list of
timed events: for a completed answer, an interrupted one, a continued one (several attempts
spliced), an empty prefix and a failed attempt.

The reference is the old code, kept here: the list of `(ms, event)`, `events[:mark]` as the
delivered prefix, `_spliced` for a continued answer, `compact()` and `BlockAssembler.of()`.
Times are whole milliseconds, so that rounding once (the log) or at the end (the old list) agree.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import orjson
import pytest

from gateway.conversations.recorder import Attempt, TurnRecorder
from gateway.errors import UpstreamError
from gateway.storage.payload import DeferredPayload, as_text, encoded
from gateway.storage.records import NewEvent
from gateway.storage.store import Store
from gateway.storage.writes import Write
from gateway.stream import attempt_log
from gateway.stream import compact as compact_module
from gateway.stream.assembler import BlockAssembler
from gateway.stream.compact import Timed, compact
from gateway.stream.events import (
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamEvent,
    Usage,
)

ROUTE = {"provider": "openai", "deployment": "d", "model": "m"}


class Recorded:
    """Keeps what the store would write for each event: its type and its payload's JSON."""

    def __init__(self) -> None:
        self.events: list[tuple[str, bytes]] = []

    def append(self, event: NewEvent) -> None:
        self.events.append((event.type, bytes(encoded(event.payload))))

    def payload(self, kind: str) -> bytes:
        return next(p for k, p in self.events if k == kind)


def recorder() -> tuple[TurnRecorder, Recorded]:
    store = Recorded()
    turn = TurnRecorder(store, "c", "t")  # type: ignore[arg-type]
    return turn, store


class Old:
    """An attempt as it was: every event in a list, a mark per frame."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.events: list[Timed] = []
        self.marks: list[int] = []

    def delivered(self, frames: int) -> list[Timed]:
        return self.events[: self.marks[frames - 1]] if frames else []

    @property
    def usage(self) -> dict[str, Any] | None:
        return next((e.usage for _, e in reversed(self.events) if isinstance(e, Usage)), None)


def both(
    number: int, started: float, frames: list[tuple[int, list[StreamEvent]]]
) -> tuple[Attempt, Old]:
    attempt = Attempt(number, ROUTE, started=started)
    old = Old(started)
    for t, events in frames:
        attempt.log.add(events, float(t))
        attempt.frame_written()
        old.events += [(float(t), e) for e in events]
        old.marks.append(len(old.events))
    return attempt, old


def old_spliced(parts: list[tuple[Old, list[Timed]]]) -> list[Timed]:
    origin = parts[0][0].started
    out: list[Timed] = []
    offset = 0
    for part, events in parts:
        shift = (part.started - origin) * 1000.0
        top = offset - 1
        for t, event in events:
            if isinstance(event, BlockStart | BlockDelta | BlockEnd):
                event = replace(event, index=event.index + offset)
                top = max(top, event.index)
            out.append((t + shift, event))
        offset = top + 1
    return out


def old_message(
    parts: list[tuple[Old, list[Timed]]], number: int, *, interrupted: bool
) -> dict[str, Any]:
    timed = old_spliced(parts)
    assembler = BlockAssembler.of(e for _, e in timed)
    payload: dict[str, Any] = {
        "content": [b.to_content() for b in assembler.blocks()],
        "interrupted": interrupted,
        "surface_op": "append",
        "stream": compact(timed),
        "route": ROUTE,
        "attempt": number,
        "finish_reason": assembler.finish_reason,
        "usage": assembler.usage,
    }
    if len(parts) > 1:
        payload["segments"] = [
            {
                "attempt": i,
                "route": ROUTE,
                "content": [b.to_content() for b in BlockAssembler.of(e for _, e in ev).blocks()],
                "usage": part.usage,
            }
            for i, (part, ev) in enumerate(parts, 1)
        ]
    if interrupted:
        payload["content"] = [b.to_content() for b in assembler.interrupted_blocks()]
    return payload


@pytest.fixture(autouse=True, params=["short", "long"])
def runs(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test twice: as a short answer (plain lists), and with the paths of a long one
    (runs of more than a batch written when stored, delta strings joined into one buffer)."""
    with pytest.MonkeyPatch.context() as patch:
        if request.param == "long":
            patch.setattr(compact_module, "BATCH", 1)
            patch.setattr(attempt_log, "BATCH", 1)
            patch.setattr(attempt_log, "_JOIN_AT", 2)
        yield


FIRST = [
    (3, [BlockStart(0, "reasoning")]),
    (4, [BlockDelta(0, "let me think “about” it")]),
    (9, [BlockDelta(0, " — done"), BlockEnd(0, {"signature": "s"})]),
    (12, [BlockStart(1, "text"), BlockDelta(1, "Héllo ")]),
    (15, [BlockDelta(1, "wörld 👋")]),
    (17, [BlockDelta(1, ", and more")]),
]
SECOND = [
    (2, [BlockStart(0, "text"), BlockDelta(0, " continued")]),
    (5, [BlockDelta(0, " to the end.")]),
    (6, [Finish("stop")]),
    (7, [Usage({"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10})]),
]


def test_a_completed_answer() -> None:
    turn, store = recorder()
    attempt, old = both(1, 100.0, FIRST + SECOND)
    turn.attempts.append(attempt)
    turn.completed(attempt)
    expected = old_message([(old, old.events)], 1, interrupted=False)
    assert store.payload("assistant/message") == orjson.dumps(expected)


WHOLE = [
    BlockStart(0, "reasoning"),
    BlockDelta(0, "let me think “about” it"),
    BlockEnd(0, {"signature": "s"}),
    BlockStart(1, "text"),
    BlockDelta(1, "Héllo wörld 👋"),
    BlockEnd(1),
    BlockStart(2, "tool_call", "call_1", "lookup"),
    BlockDelta(2, '{"q": '),
    BlockDelta(2, '"weather"}'),
    BlockEnd(2),
    Finish("tool_calls"),
    Usage({"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10}),
]


@pytest.mark.parametrize("at_ms", [0.0, 3.4, 3.6, 1234.5])
def test_a_whole_answer_is_recorded_from_its_events_as_from_its_log(at_ms: float) -> None:
    """A non-streamed answer's events, received at once, are recorded without being read back
    out of the log: byte for byte what the log's replay stores."""
    records = []
    for whole in (False, True):
        turn, store = recorder()
        attempt = Attempt(1, ROUTE, started=100.0)
        attempt.log.add(WHOLE, at_ms)
        if whole:
            attempt.whole = WHOLE
        turn.attempts.append(attempt)
        turn.completed(attempt)
        records.append(store.payload("assistant/message"))
    assert records[0] == records[1]
    assert orjson.loads(records[1])["content"][2]["arguments"] == '{"q": "weather"}'


def test_a_whole_answer_cut_at_its_cap_is_read_from_the_log() -> None:
    """Past the record's cap the log keeps only what fits: the record says so, from the log."""
    turn, store = recorder()
    attempt = Attempt(1, ROUTE, started=100.0)
    attempt.log.cap(5, 1_000)
    attempt.log.add(WHOLE, 2.0)
    attempt.whole = WHOLE
    turn.attempts.append(attempt)
    turn.completed(attempt)
    payload = orjson.loads(store.payload("assistant/message"))
    assert payload["truncated_record"] is True
    assert payload["content"][0]["text"] == "let m"


@pytest.mark.parametrize("frames", range(1, len(FIRST) + 1))
def test_an_interrupted_answer_holds_the_delivered_prefix(frames: int) -> None:
    turn, store = recorder()
    attempt, old = both(1, 100.0, FIRST + SECOND)
    turn.attempts.append(attempt)
    turn.interrupted(attempt, frames, "acked", "client_disconnect")
    expected = old_message([(old, old.delivered(frames))], 1, interrupted=True)
    expected["delivery"] = "acked"
    expected["usage"] = old.usage
    if expected["content"]:
        assert store.payload("assistant/message") == orjson.dumps(expected)
    else:
        attempt_payload = {
            "reason": "empty_prefix",
            "attempt": 1,
            "stream": compact(old.events),
            "route": ROUTE,
            "usage": old.usage,
        }
        assert store.payload("assistant/attempt") == orjson.dumps(attempt_payload)


@pytest.mark.parametrize("sent", range(1, len(FIRST) + 1))
def test_a_continued_answer_splices_its_attempts(sent: int) -> None:
    turn, store = recorder()
    first, old_first = both(1, 100.0, FIRST)
    second, old_second = both(2, 100.25, SECOND)  # 250 ms later
    turn.attempts += [first, second]
    turn.completed(second, [(first, sent)])
    parts = [(old_first, old_first.delivered(sent)), (old_second, old_second.events)]
    expected = old_message(parts, 2, interrupted=False)
    assert store.payload("assistant/message") == orjson.dumps(expected)


def test_a_continued_answer_whose_second_attempt_started_a_fraction_of_a_ms_later() -> None:
    """Shifted times are rounded after the shift, delta by delta, as the old list did."""
    turn, store = recorder()
    first, old_first = both(1, 100.0, FIRST)
    second, old_second = both(
        2, 100.0105, SECOND + [(8 + i, [BlockDelta(0, "x")]) for i in range(5)]
    )
    turn.attempts += [first, second]
    turn.completed(second, [(first, 6)])
    parts = [(old_first, old_first.delivered(6)), (old_second, old_second.events)]
    expected = old_message(parts, 2, interrupted=False)
    assert store.payload("assistant/message") == orjson.dumps(expected)


def test_a_continued_answer_cut_in_its_second_attempt() -> None:
    turn, store = recorder()
    first, old_first = both(1, 100.0, FIRST)
    second, old_second = both(2, 100.5, SECOND)
    turn.attempts += [first, second]
    turn.interrupted(second, 1, "sent", "client_cancel", [(first, 4)])
    parts = [(old_first, old_first.delivered(4)), (old_second, old_second.delivered(1))]
    expected = old_message(parts, 2, interrupted=True)
    expected["delivery"] = "sent"
    expected["usage"] = old_second.usage
    assert store.payload("assistant/message") == orjson.dumps(expected)


def test_a_failed_attempt_keeps_everything_it_received() -> None:
    turn, store = recorder()
    attempt, old = both(1, 100.0, FIRST)
    turn.attempts.append(attempt)
    turn.attempt_failed(attempt, UpstreamError("reset"))
    expected = {
        "reason": "provider_error",
        "attempt": 1,
        "stream": compact(old.events),
        "route": ROUTE,
        "usage": None,
    }
    assert store.payload("assistant/attempt") == orjson.dumps(expected)


class Queue:
    """Store.append over a queue that keeps each row it is given (the store's own code, none of
    its state but what append reads)."""

    _indexes_text = False  # as on PostgreSQL: no search text made

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows
        self._ends: OrderedDict[str, str] = OrderedDict()
        self._open: dict[str, set[str]] = {}
        self._turn_lanes: dict[str, object] = {}
        self._submitted = self._deferred = 0

    def _submit(self, write: Write, lane: object) -> None:
        self.rows.append(write.row)

    def append(self, event: NewEvent) -> None:
        Store.append(self, event)  # type: ignore[arg-type]


def test_the_store_writes_the_json_of_the_old_records() -> None:
    """What reaches the database is Store.append's JSON text of the payload."""
    rows: list[dict[str, Any]] = []

    attempt, old = both(1, 100.0, FIRST + SECOND)
    turn = TurnRecorder(Queue(rows), "c", "t")  # type: ignore[arg-type]
    turn.attempts.append(attempt)
    turn.completed(attempt)
    expected = old_message([(old, old.events)], 1, interrupted=False)
    payload = rows[0]["payload"]  # its JSON text, or a long answer's, encoded when stored
    assert isinstance(payload, str | DeferredPayload)
    assert as_text(payload) == orjson.dumps(expected).decode()


def test_a_long_answer_is_encoded_when_stored_and_the_same() -> None:
    """A run longer than a batch: the payload is queued unencoded and read from the log when
    written, giving the old JSON; later deltas (a drain after the client left) change nothing."""
    rows: list[dict[str, Any]] = []

    frames: list[tuple[int, list[StreamEvent]]] = [(1, [BlockStart(0, "text")])]
    frames += [(2 + i // 3, [BlockDelta(0, f"w{i} ")]) for i in range(40)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(compact_module, "BATCH", 4)
        patch.setattr(attempt_log, "BATCH", 4)
        patch.setattr(attempt_log, "_JOIN_AT", 3)
        attempt, old = both(1, 100.0, frames)
        turn = TurnRecorder(Queue(rows), "c", "t")  # type: ignore[arg-type]
        turn.attempts.append(attempt)
        turn.interrupted(attempt, 30, "acked", "client_disconnect")
        payload = rows[0]["payload"]
        assert isinstance(payload, DeferredPayload)
        for i in range(40, 50):  # the drain goes on after the turn's end was queued
            attempt.log.delta(0, f"late{i} ", 90.0)
        attempt.log.text()
        message = old_message([(old, old.delivered(30))], 1, interrupted=True)
        message["content"] = [{"type": "text", "text": "".join(f"w{i} " for i in range(29))}]
        message["delivery"] = "acked"
        message["usage"] = None
        assert bytes(payload.encode()) == orjson.dumps(message)
        assert as_text(payload) == orjson.dumps(message).decode()


def test_an_attempt_still_answers_as_it_did() -> None:
    """What other modules read off an Attempt: first token time, events, delivered events."""
    attempt, old = both(1, 100.0, FIRST + SECOND)
    assert attempt.started == 100.0
    assert attempt.first_token_ms == 3.0  # the first events, until the relay says otherwise
    attempt.first_token_ms = 12.0  # the relay: when the first content came
    assert attempt.first_token_ms == 12.0
    assert attempt.events == old.events
    for frames in range(len(FIRST + SECOND) + 1):
        assert attempt.delivered_events(frames) == old.delivered(frames)
    assert attempt.usage == old.usage
