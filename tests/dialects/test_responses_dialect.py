"""The client-facing OpenAI Responses dialect, checked against the real `openai` SDK.

Rendered streams and bodies are fed to the installed SDK through a mock transport, with strict
response validation on, so its SSE decoder, event models and `responses.stream()` accumulator
judge the wire format.
"""

from __future__ import annotations

import json
from typing import Any

import httpx2
import openai
import orjson
import pytest
from openai.types.responses import Response

from gateway.dialects.base import Dialect
from gateway.dialects.openai_responses import (
    Responses,
    ResponsesRequest,
    ResponsesStreamRenderer,
    chat_body,
    output_items,
    parse_request,
    response_object,
    responses_usage,
)
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    UpstreamHTTPError,
    UpstreamTimeout,
)
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import (
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamEvent,
    Usage,
)

# -- helpers -------------------------------------------------------------------------------------


def raw(**fields: Any) -> bytes:
    body: dict[str, Any] = {"model": "gpt", "input": "Hi"}
    body.update(fields)
    return orjson.dumps({k: v for k, v in body.items() if v is not ...})


def initial(request: ResponsesRequest | None = None, id: str = "resp_test1") -> dict[str, Any]:
    if request is None:
        request = parse_request(raw())[0]
    return response_object(
        id,
        request,
        status="in_progress",
        output=[],
        usage=None,
        created_at=1_700_000_000,
        previous_response_id=None,
        conversation_id="conv_1",
    )


def client(content: bytes, kind: str) -> openai.AsyncOpenAI:
    def handler(request: httpx2.Request) -> httpx2.Response:
        assert request.url.path.endswith("/responses")
        return httpx2.Response(200, content=content, headers={"content-type": kind})

    return openai.AsyncOpenAI(
        api_key="k",
        base_url="http://gateway.test/v1",
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(handler)),
        _strict_response_validation=True,
        max_retries=0,
    )


async def sdk_events(stream: bytes) -> list[Any]:
    sdk = client(stream, "text/event-stream")
    events = [
        event async for event in await sdk.responses.create(model="gpt", input="Hi", stream=True)
    ]
    return events


def sse_frames(stream: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in stream.decode().split("\n\n"):
        if not frame:
            continue
        name, data = frame.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        obj = orjson.loads(data[6:])
        assert obj["type"] == name[7:]
        out.append((name[7:], obj))
    return out


def render(events: list[StreamEvent], end: str = "done", **kwargs: Any) -> bytes:
    renderer = ResponsesStreamRenderer(initial(**kwargs))
    out = b"".join(renderer.render([event]) for event in events)
    if end == "done":
        out += renderer.done()
    elif end == "cancelled":
        out += renderer.cancelled()
    return out


USAGE = Usage(
    {
        "prompt_tokens": 12,
        "completion_tokens": 30,
        "total_tokens": 42,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 9},
    }
)

REASONING_TOOL: list[StreamEvent] = [
    BlockStart(0, "reasoning"),
    BlockDelta(0, "Think"),
    BlockDelta(0, "ing."),
    BlockEnd(0),
    BlockStart(1, "text"),
    BlockDelta(1, ""),
    BlockDelta(1, "Hello"),
    BlockDelta(1, ", world"),
    BlockEnd(1),
    BlockStart(2, "tool_call", id="call_abc", name="get_capital"),
    BlockDelta(2, '{"country"'),
    BlockDelta(2, ':"PotatoLand"}'),
    Finish("tool_calls"),
    USAGE,
]


# -- requests ------------------------------------------------------------------------------------


def test_string_input() -> None:
    request, messages = parse_request(raw(instructions="Be brief."))
    assert request.model == "gpt"
    assert request.store is True
    assert messages == [{"role": "user", "content": "Hi"}]


