"""The Anthropic Messages wire format: real captured streams, request translation, errors."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.errors import InvalidRequest, UpstreamProtocolError, UpstreamStreamError
from gateway.providers.anthropic_messages import (
    AnthropicStreamParser,
    openai_error_body,
    parse_message,
    to_anthropic_request,
)
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
from gateway.stream.sse import SSEFrame
from tests.fakes import expected, feed_fixture

TEXT = "anthropic-thinking-text.sse"
TOOL_USE = "anthropic-thinking-tool-use.sse"


def parse(name: str) -> tuple[list[StreamEvent], list[str], AnthropicStreamParser]:
    parser = AnthropicStreamParser()
    events, kinds = feed_fixture(name, parser)
    return events, kinds, parser


def frame(event: str, data: str) -> SSEFrame:
    return SSEFrame(raw=f"event: {event}\ndata: {data}\n\n".encode(), event=event, data=data)


# -- streams -------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [TEXT, TOOL_USE])
def test_assembly_matches_the_captured_values(name: str) -> None:
    want = expected(name)
    events, kinds, parser = parse(name)
    assembler = BlockAssembler.of(events)
    blocks = assembler.blocks()
    assert [b.index for b in blocks] == [b["index"] for b in want["blocks"]]
    thinking, second = blocks
    want_thinking, want_second = want["blocks"]
    assert thinking.to_content() == {
        "type": "reasoning",
        "text": want_thinking["thinking"]["value"],
        "signature": want_thinking["signature"]["value"],
    }
    if want_second["type"] == "text":
        assert second.to_content() == {"type": "text", "text": want_second["text"]["value"]}
    else:
        assert second.to_content() == {
            "type": "tool_call",
            "id": want_second["id"],
            "name": want_second["name"],
            "arguments": want_second["partial_json"]["value"],
        }
    assert parser.done and parser.finished
    assert kinds[-1] == "done"
    assert "ping" not in kinds and kinds.count("comment") == 1  # the one `event: ping`
    assert not [e for e in events if isinstance(e, StreamFailure)]


def test_finish_reasons_are_mapped() -> None:
    assert BlockAssembler.of(parse(TEXT)[0]).finish_reason == "stop"
    assert BlockAssembler.of(parse(TOOL_USE)[0]).finish_reason == "tool_calls"


def test_usage_is_cumulative_in_openai_names() -> None:
    want = expected(TEXT)
    usage = BlockAssembler.of(parse(TEXT)[0]).usage
    assert usage == {
        "prompt_tokens": 43,
        "completion_tokens": 282,
        "total_tokens": 325,
        "prompt_tokens_details": {"cached_tokens": 0},
        "provider_usage": {**want["usage_message_start"], **want["usage_message_delta"]},
    }


def test_thinking_tokens_become_reasoning_tokens() -> None:
    usage = BlockAssembler.of(parse(TOOL_USE)[0]).usage
    assert usage is not None
    assert (usage["prompt_tokens"], usage["completion_tokens"], usage["total_tokens"]) == (
        597,
        101,
        698,
    )
    assert usage["completion_tokens_details"] == {"reasoning_tokens": 45}
    assert usage["provider_usage"]["service_tier"] == "standard"  # from message_start


def test_cache_tokens_count_as_prompt_tokens() -> None:
    parser = AnthropicStreamParser()
    start = '{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}'
    parser.feed(frame("message_start", start))
    delta = (
        '{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":'
        '{"output_tokens":7,"cache_read_input_tokens":100,"cache_creation_input_tokens":5}}'
    )
    events, kind = parser.feed(frame("message_delta", delta))
    assert kind == "data"
    assert events[0] == Finish("length")
    assert isinstance(events[1], Usage)
    usage = events[1].usage
    assert usage["prompt_tokens"] == 115
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == 122
    assert usage["prompt_tokens_details"] == {"cached_tokens": 100}
    assert "completion_tokens_details" not in usage


def test_block_events_carry_anthropic_indexes() -> None:
    events, _, _ = parse(TOOL_USE)
    starts = [e for e in events if isinstance(e, BlockStart)]
    assert starts == [
        BlockStart(0, "reasoning"),
        BlockStart(1, "tool_call", id="toolu_01TUGHRCfso8VSw9ekt21nAR", name="get_temperature"),
    ]
    ends = [e for e in events if isinstance(e, BlockEnd)]
    assert [e.index for e in ends] == [0, 1]
    assert ends[1].data is None


def test_other_block_kinds_are_kept_with_their_data() -> None:
    parser = AnthropicStreamParser()
    redacted = '{"type":"redacted_thinking","data":"opaque"}'
    events, _ = parser.feed(
        frame(
            "content_block_start",
            '{"type":"content_block_start","index":0,"content_block":' + redacted + "}",
        )
    )
    assert events == [BlockStart(0, "redacted_thinking", data={"data": "opaque"})]
    block = '{"type":"server_tool_use","id":"srv_1","name":"web_search","input":{}}'
    events, _ = parser.feed(
        frame(
            "content_block_start",
            '{"type":"content_block_start","index":1,"content_block":' + block + "}",
        )
    )
    assert events == [
        BlockStart(
            1,
            "server_tool_use",
            data={"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
        )
    ]
    text = '{"type":"text","text":"Hi"}'
    events, _ = parser.feed(
        frame(
            "content_block_start",
            '{"type":"content_block_start","index":2,"content_block":' + text + "}",
        )
    )
    assert events == [BlockStart(2, "text"), BlockDelta(2, "Hi")]
    citation = '{"type":"citations_delta","citation":{"type":"char_location"}}'
    events, kind = parser.feed(
        frame(
            "content_block_delta",
            '{"type":"content_block_delta","index":2,"delta":' + citation + "}",
        )
    )
    assert (events, kind) == ([], "data")


def test_error_event_is_a_stream_failure_with_its_status() -> None:
    parser = AnthropicStreamParser()
    events, kind = parser.feed(
        frame(
            "error", '{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}'
        )
    )
    assert kind == "error"
    assert events == [
        StreamFailure(
            "Overloaded",
            {
                "type": "overloaded_error",
                "message": "Overloaded",
                "code": "overloaded",
                "status_code": 529,
            },
        )
    ]
    assert isinstance(events[0], StreamFailure)
    error = UpstreamStreamError(events[0].message, upstream=events[0].upstream)
    assert error.upstream_status == 529
    assert error.retryable


def test_invalid_request_error_event_is_not_retryable() -> None:
    events, _ = AnthropicStreamParser().feed(
        frame("error", '{"type":"error","error":{"type":"invalid_request_error","message":"x"}}')
    )
    failure = events[0]
    assert isinstance(failure, StreamFailure)
    assert failure.upstream["status_code"] == 400
    assert not UpstreamStreamError(failure.message, upstream=failure.upstream).retryable


def test_comments_and_pings() -> None:
    parser = AnthropicStreamParser()
    assert parser.feed(SSEFrame(raw=b": keep-alive\n\n")) == ([], "comment")
    assert parser.feed(frame("ping", '{"type": "ping"}')) == ([], "comment")
    assert not parser.done


def test_invalid_json_is_a_protocol_error() -> None:
    with pytest.raises(UpstreamProtocolError):
        AnthropicStreamParser().feed(frame("content_block_delta", "{oops"))


# -- non-streaming -------------------------------------------------------------------------------


def test_parse_message_gives_the_same_blocks() -> None:
    events = parse_message(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-5",
            "content": [
                {"type": "thinking", "thinking": "Think.", "signature": "sig=="},
                {"type": "text", "text": "Calling."},
                {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": 1}},
            ],
            "stop_reason": "tool_use",
            "stop_sequence": None,
            "usage": {"input_tokens": 3, "output_tokens": 4},
        }
    )
    assembler = BlockAssembler.of(events)
    assert [b.to_content() for b in assembler.blocks()] == [
        {"type": "reasoning", "text": "Think.", "signature": "sig=="},
        {"type": "text", "text": "Calling."},
        {"type": "tool_call", "id": "toolu_1", "name": "f", "arguments": '{"a":1}'},
    ]
    assert assembler.finish_reason == "tool_calls"
    assert assembler.usage is not None
    assert assembler.usage["total_tokens"] == 7


def test_parse_message_error_body() -> None:
    events = parse_message(
        {"type": "error", "error": {"type": "rate_limit_error", "message": "Slow down"}}
    )
    assert events == [
        StreamFailure(
            "Slow down",
            {
                "type": "rate_limit_error",
                "message": "Slow down",
                "code": "rate_limit_exceeded",
                "status_code": 429,
            },
        )
    ]


def test_openai_error_body() -> None:
    body = {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "Overloaded"},
        "request_id": "req_1",
    }
    assert openai_error_body(529, body) == {
        "error": {
            "message": "Overloaded",
            "type": "overloaded_error",
            "code": "overloaded",
            "param": None,
        }
    }
    assert openai_error_body(429, None)["error"] == {
        "message": "upstream returned HTTP 429",
        "type": "rate_limit_error",
        "code": "rate_limit_exceeded",
        "param": None,
    }


# -- requests ------------------------------------------------------------------------------------


def request(**body: Any) -> dict[str, Any]:
    body.setdefault("messages", [{"role": "user", "content": "Hi"}])
    return to_anthropic_request(body, "claude-x", stream=True)


def test_minimal_request_gets_the_default_max_tokens() -> None:
    assert request() == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 4096,
        "stream": True,
    }


def test_system_and_developer_messages_become_system() -> None:
    out = request(
        messages=[
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]},
            {"role": "user", "content": "Hi"},
        ]
    )
    assert out["system"] == "Be brief.\n\nBe kind."
    assert [m["role"] for m in out["messages"]] == ["user"]


def test_parameters_are_translated_and_openai_only_ones_dropped() -> None:
    out = request(
        max_completion_tokens=100,
        max_tokens=50,
        temperature=0.2,
        top_p=0.9,
        stop="END",
        user="u-1",
        n=1,
        seed=7,
        presence_penalty=0.5,
        stream_options={"include_usage": True},
        response_format={"type": "text"},
    )
    assert out == {
        "model": "claude-x",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 100,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop_sequences": ["END"],
        "metadata": {"user_id": "u-1"},
        "stream": True,
    }
    assert request(stop=["a", "b"])["stop_sequences"] == ["a", "b"]
    assert request(max_tokens=9)["max_tokens"] == 9


def test_tools_and_tool_choice() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_temperature",
                "description": "Temperature in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "now"}},
    ]
    out = request(tools=tools, tool_choice="auto")
    assert out["tools"] == [
        {
            "name": "get_temperature",
            "description": "Temperature in a city.",
            "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
        {"name": "now", "input_schema": {"type": "object", "properties": {}}},
    ]
    assert out["tool_choice"] == {"type": "auto"}
    assert request(tools=tools, tool_choice="required")["tool_choice"] == {"type": "any"}
    assert request(tools=tools, tool_choice="none")["tool_choice"] == {"type": "none"}
    named = {"type": "function", "function": {"name": "now"}}
    assert request(tools=tools, tool_choice=named)["tool_choice"] == {"type": "tool", "name": "now"}
    assert "tool_choice" not in request(tools=tools)
    assert request(tools=tools, parallel_tool_calls=False)["tool_choice"] == {
        "type": "auto",
        "disable_parallel_tool_use": True,
    }


def test_tool_round_trip_merges_results_and_the_next_user_text() -> None:
    out = request(
        messages=[
            {"role": "user", "content": "Weather in Utrecht and Delft?"},
            {
                "role": "assistant",
                "content": "Checking.",
                "reasoning_content": "The user wants two cities.",
                "tool_calls": [
                    {
                        "id": "toolu_1",
                        "type": "function",
                        "function": {"name": "get_temperature", "arguments": '{"city":"Utrecht"}'},
                    },
                    {
                        "id": "toolu_2",
                        "type": "function",
                        "function": {"name": "get_temperature", "arguments": "{not json"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "toolu_1", "content": "12C"},
            {
                "role": "tool",
                "tool_call_id": "toolu_2",
                "content": [{"type": "text", "text": "13C"}],
            },
            {"role": "user", "content": "And in Fahrenheit?"},
        ]
    )
    assert out["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Utrecht and Delft?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking."},
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "get_temperature",
                    "input": {"city": "Utrecht"},
                },
                {"type": "tool_use", "id": "toolu_2", "name": "get_temperature", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12C"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "content": "13C"},
                {"type": "text", "text": "And in Fahrenheit?"},
            ],
        },
    ]


def test_consecutive_same_role_messages_are_merged() -> None:
    out = request(
        messages=[
            {"role": "user", "content": "One."},
            {"role": "user", "content": "Two."},
            {"role": "assistant", "content": "A."},
            {"role": "assistant", "content": "B."},
        ]
    )
    assert out["messages"] == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "One."}, {"type": "text", "text": "Two."}],
        },
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "A."}, {"type": "text", "text": "B."}],
        },
    ]


def test_image_data_url_becomes_a_base64_image() -> None:
    out = request(
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0K"}},
                    {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}},
                ],
            }
        ]
    )
    assert out["messages"][0]["content"] == [
        {"type": "text", "text": "What is this?"},
        {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0K"},
        },
        {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}},
    ]


def test_unsupported_content_parts_are_rejected() -> None:
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    with pytest.raises(InvalidRequest):
        request(messages=[{"role": "user", "content": [audio]}])


def test_reasoning_effort_enables_thinking_within_max_tokens() -> None:
    out = request(reasoning_effort="medium", temperature=0.3, top_p=0.5)
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert out["max_tokens"] > 4096
    assert "temperature" not in out and "top_p" not in out  # rejected with thinking on
    # The client's cap stays the answer's room: max_tokens is raised to make it so
    # (the rule: tests/providers/test_anthropic_fidelity.py).
    out = request(reasoning_effort="high", max_tokens=8000)
    assert out["thinking"] == {"type": "enabled", "budget_tokens": 16384}
    assert out["max_tokens"] == 16384 + 4096
    out = request(reasoning_effort="low", max_tokens=500)
    assert (out["thinking"]["budget_tokens"], out["max_tokens"]) == (1024, 1524)
    assert request(reasoning_effort="low")["thinking"]["budget_tokens"] == 1024


def test_thinking_passes_through() -> None:
    thinking = {"type": "enabled", "budget_tokens": 2048}
    out = request(thinking=thinking, reasoning_effort="high")
    assert out["thinking"] == thinking
    assert out["max_tokens"] > 2048
