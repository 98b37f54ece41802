"""The client-facing Anthropic Messages dialect, checked against the real `anthropic` SDK.

Rendered streams and bodies are fed to the installed SDK through a mock transport (its own SSE
decoder, event models and message accumulator), and back through the gateway's upstream
Anthropic parser, so both directions are held to the same wire format.
"""

from __future__ import annotations

from typing import Any

import anthropic
import httpx2
import orjson
import pytest
from anthropic.types import Message

from gateway.dialects.anthropic_messages import (
    MessagesStreamRenderer,
    error_body,
    error_type,
    message_body,
    parse_request,
)
from gateway.errors import (
    Conflict,
    GatewayError,
    InvalidRequest,
    NotFound,
    ServiceUnavailable,
    Unauthorized,
    UpstreamHTTPError,
    UpstreamStreamError,
    UpstreamTimeout,
)
from gateway.providers.anthropic_messages import AnthropicStreamParser
from gateway.providers.openai_chat import ChatStreamParser
from gateway.providers.params import ANTHROPIC_EXTRAS, ANTHROPIC_REQUEST
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import (
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamEvent,
    Usage,
)
from gateway.stream.sse import SSEDecoder
from tests.fakes import fixture_bytes

# -- helpers -------------------------------------------------------------------------------------


def request(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": "claude",
        "max_tokens": 1000,
        "messages": [{"role": "user", "content": "Hi"}],
    }
    body.update(fields)
    return body


def translate(**fields: Any) -> dict[str, Any]:
    """The chat body a request becomes, less the client's own body carried beside it."""
    body, _ = parse_request(orjson.dumps(request(**fields)))
    body.pop(ANTHROPIC_REQUEST)
    return body