def test_message_items() -> None:
    _, messages = parse_request(
        raw(
            input=[
                {"role": "developer", "content": "Rules."},
                {
                    "type": "message",
                    "role": "system",
                    "content": [{"type": "input_text", "text": "S"}],
                },
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Look:"},
                        {
                            "type": "input_image",
                            "image_url": "data:image/png;base64,AA",
                            "detail": "low",
                        },
                    ],
                },
                {"role": "assistant", "content": [{"type": "output_text", "text": "A cat."}]},
                {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
            ]
        )
    )
    assert messages == [
        {"role": "system", "content": "Rules."},
        {"role": "system", "content": "S"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AA", "detail": "low"},
                },
            ],
        },
        {"role": "assistant", "content": "A cat."},
        {"role": "user", "content": "Thanks"},
    ]


def test_function_call_items_join_their_assistant_message() -> None:
    _, messages = parse_request(
        raw(
            input=[
                {"role": "user", "content": "Capitals?"},
                {"type": "reasoning", "id": "rs_1",
                 "summary": [{"type": "summary_text", "text": "Hm."}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Looking.", "annotations": []}]},
                {"type": "function_call", "call_id": "c1", "name": "cap", "arguments": '{"c":"A"}'},
                {"type": "function_call", "call_id": "c2", "name": "cap", "arguments": '{"c":"B"}'},
                {"type": "function_call_output", "call_id": "c1", "output": "a"},
                {"type": "function_call_output", "call_id": "c2",
                 "output": [{"type": "input_text", "text": "b"}]},
            ]
        )
    )  # fmt: skip
    assert messages == [
        {"role": "user", "content": "Capitals?"},
        {
            "role": "assistant",
            "content": "Looking.",
            "reasoning_content": "Hm.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "cap", "arguments": '{"c":"A"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "cap", "arguments": '{"c":"B"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "a"},
        {"role": "tool", "tool_call_id": "c2", "content": "b"},
    ]


def test_a_lone_function_call_is_an_assistant_message_without_content() -> None:
    _, messages = parse_request(
        raw(input=[{"type": "function_call", "call_id": "c1", "name": "f", "arguments": ""}])
    )
    assert messages == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": ""}}
            ],
        }
    ]


def test_conversation_ids() -> None:
    assert parse_request(raw(conversation="conv_a"))[0].conversation_id == "conv_a"
    assert parse_request(raw(conversation={"id": "conv_b"}))[0].conversation_id == "conv_b"
    assert parse_request(raw())[0].conversation_id is None


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"model": ...}, "model"),
        ({"input": ...}, "input"),
        ({"input": []}, "input"),
        ({"input": 3}, "input"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": 1}]}, "input[0].content"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
            "input[0].content[0].type",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
            "input[0].content[0].image_url",
        ),
        (
            {"input": ["x", {"type": "function_call", "name": "f", "arguments": "{}"}]},
            "input",
        ),
        (
            {"input": [{"role": "user", "content": "x"}, {"type": "function_call", "name": "f"}]},
            "input[1].call_id",
        ),
        ({"input": [{"type": "function_call_output", "call_id": "c"}]}, "input[0].output"),
        ({"input": [{"type": "web_search_call", "id": "x"}]}, "input[0].type"),
        ({"tools": [{"type": "function"}]}, "tools[0].name"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice"),
        ({"tool_choice": {"type": "function"}}, "tool_choice.name"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"previous_response_id": "resp_1", "conversation": "conv_1"}, "conversation"),
    ],
)
def test_bad_requests_name_the_param(fields: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_request(raw(**fields))
    assert caught.value.param == param


def test_bad_json() -> None:
    with pytest.raises(InvalidRequest):
        parse_request(b"[1]")


def test_chat_body() -> None:
    request, new = parse_request(
        raw(
            model="alias",
            input=[{"role": "user", "content": "Now?"}],
            instructions="Be brief.",
            tools=[
                {"type": "function", "name": "f", "description": "F.",
                 "parameters": {"type": "object"}, "strict": True},
                {"type": "function", "name": "g"},
            ],
            tool_choice={"type": "function", "name": "f"},
            parallel_tool_calls=False,
            max_output_tokens=100,
            temperature=0.5,
            top_p=0.9,
            reasoning={"effort": "low", "summary": "auto"},
            user="u1",
            stream=True,
            store=False,
            metadata={"k": "v"},
            previous_response_id="resp_0",
            text={"format": {"type": "json_schema", "name": "s", "schema": {"type": "object"},
                             "strict": True}},
        )
    )  # fmt: skip
    history = [{"role": "user", "content": "Then?"}, {"role": "assistant", "content": "Ok."}]
    assert chat_body(request, history, new) == {
        "model": "alias",
        "messages": [
            {"role": "system", "content": "Be brief."},
            *history,
            {"role": "user", "content": "Now?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "f",
                    "description": "F.",
                    "parameters": {"type": "object"},
                    "strict": True,
                },
            },
            {
                "type": "function",
                "function": {"name": "g", "parameters": {"type": "object", "properties": {}}},
            },
        ],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "parallel_tool_calls": False,
        "max_completion_tokens": 100,  # o-series and gpt-5 models refuse `max_tokens`
        "metadata": {"k": "v"},
        "store": False,
        "temperature": 0.5,
        "top_p": 0.9,
        "reasoning_effort": "low",
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "s", "schema": {"type": "object"}, "strict": True},
        },
        "user": "u1",
        "stream": True,
    }


