"""derive_messages: model history from surface events (docs/recording.md, "Model history")."""

from __future__ import annotations

from typing import Any

from gateway.conversations.derive import ABORTED_BEFORE_DISPATCH, derive_messages
from gateway.storage.records import Event

_seq = 0


def ev(kind: str, **payload: Any) -> Event:
    global _seq
    _seq += 1
    return Event("c", _seq, "t", kind, 0.0, payload)


CALL = {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": '{"q": 1}'}


def test_only_surface_events_make_history() -> None:
    events = [
        ev("user/message", content="hi"),
        ev("assistant/attempt", reason="provider_error", stream=[]),
        ev("request/error", status=500),
        ev(
            "assistant/message",
            content=[{"type": "reasoning", "text": "r"}, {"type": "text", "text": "Hel"}],
            interrupted=True,
        ),
        ev("turn/end", status="aborted"),
    ]
    assert derive_messages(events) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "Hel", "reasoning_content": "r"},
    ]


def test_a_tool_call_without_a_result_gets_a_synthetic_one() -> None:
    events = [
        ev("user/message", content="look it up"),
        ev("assistant/message", content=[CALL, {**CALL, "id": "c2"}]),
        ev("tool/result", tool_call_id="c2", content="found", synthetic=False),
        ev("user/message", content="and?"),
    ]
    messages = derive_messages(events)
    assert messages[1]["tool_calls"][0]["function"] == {"name": "lookup", "arguments": '{"q": 1}'}
    assert messages[1]["content"] is None
    assert messages[2] == {"role": "tool", "tool_call_id": "c2", "content": "found"}
    assert messages[3]["tool_call_id"] == "c1"
    assert ABORTED_BEFORE_DISPATCH in messages[3]["content"]
    assert messages[4] == {"role": "user", "content": "and?"}


def test_a_trailing_call_is_closed_too_unless_asked_not_to() -> None:
    events = [ev("user/message", content="x"), ev("assistant/message", content=[CALL])]
    assert derive_messages(events)[-1]["role"] == "tool"
    assert derive_messages(events, synthesize=False)[-1]["role"] == "assistant"


def test_the_last_answers_calls_can_stay_pending_while_earlier_ones_close() -> None:
    events = [
        ev("user/message", content="x"),
        ev("assistant/message", content=[CALL]),
        ev("user/message", content="never mind, y"),  # c1 left unanswered: aborted
        ev("assistant/message", content=[{**CALL, "id": "c2"}]),  # the last answer: pending
    ]
    messages = derive_messages(events, close_last=False)
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "user", "assistant"]
    assert messages[2]["tool_call_id"] == "c1"
    assert ABORTED_BEFORE_DISPATCH in messages[2]["content"]


def test_a_result_sent_after_a_later_message_is_moved_up_to_its_call() -> None:
    """Providers take a tool result only right after its call: one that comes later in the
    same messages answers it there, and nothing synthetic is made up for it."""
    from gateway.conversations.derive import close_unanswered

    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}, {"id": "c2"}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "18 C"}
    again = {"role": "user", "content": "Weather?"}
    closed = close_unanswered([{"role": "user", "content": "Weather?"}, call, again, result])
    assert closed[1:4] == [call, result, closed[3]]
    assert closed[3]["tool_call_id"] == "c2" and ABORTED_BEFORE_DISPATCH in closed[3]["content"]
    assert closed[4:] == [again]