def client(content: bytes, *, status: int = 200, strict: bool = False) -> anthropic.Anthropic:
    kind = "text/event-stream" if content.startswith(b"event:") else "application/json"

    def handler(_: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(status, content=content, headers={"content-type": kind})

    return anthropic.Anthropic(
        api_key="test",
        base_url="http://gateway.test",
        http_client=httpx2.Client(transport=httpx2.MockTransport(handler)),
        max_retries=0,
        _strict_response_validation=strict,
    )


def sdk_stream(body: bytes, *, strict: bool = False) -> tuple[list[Any], Message]:
    """The SDK's raw stream events and its accumulated message for a rendered stream."""
    sdk = client(body, strict=strict)
    kwargs: dict[str, Any] = {"model": "m", "max_tokens": 10, "messages": [{"role": "user"}]}
    with sdk.messages.stream(**kwargs) as stream:
        events = list(stream)
        return events, stream.get_final_message()


def rendered(*calls: list[StreamEvent], model: str = "m") -> bytes:
    renderer = MessagesStreamRenderer(model)
    return b"".join(renderer.render(events) for events in calls) + renderer.done()


def sse_events(data: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    frames = SSEDecoder().feed(data)
    assert all(f.data is not None for f in frames)
    return [(f.event, orjson.loads(f.data or "")) for f in frames]


def reparse(data: bytes) -> BlockAssembler:
    """A rendered stream through the gateway's own upstream Anthropic parser."""
    parser = AnthropicStreamParser()
    assembler = BlockAssembler()
    for frame in SSEDecoder().feed(data):
        events, _ = parser.feed(frame)
        for event in events:
            assembler.feed(event)
    assert parser.done and parser.finished
    return assembler


def relay(name: str, parser: AnthropicStreamParser | ChatStreamParser) -> bytes:
    """A captured upstream stream rendered frame by frame, as the pipeline does."""
    renderer = MessagesStreamRenderer("gateway-model")
    out = b""
    for frame in SSEDecoder().feed(fixture_bytes(name)):
        events, kind = parser.feed(frame)
        out += renderer.render(events)
        if kind == "done":
            out += renderer.done()
    return out


SIGNATURE = "EqsDCpQBCBAYAipA+sig/=="

THINKING_TEXT_TOOL: list[list[StreamEvent]] = [
    [BlockStart(0, "reasoning"), BlockDelta(0, "Let me "), BlockDelta(0, "think.")],
    [BlockEnd(0, {"signature": SIGNATURE})],
    [BlockStart(1, "text"), BlockDelta(1, "Checking "), BlockDelta(1, "the weather."), BlockEnd(1)],
    [BlockStart(2, "tool_call", id="toolu_1", name="get_weather"), BlockDelta(2, "")],
    [BlockDelta(2, '{"city": "Ut'), BlockDelta(2, 'recht", "days": [1, 2]}')],
    [Finish("tool_calls"), Usage({"prompt_tokens": 120, "completion_tokens": 42})],
]


# -- requests ------------------------------------------------------------------------------------


def test_a_minimal_request() -> None:
    sent = request(stream=True, temperature=0.2, top_p=0.9)
    body, parsed = parse_request(orjson.dumps(sent))
    carried = body.pop(ANTHROPIC_REQUEST)
    assert carried.current(body) == sent  # for an Anthropic deployment, as it came
    assert body == {
        "model": "claude",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1000,
        "temperature": 0.2,
        "top_p": 0.9,
        "stream": True,
    }
    assert parsed.model == "claude" and parsed.stream is True and parsed.max_tokens == 1000


def test_system_as_a_string_and_as_blocks() -> None:
    assert translate(system="Be brief.")["messages"][0] == {
        "role": "system",
        "content": "Be brief.",
    }
    blocks = [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Be kind."},
    ]
    assert translate(system=blocks)["messages"][0] == {
        "role": "system",
        "content": blocks,  # cache_control kept for an Anthropic upstream
    }
    assert translate(system=[{"type": "text", "text": "One"}])["messages"][0]["content"] == "One"
    assert translate(system="")["messages"][0]["role"] == "user"


def test_tool_use_and_tool_result_round_trip() -> None:
    messages = [
        {"role": "user", "content": "Weather in Utrecht?"},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Let me check."},
                {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "U"}},
                {"type": "tool_use", "id": "toolu_2", "name": "time", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Also: thanks."},
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "12 C"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": [{"type": "text", "text": "09:00"}],
                    "is_error": False,
                },
            ],
        },
    ]
    assert translate(messages=messages)["messages"] == [
        {"role": "user", "content": "Weather in Utrecht?"},
        {
            "role": "assistant",
            "content": "Let me check.",
            "reasoning_content": "Use the tool.",
            # Signed and redacted thinking kept whole, for an Anthropic upstream.
            "thinking_blocks": [
                {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
            ],
            "tool_calls": [
                {
                    "id": "toolu_1",
                    "type": "function",
                    "function": {"name": "weather", "arguments": '{"city":"U"}'},
                },
                {
                    "id": "toolu_2",
                    "type": "function",
                    "function": {"name": "time", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "12 C"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "09:00"},
        {"role": "user", "content": "Also: thanks."},
    ]


def test_a_user_turn_of_only_tool_results_and_an_assistant_turn_of_only_tool_use() -> None:
    messages = [
        {"role": "user", "content": "Go"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"a": [1]}}],
        },
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
    ]
    out = translate(messages=messages)["messages"]
    assert out[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": '{"a":[1]}'}}
        ],
    }
    assert out[2:] == [{"role": "tool", "tool_call_id": "t1", "content": ""}]


def test_images() -> None:
    png = {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}
    shot = {"type": "image", "source": {"type": "url", "url": "https://example.com/shot.jpg"}}
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": [shot]},
                {"type": "image", "source": png},
                {"type": "text", "text": "What is this?"},
            ],
        }
    ]
    assert translate(messages=messages)["messages"] == [
        {"role": "tool", "tool_call_id": "t1", "content": ""},
        {
            "role": "user",
            "content": [
                # OpenAI tool messages take no images: they follow in the user message.
                {"type": "image_url", "image_url": {"url": "https://example.com/shot.jpg"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
                {"type": "text", "text": "What is this?"},
            ],
        },
    ]


@pytest.mark.parametrize(
    ("budget", "effort"),
    [(1024, "low"), (2048, "low"), (2049, "medium"), (8192, "medium"), (8193, "high")],
)
def test_thinking(budget: int, effort: str) -> None:
    thinking = {"type": "enabled", "budget_tokens": budget}
    body = translate(thinking=thinking)
    assert body["thinking"] == thinking
    assert body["reasoning_effort"] == effort


def test_thinking_disabled_or_adaptive() -> None:
    body = translate(thinking={"type": "disabled"})
    assert "thinking" not in body and "reasoning_effort" not in body
    body = translate(thinking={"type": "adaptive", "display": "omitted"})
    assert body["thinking"] == {"type": "adaptive", "display": "omitted"}
    assert "reasoning_effort" not in body


TOOLS = [
    {
        "name": "weather",
        "description": "The weather.",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
        "cache_control": {"type": "ephemeral"},
    },
    {"name": "time", "input_schema": {"type": "object"}, "type": "custom"},
]


@pytest.mark.parametrize(
    ("choice", "want"),
    [
        ({"type": "auto"}, "auto"),
        ({"type": "any"}, "required"),
        ({"type": "none"}, "none"),
        ({"type": "tool", "name": "time"}, {"type": "function", "function": {"name": "time"}}),
    ],
)
def test_tools_and_tool_choice(choice: dict[str, Any], want: Any) -> None:
    body = translate(tools=TOOLS, tool_choice=choice)
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "weather",
                "description": "The weather.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
            "cache_control": {"type": "ephemeral"},
        },
        {"type": "function", "function": {"name": "time", "parameters": {"type": "object"}}},
    ]
    assert body["tool_choice"] == want
    assert "parallel_tool_calls" not in body