def test_minimal_chat_body() -> None:
    request, new = parse_request(raw())
    assert chat_body(request, [], new) == {
        "model": "gpt",
        "messages": [{"role": "user", "content": "Hi"}],
    }


# -- the Response object -------------------------------------------------------------------------


def test_response_object_validates_in_the_sdk() -> None:
    request = parse_request(
        raw(
            instructions="I.",
            tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            metadata={"k": "v"},
        )
    )[0]
    blocks: list[dict[str, Any]] = [
        {"type": "reasoning", "text": "R."},
        {"type": "text", "text": "Hello"},
        {"type": "tool_call", "id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "redacted_thinking", "data": {"data": "x"}, "text": ""},
    ]
    obj = response_object(
        "resp_1",
        request,
        status="completed",
        output=output_items(blocks, status="completed", response_id="resp_1"),
        usage=USAGE.usage,
        created_at=1,
        previous_response_id="resp_0",
        conversation_id=None,
    )
    response = Response.model_validate(obj, strict=False)
    assert response.output_text == "Hello"
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.previous_response_id == "resp_0"
    assert response.conversation is None
    assert response.usage is not None and response.usage.input_tokens == 12
    assert response.usage.input_tokens_details.cached_tokens == 4
    assert response.usage.output_tokens_details.reasoning_tokens == 9
    assert response.metadata == {"k": "v"}
    assert "output_text" not in obj


def test_output_items_ids_are_stable() -> None:
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": "a"},
        {"type": "tool_call", "id": None, "name": "f"},
    ]
    first = output_items(blocks, status="incomplete")
    assert first == output_items(blocks, status="incomplete")
    assert first != output_items(blocks, status="incomplete", response_id="resp_x")
    assert [item["status"] for item in first] == ["incomplete", "incomplete"]
    assert first[1]["call_id"].startswith("call_") and first[1]["arguments"] == ""
    assert len({item["id"] for item in first}) == 2


def test_responses_usage_passes_responses_names() -> None:
    assert responses_usage({"input_tokens": 3, "output_tokens": 4}) == {
        "input_tokens": 3,
        "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
        "output_tokens": 4,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 7,
    }


# -- streams -------------------------------------------------------------------------------------


