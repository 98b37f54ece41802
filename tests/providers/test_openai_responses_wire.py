"""The OpenAI Responses wire format: real captured streams, whole Response objects, errors."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.errors import UpstreamProtocolError
from gateway.providers.openai_responses import ResponsesStreamParser, parse_response
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import (
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamEvent,
    StreamFailure,
    Usage,
)
from gateway.stream.sse import SSEDecoder, SSEFrame
from tests.fakes import expected, feed_fixture, fixture_bytes

FUNCTION_CALL = "openai-responses-text-function-call.sse"
SUMMARY = "openai-responses-reasoning-summary.sse"


def parse(name: str) -> tuple[list[StreamEvent], list[str], ResponsesStreamParser]:
    parser = ResponsesStreamParser()
    events, kinds = feed_fixture(name, parser)
    return events, kinds, parser


def frame(event: str, data: str) -> SSEFrame:
    return SSEFrame(raw=f"event: {event}\ndata: {data}\n\n".encode(), event=event, data=data)


def event(obj: dict[str, Any]) -> SSEFrame:
    return frame(str(obj["type"]), orjson.dumps(obj).decode())


def completed_response(name: str) -> dict[str, Any]:
    for f in SSEDecoder().feed(fixture_bytes(name)):
        if f.event == "response.completed" and f.data is not None:
            response: dict[str, Any] = orjson.loads(f.data)["response"]
            return response
    raise AssertionError("no response.completed event")


def expected_contents(name: str) -> list[dict[str, Any]]:
    """The blocks the fixture should assemble into, in stream order."""
    want = expected(name)
    out: list[dict[str, Any]] = []
    for summary in want["reasoning_summary"]:
        out.append({"type": "reasoning", "text": summary["text"]["value"]})
    for text in want["output_text"]:
        out.append({"type": "text", "text": text["text"]["value"]})
    for call in want["function_calls"]:
        out.append(
            {
                "type": "tool_call",
                "id": call["call_id"],
                "name": call["name"],
                "arguments": call["arguments"]["value"],
            }
        )
    return out


def expected_usage(name: str) -> dict[str, Any]:
    usage = expected(name)["usage"]
    return {
        "prompt_tokens": usage["input_tokens"],
        "completion_tokens": usage["output_tokens"],
        "total_tokens": usage["total_tokens"],
        "prompt_tokens_details": {"cached_tokens": usage["input_tokens_details"]["cached_tokens"]},
        "completion_tokens_details": {
            "reasoning_tokens": usage["output_tokens_details"]["reasoning_tokens"]
        },
        "provider_usage": usage,
    }


def check_block_events(events: list[StreamEvent]) -> None:
    """Indexes 0, 1, 2... in first-seen order; one start and one end per block; deltas inside."""
    starts = [e.index for e in events if isinstance(e, BlockStart)]
    ends = [e.index for e in events if isinstance(e, BlockEnd)]
    assert starts == list(range(len(starts)))
    assert sorted(ends) == starts
    open_: set[int] = set()
    for e in events:
        if isinstance(e, BlockStart):
            open_.add(e.index)
        elif isinstance(e, BlockDelta):
            assert e.index in open_
        elif isinstance(e, BlockEnd):
            open_.remove(e.index)
    assert not open_


# -- streams -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [FUNCTION_CALL, SUMMARY])
def test_stream_assembly_matches_the_captured_values(name: str) -> None:
    events, kinds, parser = parse(name)
    check_block_events(events)
    assembler = BlockAssembler.of(events)
    assert [b.to_content() for b in assembler.blocks()] == expected_contents(name)
    assert assembler.usage == expected_usage(name)
    assert kinds[-1] == "done"
    assert set(kinds[:-1]) == {"data"}
    assert parser.done and parser.finished
    assert [e for e in events if isinstance(e, Finish)] == [
        Finish("tool_calls" if name == FUNCTION_CALL else "stop")
    ]
    # The terminal event carries Finish then Usage, last of all.
    assert isinstance(events[-2], Finish) and isinstance(events[-1], Usage)


def test_four_summary_parts_are_four_reasoning_blocks_in_order() -> None:
    events, _, _ = parse(SUMMARY)
    blocks = BlockAssembler.of(events).blocks()
    assert [b.kind for b in blocks] == ["reasoning"] * 4 + ["text"]
    assert [b.index for b in blocks] == [0, 1, 2, 3, 4]
    assert [len(b.text) for b in blocks] == [460, 517, 540, 505, 1251]
    # Each block ends before the next one starts.
    order = [(type(e).__name__, e.index) for e in events if isinstance(e, (BlockStart, BlockEnd))]
    assert order == [(kind, i) for i in range(5) for kind in ("BlockStart", "BlockEnd")]


def test_function_call_block_carries_call_id_and_name() -> None:
    events, _, _ = parse(FUNCTION_CALL)
    starts = [e for e in events if isinstance(e, BlockStart)]
    # The reasoning item has no summary: no block for it.
    assert starts == [
        BlockStart(0, "text"),
        BlockStart(1, "tool_call", "call_LabG58Uhrq9kZvR52BYKjToD", "get_capital"),
    ]
    arguments = [e.text for e in events if isinstance(e, BlockDelta) and e.index == 1]
    assert len(arguments) == 7


# -- whole responses -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", [FUNCTION_CALL, SUMMARY])
def test_parse_response_gives_the_same_blocks(name: str) -> None:
    events = parse_response(completed_response(name))
    check_block_events(events)
    assembler = BlockAssembler.of(events)
    assert [b.to_content() for b in assembler.blocks()] == expected_contents(name)
    assert assembler.finish_reason == ("tool_calls" if name == FUNCTION_CALL else "stop")
    assert assembler.usage == expected_usage(name)
    streamed = BlockAssembler.of(parse(name)[0])
    assert [b.to_content() for b in assembler.blocks()] == [
        b.to_content() for b in streamed.blocks()
    ]


def test_parse_response_failed_is_a_failure() -> None:
    events = parse_response(
        {
            "status": "failed",
            "error": {"code": "server_error", "message": "The model failed."},
            "output": [],
        }
    )
    assert events == [
        StreamFailure(
            "The model failed.",
            {"code": "server_error", "message": "The model failed.", "status_code": 500},
        )
    ]


def test_parse_response_incomplete_is_length() -> None:
    events = parse_response(
        {
            "status": "incomplete",
            "incomplete_details": {"reason": "max_output_tokens"},
            "output": [
                {
                    "type": "message",
                    "content": [{"type": "output_text", "text": "Hel"}],
                }
            ],
            "usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
        }
    )
    assert events[:3] == [BlockStart(0, "text"), BlockDelta(0, "Hel"), BlockEnd(0)]
    assert events[3] == Finish("length")
    assert events[4] == Usage(
        {
            "prompt_tokens": 1,
            "completion_tokens": 2,
            "total_tokens": 3,
            "provider_usage": {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
        }
    )


# -- terminal events and errors ------------------------------------------------------------------


def test_response_failed_event_is_a_stream_failure() -> None:
    parser = ResponsesStreamParser()
    events, kind = parser.feed(
        event(
            {
                "type": "response.failed",
                "response": {
                    "status": "failed",
                    "error": {"code": "rate_limit_exceeded", "message": "Slow down."},
                },
            }
        )
    )
    assert kind == "error"
    assert events == [
        StreamFailure(
            "Slow down.",
            {"code": "rate_limit_exceeded", "message": "Slow down.", "status_code": 429},
        )
    ]
    assert not parser.finished


def test_error_event_is_a_stream_failure() -> None:
    events, kind = ResponsesStreamParser().feed(
        event({"type": "error", "code": "server_error", "message": "Boom", "param": None})
    )
    assert kind == "error"
    assert events == [
        StreamFailure("Boom", {"code": "server_error", "message": "Boom", "status_code": 500})
    ]


@pytest.mark.parametrize(
    ("reason", "finish"),
    [("max_output_tokens", "length"), ("content_filter", "content_filter")],
)
def test_response_incomplete_event(reason: str, finish: str) -> None:
    parser = ResponsesStreamParser()
    parser.feed(
        event(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {"type": "message", "content": []},
            }
        )
    )
    parser.feed(
        event(
            {
                "type": "response.output_text.delta",
                "output_index": 0,
                "content_index": 0,
                "delta": "x",
            }
        )
    )
    events, kind = parser.feed(
        event(
            {
                "type": "response.incomplete",
                "response": {
                    "status": "incomplete",
                    "incomplete_details": {"reason": reason},
                    "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2},
                },
            }
        )
    )
    assert kind == "done"
    assert events[0] == BlockEnd(0)  # the open text block is closed
    assert events[1] == Finish(finish)
    assert isinstance(events[2], Usage)
    assert parser.done and parser.finished


def test_created_and_unknown_events_give_nothing() -> None:
    parser = ResponsesStreamParser()
    for obj in (
        {"type": "response.created", "response": {"status": "in_progress"}},
        {"type": "response.in_progress", "response": {"status": "in_progress"}},
        {"type": "response.something_new", "output_index": 0},
    ):
        assert parser.feed(event(obj)) == ([], "data")
    assert parser.feed(SSEFrame(raw=b": keep-alive\n\n")) == ([], "comment")


def test_invalid_json_raises() -> None:
    with pytest.raises(UpstreamProtocolError):
        ResponsesStreamParser().feed(frame("response.output_text.delta", "{not json"))
    with pytest.raises(UpstreamProtocolError):
        ResponsesStreamParser().feed(frame("response.output_text.delta", "[1, 2]"))


def test_unknown_item_is_a_block_of_its_kind() -> None:
    parser = ResponsesStreamParser()
    added = {"type": "web_search_call", "id": "ws_1", "status": "in_progress"}
    done = {**added, "status": "completed"}
    a, _ = parser.feed(
        event({"type": "response.output_item.added", "output_index": 0, "item": added})
    )
    d, _ = parser.feed(
        event({"type": "response.output_item.done", "output_index": 0, "item": done})
    )
    assert a == [BlockStart(0, "web_search_call", data=added)]
    assert d == [BlockEnd(0, done)]


def test_reasoning_text_deltas_are_reasoning() -> None:
    parser = ResponsesStreamParser()
    events: list[StreamEvent] = []
    for obj in (
        {"type": "response.output_item.added", "output_index": 0, "item": {"type": "reasoning"}},
        {
            "type": "response.reasoning_text.delta",
            "output_index": 0,
            "content_index": 0,
            "delta": "a",
        },
        {
            "type": "response.reasoning_text.delta",
            "output_index": 0,
            "content_index": 0,
            "delta": "b",
        },
        {
            "type": "response.reasoning_text.done",
            "output_index": 0,
            "content_index": 0,
            "text": "ab",
        },
        {"type": "response.output_item.done", "output_index": 0, "item": {"type": "reasoning"}},
    ):
        events += parser.feed(event(obj))[0]
    assert events == [
        BlockStart(0, "reasoning"),
        BlockDelta(0, "a"),
        BlockDelta(0, "b"),
        BlockEnd(0),
    ]