def test_disable_parallel_tool_use() -> None:
    choice = {"type": "auto", "disable_parallel_tool_use": True}
    assert translate(tools=TOOLS, tool_choice=choice)["parallel_tool_calls"] is False
    # OpenAI refuses tool_choice without tools.
    assert "tool_choice" not in translate(tool_choice=choice)


def test_stop_sequences_metadata_and_anthropic_only_fields() -> None:
    body = translate(
        stop_sequences=["END", "STOP"],
        metadata={"user_id": "user-42"},
        top_k=5,
        service_tier="auto",
    )
    assert body["stop"] == ["END", "STOP"]
    assert body["user"] == "user-42"
    # top_k rides along (an Anthropic upstream takes it; others refuse it by name).
    assert body["top_k"] == 5
    assert body["service_tier"] == "auto" and "metadata" not in body
    assert translate(service_tier="standard_only")["service_tier"] == "default"
    assert_invalid(request(service_tier="priority"), "service_tier")


def test_output_config_becomes_response_format() -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}}
    body = translate(output_config={"format": {"type": "json_schema", "schema": schema}})
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema},
    }
    assert_invalid(request(output_config={"format": {"type": "xml"}}), "output_config.format")


def assert_invalid(body: dict[str, Any] | bytes, param: str | None) -> InvalidRequest:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    with pytest.raises(InvalidRequest) as info:
        parse_request(raw)
    assert info.value.param == param
    assert info.value.status == 400
    return info.value


def test_validation_errors_name_the_field() -> None:
    body = request()
    del body["max_tokens"]
    assert "Missing required parameter" in assert_invalid(body, "max_tokens").message
    assert_invalid(request(max_tokens=0), "max_tokens")
    assert_invalid(request(max_tokens="100"), "max_tokens")
    assert_invalid(request(messages=[]), "messages")
    assert_invalid(request(messages=[{"role": "tool", "content": "x"}]), "messages[0].role")
    assert_invalid(request(messages=[{"role": "user", "content": 5}]), "messages[0].content")
    assert_invalid(request(messages=[{"role": "user"}]), "messages[0].content")
    assert_invalid(request(system=[{"type": "image"}]), "system")
    assert_invalid(request(temperature=1.5), "temperature")
    assert_invalid(request(thinking={"type": "enabled"}), "thinking.budget_tokens")
    assert_invalid(
        request(thinking={"type": "enabled", "budget_tokens": 100}), "thinking.budget_tokens"
    )
    assert_invalid(request(tool_choice={"type": "sometimes"}), "tool_choice.type")
    assert_invalid(request(tools=TOOLS, tool_choice={"type": "tool"}), "tool_choice.name")
    assert_invalid(request(tools=[{"name": "f"}]), "tools[0].input_schema")
    web_search = {"type": "web_search_20250305", "name": "web_search"}
    assert_invalid(request(tools=[web_search]), "tools[0].type")
    assert_invalid(b"", None)
    assert_invalid(b"[1]", None)


