"""The payload types name what the recorder writes: each event's payload, as a turn records it
for every way a turn can end, has every key its TypedDict requires and none it does not name
(docs/recording.md, "The event log"). So the types stay true as the recorder changes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NotRequired, Required, get_origin, get_type_hints

import pytest

from gateway.conversations.recorder import Attempt, TurnRecorder
from gateway.errors import UpstreamError
from gateway.storage.records import (
    ASSISTANT_ATTEMPT,
    ASSISTANT_MESSAGE,
    CONVERSATION_NOTE,
    REQUEST_ERROR,
    TOOL_RESULT,
    TURN_END,
    USER_MESSAGE,
    AssistantMessagePayload,
    AttemptPayload,
    Checkpoint,
    CheckpointAttempt,
    CheckpointMessage,
    ContentBlock,
    Conversation,
    DeliveredPrefix,
    NewEvent,
    NotePayload,
    RequestErrorPayload,
    Route,
    Segment,
    TokenCounts,
    ToolResultPayload,
    TurnEndPayload,
    TurnStart,
    UserMessagePayload,
)
from gateway.stream.events import BlockDelta, BlockEnd, BlockStart, Finish, StreamEvent, Usage

PAYLOADS: dict[str, Any] = {
    USER_MESSAGE: UserMessagePayload,
    TOOL_RESULT: ToolResultPayload,
    ASSISTANT_MESSAGE: AssistantMessagePayload,
    ASSISTANT_ATTEMPT: AttemptPayload,
    REQUEST_ERROR: RequestErrorPayload,
    TURN_END: TurnEndPayload,
    CONVERSATION_NOTE: NotePayload,
}
# The TypedDicts inside payloads, by the key that holds them (a list of them, or one).
NESTED: dict[str, Any] = {
    "route": Route,
    "content": ContentBlock,
    "segments": Segment,
    "delivered": DeliveredPrefix,
    "message": CheckpointMessage,
    "attempts": CheckpointAttempt,
}
ROUTE = {"provider": "openai", "deployment": "d", "model": "m"}
FRAMES: list[list[StreamEvent]] = [
    [BlockStart(0, "reasoning"), BlockDelta(0, "think")],
    [BlockEnd(0, {"signature": "s"}), BlockStart(1, "text"), BlockDelta(1, "Hello")],
    [BlockDelta(1, " world"), BlockEnd(1)],
    [BlockStart(2, "tool_call", "call_1", "lookup"), BlockDelta(2, "{}"), BlockEnd(2)],
    [Finish("tool_calls")],
    [Usage({"prompt_tokens": 4, "completion_tokens": 6, "total_tokens": 10})],
]


def keys(typed: Any) -> tuple[set[str], set[str]]:
    """(required, all) keys of a TypedDict, read from its annotations: under postponed
    annotations Python 3.11's own `__required_keys__` cannot tell `NotRequired`."""
    required, named = set(), set()
    for name, hint in get_type_hints(typed, include_extras=True).items():
        named.add(name)
        origin = get_origin(hint)
        if origin is Required or (origin is not NotRequired and typed.__total__):
            required.add(name)
    return required, named


def check(payload: Mapping[str, Any], typed: Any, where: str) -> None:
    required, named = keys(typed)
    assert required <= set(payload), f"{where}: missing {required - set(payload)}"
    assert set(payload) <= named, f"{where}: not in {typed.__name__}: {set(payload) - named}"
    for key, value in payload.items():
        inner = NESTED.get(key)
        if inner is None or value is None or isinstance(value, str):
            continue
        for i, item in enumerate(value if isinstance(value, list) else [value]):
            if isinstance(item, Mapping):
                check(item, inner, f"{where}.{key}[{i}]")


class Kept:
    """The writes a turn makes."""

    def __init__(self) -> None:
        self.events: list[NewEvent] = []

    def create_conversation(self, conversation: Conversation) -> None:
        pass

    def start_turn(self, turn: TurnStart) -> None:
        pass

    def append(self, event: NewEvent) -> None:
        self.events.append(event)

    async def durable_enough(self) -> None:
        pass

    def mark(self) -> tuple[int, None]:
        return (len(self.events), None)


def turn_with(frames: int, number: int = 1) -> tuple[TurnRecorder, Kept, Attempt]:
    store = Kept()
    turn = TurnRecorder(store, "c", "t")
    turn.response_id = "chatcmpl-1"
    turn.begin(
        new_conversation=None,
        new_messages=[
            {"role": "user", "content": "hi", "name": "ann"},
            {"role": "tool", "tool_call_id": "call_0", "content": "42"},
            {"role": "assistant", "content": "ok", "reasoning_content": "r", "tool_calls": []},
        ],
        request={},
        note={"note": "thread_ambiguous", "candidates": ["c1", "c2"]},
    )
    attempt = Attempt(number, ROUTE, started=100.0)
    for i, events in enumerate(FRAMES[:frames]):
        attempt.log.add(events, float(i))
        attempt.frame_written()
    turn.attempts.append(attempt)
    return turn, store, attempt


def checked(store: Kept) -> set[str]:
    for event in store.events:
        check(event.payload, PAYLOADS[event.type], event.type)
    return {event.type for event in store.events}


def test_a_completed_turn() -> None:
    turn, store, attempt = turn_with(len(FRAMES))
    turn.completed(attempt)
    assert checked(store) == {
        USER_MESSAGE,
        TOOL_RESULT,
        ASSISTANT_MESSAGE,
        CONVERSATION_NOTE,
        TURN_END,
    }
    check(store.events[-1].payload["usage"], TokenCounts, "usage")


@pytest.mark.parametrize("delivered", [0, 3])
def test_an_interrupted_turn(delivered: int) -> None:
    turn, store, attempt = turn_with(4)
    turn.interrupted(attempt, delivered, "acked", "client_disconnect")
    kinds = checked(store)
    assert (ASSISTANT_ATTEMPT if delivered == 0 else ASSISTANT_MESSAGE) in kinds


def test_a_continued_answer() -> None:
    turn, store, first = turn_with(3)
    second = Attempt(2, ROUTE, started=100.5)
    second.log.add(FRAMES[3] + FRAMES[4], 0.0)
    second.frame_written()
    turn.attempts.append(second)
    turn.completed(second, [(first, 2)])
    checked(store)
    assert "segments" in store.events[-2].payload


def test_a_failed_attempt_and_turn() -> None:
    turn, store, attempt = turn_with(3)
    turn.attempt_failed(attempt, UpstreamError("reset"), delivered=2)
    turn.failed(UpstreamError("reset"))
    assert {ASSISTANT_ATTEMPT, REQUEST_ERROR, TURN_END} <= checked(store)
    assert "delivered" in store.events[-3].payload


@pytest.mark.parametrize("delivered", [0, 3])
def test_a_checkpoint(delivered: int) -> None:
    turn, _, attempt = turn_with(4)
    check(turn.checkpoint(attempt, delivered, "acked"), Checkpoint, "checkpoint")