async def test_stream_parses_in_the_sdk() -> None:
    stream = render(REASONING_TOOL)
    frames = sse_frames(stream)
    assert [obj["sequence_number"] for _, obj in frames] == list(range(len(frames)))
    assert [name for name, _ in frames] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.reasoning_summary_part.added",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.delta",
        "response.reasoning_summary_text.done",
        "response.reasoning_summary_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]

    events = await sdk_events(stream)
    assert [event.type for event in events] == [name for name, _ in frames]
    assert [event.sequence_number for event in events] == list(range(len(frames)))
    final = events[-1].response
    assert final.status == "completed"
    assert final.output_text == "Hello, world"
    assert final.usage.output_tokens == 30
    assert final.usage.output_tokens_details.reasoning_tokens == 9
    assert final.usage.total_tokens == 42
    reasoning, message, call = final.output
    assert reasoning.summary[0].text == "Thinking."
    assert message.status == "completed"
    assert call.call_id == "call_abc" and call.name == "get_capital"
    assert call.arguments == '{"country":"PotatoLand"}'
    assert final.conversation.id == "conv_1"
    # The streamed items are those `output_items` gives for the recorded blocks.
    blocks = [b.to_content() for b in BlockAssembler.of(REASONING_TOOL).blocks()]
    stored = output_items(blocks, status="completed", response_id="resp_test1")
    assert [item.model_dump(exclude_none=True) for item in final.output] == [
        Response.model_validate({**initial(), "output": [item]})
        .output[0]
        .model_dump(exclude_none=True)
        for item in stored
    ]


async def test_stream_through_the_sdk_stream_helper() -> None:
    sdk = client(render(REASONING_TOOL), "text/event-stream")
    texts: list[str] = []
    async with sdk.responses.stream(model="gpt", input="Hi") as stream:
        async for event in stream:
            if event.type in (
                "response.output_text.delta",
                "response.function_call_arguments.delta",
            ):
                texts.append(event.snapshot)
        final = await stream.get_final_response()
    assert texts == ["Hello", "Hello, world", '{"country"', '{"country":"PotatoLand"}']
    assert final.output_text == "Hello, world"
    assert final.id == "resp_test1"


async def test_text_only_stream_and_unclosed_blocks() -> None:
    # No BlockStart, no BlockEnd, usage after finish: done() closes and reports it.
    stream = render([BlockDelta(0, "Hi"), BlockDelta(0, " there"), Finish("stop"), USAGE])
    events = await sdk_events(stream)
    final = events[-1]
    assert final.type == "response.completed"
    assert final.response.output_text == "Hi there"
    assert final.response.usage.input_tokens == 12


async def test_length_finish_is_incomplete() -> None:
    stream = render([BlockStart(0, "text"), BlockDelta(0, "Cut"), Finish("length")])
    events = await sdk_events(stream)
    final = events[-1]
    assert final.type == "response.incomplete"
    assert final.response.status == "incomplete"
    assert final.response.incomplete_details.reason == "max_output_tokens"
    assert final.response.output[0].status == "incomplete"
    assert final.response.output_text == "Cut"
    assert final.response.usage is None  # no usage was reported


async def test_empty_blocks_are_never_sent() -> None:
    stream = render([BlockStart(0, "reasoning"), BlockDelta(0, ""), BlockEnd(0), Finish("stop")])
    events = await sdk_events(stream)
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.completed",
    ]
    assert events[-1].response.output == []


async def test_continuation_attempt_opens_new_items() -> None:
    events: list[StreamEvent] = [
        BlockStart(0, "text"),
        BlockDelta(0, "Part one, "),
        BlockStart(0, "text"),  # a continuation attempt restarts its indexes
        BlockDelta(0, "part two."),
        Finish("stop"),
    ]
    final = (await sdk_events(render(events)))[-1].response
    assert [item.content[0].text for item in final.output] == ["Part one, ", "part two."]
    assert final.output_text == "Part one, part two."
    assert final.output[0].id != final.output[1].id


async def test_cancelled() -> None:
    stream = render(
        [
            BlockStart(0, "reasoning"),
            BlockDelta(0, "Hm"),
            BlockStart(1, "text"),
            BlockDelta(1, "Hal"),
        ],
        end="cancelled",
    )
    events = await sdk_events(stream)
    final = events[-1]
    assert final.type == "response.incomplete"
    assert final.response.status == "cancelled"
    assert [item.status for item in final.response.output] == ["incomplete", "incomplete"]
    assert final.response.output_text == "Hal"
    assert [event.sequence_number for event in events] == list(range(len(events)))