def test_content_the_gateway_cannot_carry_is_refused() -> None:
    pdf = {"type": "document", "source": {"type": "base64", "media_type": "application/pdf"}}
    file_image = {"type": "image", "source": {"type": "file", "file_id": "file_1"}}
    bad_call = {"type": "tool_use", "id": "t", "name": "f", "input": "not an object"}
    cases = [
        ({"role": "user", "content": [{"type": "text", "text": "a"}, pdf]}, "content[1].type"),
        ({"role": "user", "content": [file_image]}, "content[0].source.type"),
        ({"role": "user", "content": [{"type": "tool_result"}]}, "content[0].tool_use_id"),
        ({"role": "user", "content": [{"type": "text"}]}, "content[0].text"),
        ({"role": "assistant", "content": [bad_call]}, "content[0].input"),
        ({"role": "assistant", "content": [{"type": "server_tool_use"}]}, "content[0].type"),
    ]
    for message, param in cases:
        assert_invalid(request(messages=[message]), f"messages[0].{param}")


# -- streams through the Anthropic SDK ----------------------------------------------------------


def test_thinking_text_and_tool_call_through_the_sdk() -> None:
    body = rendered(*THINKING_TEXT_TOOL)
    for strict in (False, True):
        events, message = sdk_stream(body, strict=strict)
        assert [type(b).__name__ for b in message.content] == [
            "ThinkingBlock",
            "ParsedTextBlock",
            "ToolUseBlock",
        ]
        thinking, text, tool = message.content
        assert thinking.type == "thinking"
        assert (thinking.thinking, thinking.signature) == ("Let me think.", SIGNATURE)
        assert text.type == "text" and text.text == "Checking the weather."
        assert tool.type == "tool_use"
        assert (tool.id, tool.name) == ("toolu_1", "get_weather")
        assert tool.input == {"city": "Utrecht", "days": [1, 2]}
        assert message.stop_reason == "tool_use"
        assert message.stop_sequence is None
        assert (message.usage.input_tokens, message.usage.output_tokens) == (120, 42)
        assert message.model == "m" and message.role == "assistant"
        assert message.id.startswith("msg_")
        assert events[0].type == "message_start" and events[-1].type == "message_stop"


def test_the_wire_format() -> None:
    body = rendered(*THINKING_TEXT_TOOL)
    assert body.startswith(b"event: message_start\ndata: {")
    events = sse_events(body)
    # The event name always equals the JSON type.
    assert all(name == obj["type"] for name, obj in events)
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None
    assert start["usage"] == {"input_tokens": 0, "output_tokens": 0}
    assert [(name, obj.get("index")) for name, obj in events[1:]] == [
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),  # signature_delta
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),  # the empty fragment is left out
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[4][1]["delta"] == {"type": "signature_delta", "signature": SIGNATURE}
    assert events[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use", "stop_sequence": None},
        "usage": {"input_tokens": 120, "output_tokens": 42},
    }


def test_round_trip_through_the_upstream_parser() -> None:
    original = BlockAssembler.of(e for events in THINKING_TEXT_TOOL for e in events)
    again = reparse(rendered(*THINKING_TEXT_TOOL))
    assert [b.to_content() for b in again.blocks()] == [b.to_content() for b in original.blocks()]
    assert again.finish_reason == "tool_calls"
    assert again.usage is not None
    assert (again.usage["prompt_tokens"], again.usage["completion_tokens"]) == (120, 42)


def test_a_real_anthropic_stream_relayed_through_events() -> None:
    """Upstream Anthropic bytes -> events -> rendered -> the SDK: the same message as direct."""
    name = "anthropic-thinking-tool-use.sse"
    _, direct = sdk_stream(fixture_bytes(name))
    _, relayed = sdk_stream(relay(name, AnthropicStreamParser()), strict=True)
    # `caller` ({"type": "direct"}) is not carried by the gateway's events.
    drop = {"caller"}
    assert [b.model_dump(exclude=drop) for b in relayed.content] == [
        b.model_dump(exclude=drop) for b in direct.content
    ]
    assert relayed.stop_reason == direct.stop_reason == "tool_use"
    assert (relayed.usage.input_tokens, relayed.usage.output_tokens) == (597, 101)
    assert relayed.usage.output_tokens_details is not None
    assert relayed.usage.output_tokens_details.thinking_tokens == 45


def test_a_real_openai_stream_with_usage_after_the_finish_reason() -> None:
    _, message = sdk_stream(relay("openai-chat-tool-call-usage.sse", ChatStreamParser()))
    (tool,) = message.content
    assert tool.type == "tool_use"
    assert (tool.id, tool.name) == ("call_ZR5UUuTt3pf61kjwAJIYdVMj", "get_capital")
    assert tool.input == {"country": "UK"}
    assert message.stop_reason == "tool_use"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (53, 15)


@pytest.mark.parametrize(
    ("reason", "want"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("tool_calls", "tool_use"),
        ("content_filter", "refusal"),
        ("something_else", "end_turn"),
        ("model_context_window_exceeded", "model_context_window_exceeded"),
    ],
)
def test_stop_reasons(reason: str, want: str) -> None:
    _, message = sdk_stream(rendered([BlockDelta(0, "x"), Finish(reason)]), strict=True)
    assert message.stop_reason == want
    assert message.usage.output_tokens == 0


def test_cached_and_reasoning_tokens() -> None:
    usage = {
        "prompt_tokens": 100,
        "completion_tokens": 30,
        "prompt_tokens_details": {"cached_tokens": 80},
        "completion_tokens_details": {"reasoning_tokens": 12},
    }
    _, message = sdk_stream(rendered([BlockDelta(0, "x"), Usage(usage), Finish("stop")]))
    assert message.usage.input_tokens == 20
    assert message.usage.cache_read_input_tokens == 80
    assert message.usage.output_tokens == 30
    assert message.usage.output_tokens_details is not None
    assert message.usage.output_tokens_details.thinking_tokens == 12


def test_blocks_are_opened_by_content_and_numbered_as_sent() -> None:
    body = rendered(
        [BlockStart(0, "text"), BlockDelta(0, ""), BlockEnd(0)],  # empty: never sent
        [BlockStart(1, "citations", data={"x": 1}), BlockDelta(1, "skipped"), BlockEnd(1)],
        [BlockStart(2, "reasoning"), BlockEnd(2, {"signature": "only-a-signature"})],
        [BlockDelta(7, "no start: "), BlockDelta(7, "text")],
        [BlockEnd(7), BlockDelta(7, "after the end")],
        [Finish("stop")],
    )
    starts = [obj for _, obj in sse_events(body) if obj["type"] == "content_block_start"]
    assert [(s["index"], s["content_block"]["type"]) for s in starts] == [
        (0, "thinking"),
        (1, "text"),
    ]
    _, message = sdk_stream(body, strict=True)
    thinking, text = message.content
    assert thinking.type == "thinking" and thinking.signature == "only-a-signature"
    assert text.type == "text" and text.text == "no start: text"


def test_redacted_thinking_from_an_anthropic_upstream() -> None:
    body = rendered(
        [BlockStart(0, "redacted_thinking", data={"data": "opaque=="}), BlockEnd(0)],
        [BlockStart(1, "text"), BlockDelta(1, "Hi"), Finish("stop")],
    )
    _, message = sdk_stream(body, strict=True)
    redacted, text = message.content
    assert redacted.type == "redacted_thinking" and redacted.data == "opaque=="
    assert text.type == "text" and text.text == "Hi"


def test_a_continuation_attempt_opens_new_blocks() -> None:
    """One renderer per response: a second attempt's indexes start at 0 again."""
    body = rendered(
        [BlockStart(0, "reasoning"), BlockDelta(0, "plan"), BlockEnd(0)],
        [BlockStart(1, "text"), BlockDelta(1, "The answer is")],
        # the upstream failed; the continuation's blocks restart at index 0
        [BlockStart(0, "text"), BlockDelta(0, " 42."), Finish("stop")],
    )
    _, message = sdk_stream(body, strict=True)
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
        ("thinking", None),
        ("text", "The answer is"),
        ("text", " 42."),
    ]


def test_the_first_render_starts_the_message_even_without_events() -> None:
    renderer = MessagesStreamRenderer("m")
    first = renderer.render([])
    assert [name for name, _ in sse_events(first)] == ["message_start"]
    assert renderer.render([]) == b""
    assert renderer.render([BlockDelta(0, "x")]).startswith(b"event: content_block_start")
    assert renderer.done().endswith(b'event: message_stop\ndata: {"type":"message_stop"}\n\n')
    assert renderer.done() == b"" and renderer.render([BlockDelta(0, "late")]) == b""


# -- cancel and errors ---------------------------------------------------------------------------