async def test_cancel_before_any_event() -> None:
    renderer = ResponsesStreamRenderer(initial())
    events = await sdk_events(renderer.cancelled())
    assert [event.type for event in events] == [
        "response.created",
        "response.in_progress",
        "response.incomplete",
    ]
    assert renderer.done() == b"" and renderer.render([BlockDelta(0, "x")]) == b""


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (UpstreamTimeout("No token in time.", phase="idle"), "server_error"),
        (UpstreamHTTPError(429, "Slow down."), "rate_limit_exceeded"),
        (GatewayError("Boom."), "server_error"),
    ],
)
async def test_error(error: GatewayError, code: str) -> None:
    renderer = ResponsesStreamRenderer(initial())
    stream = renderer.render([BlockDelta(0, "Par")]) + renderer.error(error)
    assert renderer.done() == b"" and renderer.cancelled() == b""
    events = await sdk_events(stream)
    final = events[-1]
    assert final.type == "response.failed"
    assert final.response.status == "failed"
    assert final.response.error.code == code
    assert final.response.error.message.startswith(error.message)
    assert final.response.error.type == error.type
    assert final.response.output[0].status == "incomplete"


# -- the dialect ---------------------------------------------------------------------------------


def test_dialect() -> None:
    dialect: Dialect = Responses(initial())
    assert dialect.name == "openai.responses" and dialect.wire == "none"
    assert isinstance(dialect.renderer({}), ResponsesStreamRenderer)
    assert dialect.error_body(InvalidRequest("Bad.", param="input")) == {
        "error": {
            "message": "Bad.",
            "type": "invalid_request_error",
            "code": "invalid_request",
            "param": "input",
        }
    }


async def test_non_streaming_body_parses_in_the_sdk() -> None:
    body = Responses(initial()).body("ignored", BlockAssembler.of(REASONING_TOOL), "ignored")
    sdk = client(body, "application/json")
    response = await sdk.responses.create(model="gpt", input="Hi")
    assert response.id == "resp_test1"
    assert response.status == "completed"
    assert response.output_text == "Hello, world"
    assert [item.type for item in response.output] == ["reasoning", "message", "function_call"]
    assert response.usage is not None and response.usage.total_tokens == 42
    # The same items, with the same ids, as the stream sent.
    streamed = (await sdk_events(render(REASONING_TOOL)))[-1].response
    assert [item.id for item in response.output] == [item.id for item in streamed.output]


async def test_non_streaming_length_is_incomplete() -> None:
    assembler = BlockAssembler.of([BlockDelta(0, "Cut"), Finish("length")])
    response = await client(
        Responses(initial()).body("m", assembler, "ignored"), "application/json"
    ).responses.create(model="gpt", input="Hi")
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    message = response.output[0]
    assert message.type == "message" and message.status == "incomplete"


async def test_the_sdk_checks_strictly() -> None:
    """The canary: without `logprobs` a text delta is invalid, and the SDK here says so."""
    stream = render(REASONING_TOOL)
    broken = stream.replace(b'"delta":"Hello","logprobs":[]', b'"delta":"Hello"')
    assert broken != stream
    with pytest.raises(openai.APIResponseValidationError):
        await sdk_events(broken)


def test_fields_the_gateway_meets_its_own_way_are_checked() -> None:
    """`include`, `truncation` and `max_tool_calls` are accepted; `background: true` (an answer
    the gateway would not give) is a 400 naming it, as is a wrong form of any of them."""
    from gateway.dialects.openai_responses import parse_request
    from gateway.errors import InvalidRequest

    ok = {"model": "m", "input": "hi", "include": ["reasoning.encrypted_content"],
          "truncation": "auto", "max_tool_calls": 3, "background": False}  # fmt: skip
    parse_request(json.dumps(ok).encode())
    for field, value in (("background", True), ("truncation", "middle"), ("include", "x"),
                         ("max_tool_calls", 0)):  # fmt: skip
        with pytest.raises(InvalidRequest) as info:
            parse_request(json.dumps({"model": "m", "input": "hi", field: value}).encode())
        assert info.value.param == field