def test_cancelled() -> None:
    renderer = MessagesStreamRenderer("m")
    body = renderer.render([BlockStart(0, "reasoning"), BlockDelta(0, "hmm"), BlockEnd(0)])
    body += renderer.render([BlockStart(1, "text"), BlockDelta(1, "Partial an")])
    body += renderer.render([Usage({"prompt_tokens": 9, "completion_tokens": 3})])
    body += renderer.cancelled()
    names = [name for name, _ in sse_events(body)]
    assert names[-4:] == [
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert sse_events(body)[-2][1] == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn", "stop_sequence": None, "cancelled": True},
        "usage": {"input_tokens": 9, "output_tokens": 3},
    }
    for strict in (False, True):  # the SDK takes the extra field, strictly validated or not
        events, message = sdk_stream(body, strict=strict)
        assert message.content[1].type == "text" and message.content[1].text == "Partial an"
        assert message.stop_reason == "end_turn"
        (delta,) = [e for e in events if e.type == "message_delta"]
        assert delta.delta.cancelled is True
    assert renderer.cancelled() == b"" and renderer.done() == b""


def test_cancelled_before_anything_was_rendered() -> None:
    body = MessagesStreamRenderer("m").cancelled()
    assert [name for name, _ in sse_events(body)] == [
        "message_start",
        "message_delta",
        "message_stop",
    ]
    _, message = sdk_stream(body, strict=True)
    assert message.content == [] and message.stop_reason == "end_turn"


def test_cancel_after_relayed_frames_closes_what_the_upstream_left_open() -> None:
    """When an Anthropic upstream's bytes are relayed unchanged, `track` keeps the renderer in
    step, so that the cancel's frames continue that stream instead of starting another."""
    upstream = fixture_bytes("anthropic-thinking-tool-use.sse")
    frames = SSEDecoder().feed(upstream)
    cut = next(i for i, f in enumerate(frames) if f.event == "content_block_start" and i > 2)
    parser, renderer = AnthropicStreamParser(), MessagesStreamRenderer("m")
    relayed = b""
    for frame in frames[: cut + 2]:  # message_start ... the tool_use block's first delta
        events, _ = parser.feed(frame)
        renderer.track(events)
        relayed += frame.raw
    ending = renderer.cancelled()
    assert [name for name, _ in sse_events(ending)] == [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert sse_events(ending)[0][1]["index"] == 1
    _, message = sdk_stream(relayed + ending, strict=True)
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    assert message.usage.input_tokens == 597  # from the upstream's message_start


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (InvalidRequest("bad", param="x"), "invalid_request_error"),
        (Unauthorized("no key"), "authentication_error"),
        (GatewayError("boom"), "api_error"),
        (NotFound("gone"), "not_found_error"),
        (Conflict("cancelled"), "invalid_request_error"),
        (ServiceUnavailable("draining"), "api_error"),
        (UpstreamHTTPError(429, "slow down"), "rate_limit_error"),
        (UpstreamHTTPError(529, "overloaded"), "overloaded_error"),
        (UpstreamHTTPError(403, "no"), "permission_error"),
        (UpstreamHTTPError(500, "oops"), "api_error"),
        (UpstreamTimeout("late", phase="idle"), "timeout_error"),
        (UpstreamStreamError("busy", upstream={"type": "overloaded_error"}), "overloaded_error"),
        (UpstreamStreamError("slow", upstream={"code": 429}), "rate_limit_error"),
        (UpstreamStreamError("what", upstream={}), "api_error"),
    ],
)
def test_error_types(error: GatewayError, kind: str) -> None:
    assert error_type(error) == kind
    assert error_body(error) == {"type": "error", "error": {"type": kind, "message": error.message}}


def test_an_error_event_raises_in_the_sdk() -> None:
    renderer = MessagesStreamRenderer("m")
    body = renderer.render([BlockDelta(0, "Hel")])
    failure = renderer.error(UpstreamHTTPError(429, "Rate limited upstream"))
    assert failure == (
        b"event: error\n"
        b'data: {"type":"error","error":{"type":"rate_limit_error",'
        b'"message":"Rate limited upstream"}}\n\n'
    )
    assert renderer.done() == b"" and renderer.cancelled() == b""
    with pytest.raises(anthropic.APIStatusError) as info:
        sdk_stream(body + failure)
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "rate_limit_error"


@pytest.mark.parametrize(
    ("status", "exc"),
    [
        (400, anthropic.BadRequestError),
        (401, anthropic.AuthenticationError),
        (429, anthropic.RateLimitError),
        (529, anthropic.InternalServerError),
    ],
)
def test_error_bodies_as_http_responses(status: int, exc: type[Exception]) -> None:
    error = UpstreamHTTPError(status, "no luck")
    sdk = client(orjson.dumps(error_body(error)), status=status)
    with pytest.raises(exc) as info:
        sdk.messages.create(model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}])
    assert getattr(info.value, "body", None) == error_body(error)


# -- whole messages ------------------------------------------------------------------------------


def test_message_body_validates_as_an_sdk_message() -> None:
    events = [e for events in THINKING_TEXT_TOOL for e in events]
    raw = message_body("claude-x", BlockAssembler.of(events), None)
    message = Message.model_validate(orjson.loads(raw))
    thinking, text, tool = message.content
    assert thinking.type == "thinking" and thinking.signature == SIGNATURE
    assert thinking.thinking == "Let me think."
    assert text.type == "text" and text.text == "Checking the weather."
    assert tool.type == "tool_use" and tool.input == {"city": "Utrecht", "days": [1, 2]}
    assert message.stop_reason == "tool_use" and message.stop_sequence is None
    assert (message.usage.input_tokens, message.usage.output_tokens) == (120, 42)
    assert message.model == "claude-x" and message.id.startswith("msg_")
    # and the same through a strict client's `messages.create`
    created = client(raw, strict=True).messages.create(
        model="m", max_tokens=10, messages=[{"role": "user", "content": "x"}]
    )
    assert created.content == message.content


def test_message_body_edge_cases() -> None:
    events: list[StreamEvent] = [
        BlockStart(0, "reasoning"),
        BlockDelta(0, "unsigned"),
        BlockStart(1, "tool_call", id=None, name="f"),
        BlockDelta(1, "{not json"),
        BlockStart(2, "tool_call", id="t2", name="g"),
        BlockDelta(2, "[1, 2]"),
        BlockStart(3, "citations", data={"x": 1}),
        Finish("length"),
    ]
    usage = {"prompt_tokens": 5, "completion_tokens": 6}
    obj = orjson.loads(message_body("m", BlockAssembler.of(events), usage))
    message = Message.model_validate(obj)
    thinking, bad, not_an_object = message.content
    assert thinking.type == "thinking" and thinking.signature == ""
    assert bad.type == "tool_use" and bad.input == {} and bad.id.startswith("toolu_")
    assert not_an_object.type == "tool_use" and not_an_object.input == {}
    assert message.stop_reason == "max_tokens"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (5, 6)

    empty = Message.model_validate(orjson.loads(message_body("m", BlockAssembler(), None)))
    assert empty.content == [] and empty.stop_reason is None
    assert (empty.usage.input_tokens, empty.usage.output_tokens) == (0, 0)


def test_anthropics_own_fields_ride_along_by_name() -> None:
    fields = {
        "container": "c1",
        "mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}],
        "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        "output_config": {"effort": "medium"},
    }
    body = translate(**fields)
    assert body[ANTHROPIC_EXTRAS] == fields
    assert "response_format" not in body
    # A format beside them is translated as ever; the rest of output_config rides along.
    schema = {"type": "object", "properties": {}}
    body = translate(
        output_config={"effort": "high", "format": {"type": "json_schema", "schema": schema}}
    )
    assert body[ANTHROPIC_EXTRAS] == {"output_config": {"effort": "high"}}
    assert body["response_format"]["json_schema"]["schema"] == schema


def test_a_system_message_in_the_history_stays_at_its_place() -> None:
    messages = [
        {"role": "user", "content": "Hi"},
        {"role": "system", "content": [{"type": "text", "text": "env: linux"}]},
        {"role": "user", "content": "Go"},
    ]
    body = translate(messages=messages)
    assert [m["role"] for m in body["messages"]] == ["user", "system", "user"]
    assert body["messages"][1]["content"] == "env: linux"
    assert_invalid(
        request(messages=[{"role": "system", "content": [{"type": "image"}]}]),
        "messages[0].content[0].type",
    )


def test_a_tool_results_is_error_rides_along_for_anthropic_and_stays_off_openai() -> None:
    from gateway.providers.anthropic_messages import to_anthropic_request
    from gateway.providers.params import openai_form

    messages = [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "weather", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": "boom", "is_error": True}]},
    ]  # fmt: skip
    body = translate(messages=messages)
    tool = next(m for m in body["messages"] if m["role"] == "tool")
    assert tool["is_error"] is True
    sent = to_anthropic_request(body, "claude-x", stream=False)
    results = [b for m in sent["messages"] for b in m["content"] if b["type"] == "tool_result"]
    assert results[0]["is_error"] is True
    assert all("is_error" not in m for m in openai_form(body)["messages"])
