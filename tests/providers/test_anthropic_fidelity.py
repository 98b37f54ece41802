"""Anthropic fidelity (issue 32, items 1-3): structured output, prompt caching and thinking kept
whole, between every client dialect and an Anthropic deployment.

`Claude` is a fake Anthropic that answers from what it is sent and refuses, with a 400
`invalid_request_error` as Anthropic does, what Anthropic refuses: a tool turn sent back without
the signed thinking it came with (or with it changed), a forced tool choice with thinking on,
a thinking budget that leaves no room, JSON outputs on a model without them or with a schema
outside their subset, more than four `cache_control` marks or one of another type. Clients are
the real SDKs (openai, anthropic) and LangChain, over loopback.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from gateway.dialects.anthropic_messages import anthropic_usage
from gateway.dialects.chat_message import assistant_message
from gateway.dialects.openai_chat import chat_usage
from gateway.dialects.openai_responses import responses_usage
from gateway.errors import InvalidRequest
from gateway.providers import anthropic_messages
from gateway.providers.anthropic_messages import (
    JSON_TOOL,
    SignedThinking,
    native_json_outputs,
    native_schema,
    openai_usage,
    to_anthropic_request,
)
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import API_KEY, Script, status
from tests.providers.upstreams import AnthropicServer

NATIVE = "claude-sonnet-4-5-20250929"  # has JSON outputs
OLDER = "claude-3-7-sonnet-20250219"  # has thinking, not JSON outputs
CACHED = 1000  # the tokens the fake reads from (or writes to) its cache, per breakpoint prefix
INPUT = 20  # the uncached input tokens it reports
OUTPUT = 9

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
CITIES = ["Paris", "London", "Delft"]
QUESTION = "What is the weather in Paris, London and Delft?"


class Forecast(BaseModel):
    city: str
    celsius: int
    sunny: bool
    notes: list[str]


def sign(thinking: str) -> str:
    """The fake's signature for a thinking text (Anthropic's is opaque; this one checkable)."""
    return "sig-" + hashlib.sha256(thinking.encode()).hexdigest()[:24]


def example(schema: dict[str, Any], defs: dict[str, Any] | None = None) -> Any:
    """A value matching a JSON schema (the subset pydantic models give)."""
    defs = schema.get("$defs", defs or {})
    if "$ref" in schema:
        return example(defs[schema["$ref"].rsplit("/", 1)[1]], defs)
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return example(schema["anyOf"][0], defs)
    kind = schema.get("type", "object")
    kind = kind[0] if isinstance(kind, list) else kind
    if kind == "object":
        properties = schema.get("properties", {})
        if not properties:
            return {"answer": 42}
        return {name: example(s, defs) for name, s in properties.items()}
    if kind == "array":
        return [example(schema.get("items", {"type": "string"}), defs)]
    return {"string": "Paris", "integer": 21, "number": 1.5, "boolean": True, "null": None}[kind]


_UNSUPPORTED = {"minimum", "maximum", "minLength", "maxLength", "maxItems", "default", "pattern"}


class Refused(Exception):
    pass


def blocks_only(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages body with each plain-string content as the text block Anthropic reads it as
    (a client's body reaches Anthropic as the client wrote it)."""
    messages = [
        {**m, "content": [{"type": "text", "text": m["content"]}]}
        if isinstance(m.get("content"), str)
        else m
        for m in body["messages"]
    ]
    return {**body, "messages": messages}


class Claude(AnthropicServer):
    """A fake Anthropic that answers from the request.

    With tools, it calls `get_weather` once per city (thinking first when thinking is on, a
    redacted thinking block too in the second round), then answers in text; with
    `output_config.format` it answers JSON text; with the `json_answer` tool it calls that. It
    keeps the thinking it issued with each tool call, to check it comes back exactly."""

    def __init__(self, model: str = NATIVE) -> None:
        super().__init__()
        self.model = model  # type: ignore[misc]
        self.issued: dict[str, list[dict[str, Any]]] = {}  # tool_use id -> its thinking
        self.prefixes: set[str] = set()  # cache prefixes written
        self.refusals: list[str] = []
        self.calls = 0
        self.stall_after_text = False  # stall a stream after its first text delta
        self.always_cached = False  # report a cache read for every request

    def default(self, request: web.Request, body: dict[str, Any]) -> Script:
        assert request.headers["x-api-key"] == API_KEY
        body = blocks_only(body)
        try:
            self.check(body)
        except Refused as refused:
            self.refusals.append(str(refused))
            error = {
                "type": "error",
                "error": {"type": "invalid_request_error", "message": str(refused)},
            }
            return status(400, error)
        content, stop = self.reply(body)
        usage = self.usage(body)
        if body.get("stream"):
            return self.stream(content, stop, usage)
        message = self.message(content, stop)
        return status(200, {**message, "usage": {**usage, "output_tokens": OUTPUT}})

    # -- what Anthropic refuses ----------------------------------------------------------------

    def check(self, body: dict[str, Any]) -> None:
        assert body["model"] == self.model
        thinking = body.get("thinking") or {}
        on = thinking.get("type") == "enabled"
        if on:
            if (body.get("tool_choice") or {}).get("type") in ("any", "tool"):
                raise Refused("Thinking may not be enabled when tool_choice forces tool use.")
            if thinking["budget_tokens"] >= body["max_tokens"]:
                raise Refused("`max_tokens` must be greater than `thinking.budget_tokens`.")
        messages = body["messages"]
        if [m["role"] for m in messages] != [
            ("user", "assistant")[i % 2] for i in range(len(messages))
        ]:
            raise Refused("messages: roles must alternate between user and assistant")
        for i, message in enumerate(messages):
            kinds = [b["type"] for b in message["content"]]
            for j, block in enumerate(message["content"]):
                if block["type"] == "text" and not block["text"]:
                    raise Refused(
                        f"messages.{i}.content.{j}: text content blocks must be non-empty"
                    )
                if block["type"] == "thinking" and block["signature"] != sign(block["thinking"]):
                    raise Refused(
                        f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                    )
            thinking_at = [j for j, k in enumerate(kinds) if k in ("thinking", "redacted_thinking")]
            if thinking_at != list(range(len(thinking_at))):
                raise Refused(f"messages.{i}.content: thinking blocks must come first")
        last_user = messages[-1]["content"]
        in_tool_loop = any(b["type"] == "tool_result" for b in last_user)
        if on and in_tool_loop:
            turn = messages[-2]["content"]
            if turn[0]["type"] not in ("thinking", "redacted_thinking"):
                raise Refused(
                    f"messages.{len(messages) - 2}.content.0.type: Expected `thinking` or"
                    f" `redacted_thinking`, but found `{turn[0]['type']}`. When `thinking` is"
                    " enabled, a final `assistant` message must start with a thinking block."
                )
            calls = [b["id"] for b in turn if b["type"] == "tool_use"]
            sent = [b for b in turn if b["type"] in ("thinking", "redacted_thinking")]
            if calls and sent != self.issued.get(calls[0]):
                raise Refused("thinking blocks must be passed back exactly as received")
        fmt = (body.get("output_config") or {}).get("format")
        if fmt is not None:
            if not native_json_outputs(self.model):
                raise Refused(f"output_config.format: not supported by {self.model}")
            self.check_schema(fmt["schema"])
        marks = list(self.cache_marks(body))
        if len(marks) > 4:
            raise Refused("A maximum of 4 blocks with cache_control may be provided.")
        for mark in marks:
            if mark.get("type") != "ephemeral":
                raise Refused("cache_control.type: Input should be 'ephemeral'")

    def check_schema(self, schema: dict[str, Any]) -> None:
        if _UNSUPPORTED & set(schema):
            raise Refused(f"output_config.format.schema: unsupported {_UNSUPPORTED & set(schema)}")
        if schema.get("type") == "object" and schema.get("additionalProperties") is not False:
            raise Refused("output_config.format.schema: objects need additionalProperties: false")
        for key in ("properties", "$defs"):
            for child in (schema.get(key) or {}).values():
                self.check_schema(child)
        for key in ("anyOf", "allOf"):
            for child in schema.get(key) or ():
                self.check_schema(child)
        if isinstance(schema.get("items"), dict):
            self.check_schema(schema["items"])

    @staticmethod
    def cache_marks(body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        for tool in body.get("tools") or ():
            if "cache_control" in tool:
                yield tool["cache_control"]
        system = body.get("system")
        for block in system if isinstance(system, list) else ():
            if "cache_control" in block:
                yield block["cache_control"]
        for message in body["messages"]:
            for block in message["content"]:
                if "cache_control" in block:
                    yield block["cache_control"]
                for inner in block.get("content") if isinstance(block.get("content"), list) else ():
                    if "cache_control" in inner:
                        yield inner["cache_control"]

    # -- answers -------------------------------------------------------------------------------

    def reply(self, body: dict[str, Any]) -> tuple[list[dict[str, Any]], str]:
        self.calls += 1
        on = (body.get("thinking") or {}).get("type") == "enabled"
        tools = {t["name"]: t for t in body.get("tools") or ()}
        results = sum(b["type"] == "tool_result" for m in body["messages"] for b in m["content"])
        thinking: list[dict[str, Any]] = []
        if on:
            text = f"Round {results + 1}: what do I need next?"
            thinking.append({"type": "thinking", "thinking": text, "signature": sign(text)})
            if results == 1:
                thinking.append({"type": "redacted_thinking", "data": f"opaque-{self.calls}"})
        fmt = (body.get("output_config") or {}).get("format")
        if fmt is not None:
            return [
                *thinking,
                {"type": "text", "text": json.dumps(example(fmt["schema"]))},
            ], "end_turn"
        if JSON_TOOL in tools and (body.get("tool_choice") or {}).get("name") in (JSON_TOOL, None):
            answer = example(tools[JSON_TOOL]["input_schema"])
            call = {
                "type": "tool_use",
                "id": f"toolu_j{self.calls}",
                "name": JSON_TOOL,
                "input": answer,
            }
            return [*thinking, call], "tool_use"
        if "get_weather" in tools and results < len(CITIES):
            call_id = f"toolu_{self.calls:02d}_{results}"
            self.issued[call_id] = thinking
            call = {
                "type": "tool_use",
                "id": call_id,
                "name": "get_weather",
                "input": {"city": CITIES[results]},
            }
            return [*thinking, {"type": "text", "text": "Checking."}, call], "tool_use"
        return [
            *thinking,
            {"type": "text", "text": f"Done after {results} tool results."},
        ], "end_turn"

    def usage(self, body: dict[str, Any]) -> dict[str, Any]:
        """Cache writes for a prefix seen for the first time, reads after (per breakpoint)."""
        usage = {
            "input_tokens": INPUT,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        }
        if self.always_cached:
            return {**usage, "cache_read_input_tokens": CACHED}
        if next(self.cache_marks(body), None) is None:
            return usage
        prefix = json.dumps([body.get("tools"), body.get("system"), body["messages"][0]])
        key = (
            "cache_read_input_tokens" if prefix in self.prefixes else "cache_creation_input_tokens"
        )
        self.prefixes.add(prefix)
        usage[key] = CACHED
        return usage

    def message(self, content: list[dict[str, Any]], stop: str) -> dict[str, Any]:
        return {
            "id": f"msg_{self.calls}",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": content,
            "stop_reason": stop,
            "stop_sequence": None,
        }

    def stream(self, content: list[dict[str, Any]], stop: str, usage: dict[str, Any]) -> Script:
        start_usage = {**usage, "output_tokens": 1}
        message = {**self.message([], ""), "stop_reason": None, "usage": start_usage}
        frames = [self.event({"type": "message_start", "message": message})]
        for index, block in enumerate(content):
            kind = block["type"]
            if kind == "thinking":
                start: dict[str, Any] = {"type": "thinking", "thinking": "", "signature": ""}
                half = len(block["thinking"]) // 2
                deltas = [
                    {"type": "thinking_delta", "thinking": block["thinking"][:half]},
                    {"type": "thinking_delta", "thinking": block["thinking"][half:]},
                    {"type": "signature_delta", "signature": block["signature"]},
                ]
            elif kind == "text":
                start, deltas = (
                    {"type": "text", "text": ""},
                    [{"type": "text_delta", "text": part} for part in _halves(block["text"])],
                )
            elif kind == "tool_use":
                start = {**block, "input": {}}
                deltas = [
                    {"type": "input_json_delta", "partial_json": part}
                    for part in _halves(json.dumps(block["input"]))
                ]
            else:
                start, deltas = block, []
            frames.append(
                self.event({"type": "content_block_start", "index": index, "content_block": start})
            )
            frames += [
                self.event({"type": "content_block_delta", "index": index, "delta": d})
                for d in deltas
            ]
            frames.append(self.event({"type": "content_block_stop", "index": index}))
        delta = {"stop_reason": stop, "stop_sequence": None}
        frames.append(
            self.event(
                {"type": "message_delta", "delta": delta, "usage": {"output_tokens": OUTPUT}}
            )
        )
        frames.append(self.event({"type": "message_stop"}))

        async def script(request: web.Request) -> web.StreamResponse:
            response = await self.start_sse(request)
            for frame in frames:
                await self.write(response, frame)
                if self.stall_after_text and b'"text_delta"' in frame:
                    await self.stall()
            await response.write_eof()
            return response

        return script


def _halves(text: str) -> list[str]:
    return [text[: len(text) // 2], text[len(text) // 2 :]]


@pytest.fixture
def no_memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gateway keeps no signed thinking in memory: only what clients and the store carry."""
    monkeypatch.setattr(anthropic_messages, "SIGNED_THINKING", SignedThinking(max_chars=0))


@pytest.fixture
def memo(monkeypatch: pytest.MonkeyPatch) -> None:
    """A memory of signed thinking of this test's own."""
    monkeypatch.setattr(anthropic_messages, "SIGNED_THINKING", SignedThinking())


MakeClaude = Callable[..., Any]


@pytest.fixture
def make_claude(aiohttp_server: Any, make_gateway: MakeGateway) -> MakeClaude:
    async def make(model: str = NATIVE, **sections: Any) -> tuple[Claude, GatewayUnderTest]:
        claude = await Claude(model).start(aiohttp_server)
        models = [
            {"name": "claude", "retry": {"max_attempts": 1}, "deployments": [claude.deployment()]}
        ]
        return claude, await make_gateway(models=models, **sections)

    return make


async def recorded_answer(gw: GatewayUnderTest, conversation_id: str) -> dict[str, Any]:
    events = await gw.wait_turn_end(conversation_id)
    [message] = [e for e in events if e["type"] == "assistant/message"]
    payload: dict[str, Any] = message["payload"]
    return payload


# -- 1. structured output ------------------------------------------------------------------------

MODELS = pytest.mark.parametrize("model", [NATIVE, OLDER], ids=["json-outputs", "forced-tool"])


def check_structured_request(claude: Claude, model: str) -> None:
    """JSON outputs where the model has them, else the forced `json_answer` tool."""
    sent = claude.requests[-1]
    if model == NATIVE:
        schema = sent["output_config"]["format"]["schema"]
        assert schema["additionalProperties"] is False
        assert set(schema["properties"]) == {"city", "celsius", "sunny", "notes"}
        assert "tools" not in sent and "tool_choice" not in sent
    else:
        assert "output_config" not in sent
        assert [t["name"] for t in sent["tools"]] == [JSON_TOOL]
        assert set(sent["tools"][0]["input_schema"]["properties"]) == {
            "city",
            "celsius",
            "sunny",
            "notes",
        }
        assert sent["tool_choice"] == {"type": "tool", "name": JSON_TOOL}


FORECAST = Forecast(city="Paris", celsius=21, sunny=True, notes=["Paris"])


@MODELS
async def test_openai_parse_gets_structured_output(make_claude: MakeClaude, model: str) -> None:
    claude, gw = await make_claude(model)
    raw = await gw.client().chat.completions.with_raw_response.parse(
        model="claude",
        messages=[{"role": "user", "content": "Forecast for Paris?"}],
        response_format=Forecast,
    )
    completion = raw.parse()
    choice = completion.choices[0]
    assert choice.message.parsed == FORECAST
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    assert json.loads(choice.message.content or "") == FORECAST.model_dump()
    check_structured_request(claude, model)
    assert claude.requests[-1]["stream"] is False
    # Recorded as the text answer it is, not as a tool call.
    answer = await recorded_answer(gw, raw.headers["X-Conversation-Id"])
    assert answer["content"] == [{"type": "text", "text": choice.message.content}]
    assert answer["finish_reason"] == "stop"


@MODELS
async def test_openai_stream_gets_structured_output_as_content(
    make_claude: MakeClaude, model: str
) -> None:
    claude, gw = await make_claude(model)
    deltas: list[str] = []
    async with gw.client().chat.completions.stream(
        model="claude",
        messages=[{"role": "user", "content": "Forecast for Paris?"}],
        response_format=Forecast,
    ) as stream:
        async for event in stream:
            if event.type == "content.delta":
                deltas.append(event.delta)
            assert event.type != "tool_calls.function.arguments.delta"
        completion = await stream.get_final_completion()
    assert len(deltas) > 1  # streamed as content deltas, piece by piece
    choice = completion.choices[0]
    assert choice.message.parsed == FORECAST
    assert choice.finish_reason == "stop"
    assert not choice.message.tool_calls
    check_structured_request(claude, model)
    assert claude.requests[-1]["stream"] is True


async def test_json_object_is_a_forced_tool_on_every_model(make_claude: MakeClaude) -> None:
    claude, gw = await make_claude(NATIVE)
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="claude",
        messages=[{"role": "user", "content": "Answer in JSON."}],
        response_format={"type": "json_object"},
    )
    completion = raw.parse()
    assert json.loads(completion.choices[0].message.content or "") == {"answer": 42}
    assert completion.choices[0].finish_reason == "stop"
    sent = claude.requests[-1]
    assert sent["tools"][0]["name"] == JSON_TOOL
    assert sent["tools"][0]["input_schema"] == {"type": "object"}
    assert sent["tool_choice"] == {"type": "tool", "name": JSON_TOOL}
    answer = await recorded_answer(gw, raw.headers["X-Conversation-Id"])
    assert [b["type"] for b in answer["content"]] == ["text"]


@MODELS
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_langchain_with_structured_output(
    make_claude: MakeClaude, model: str, streaming: bool
) -> None:
    claude, gw = await make_claude(model)
    llm = ChatOpenAI(
        model="claude",
        base_url=gw.url + "/v1",
        api_key="test-key",
        max_retries=0,
        timeout=10,
        streaming=streaming,
    )
    forecast = await llm.with_structured_output(Forecast, method="json_schema").ainvoke(
        "Forecast for Paris?"
    )
    assert forecast == FORECAST
    check_structured_request(claude, model)
    json_mode = await llm.with_structured_output(None, method="json_mode").ainvoke(
        "Answer in JSON."
    )
    assert json_mode == {"answer": 42}


@MODELS
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_responses_text_format(make_claude: MakeClaude, model: str, streaming: bool) -> None:
    claude, gw = await make_claude(model)
    client = gw.client()
    if streaming:
        async with client.responses.stream(
            model="claude", input="Forecast for Paris?", text_format=Forecast
        ) as stream:
            async for _ in stream:
                pass
            response = await stream.get_final_response()
    else:
        response = await client.responses.parse(
            model="claude", input="Forecast for Paris?", text_format=Forecast
        )
    assert response.output_parsed == FORECAST
    assert response.status == "completed"
    assert [item.type for item in response.output] == ["message"]
    check_structured_request(claude, model)


async def test_structured_output_with_thinking_on_an_older_model(make_claude: MakeClaude) -> None:
    """Extended thinking refuses a forced tool: the tool is offered with `auto`."""
    claude, gw = await make_claude(OLDER)
    completion = await gw.client().chat.completions.parse(
        model="claude",
        messages=[{"role": "user", "content": "Forecast for Paris?"}],
        response_format=Forecast,
        reasoning_effort="low",
    )
    assert completion.choices[0].message.parsed == FORECAST
    assert claude.requests[-1]["tool_choice"] == {"type": "auto"}
    assert claude.requests[-1]["thinking"]["type"] == "enabled"


def test_structured_output_beside_the_clients_tools() -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "F", "schema": {"type": "object"}}}
    body = {"messages": [{"role": "user", "content": "Hi"}], "response_format": fmt}
    native = to_anthropic_request({**body, "tools": [WEATHER_TOOL]}, NATIVE, stream=False)
    assert native["output_config"]["format"]["schema"] == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }
    assert [t["name"] for t in native["tools"]] == ["get_weather"]
    older = to_anthropic_request({**body, "tools": [WEATHER_TOOL]}, OLDER, stream=False)
    assert [t["name"] for t in older["tools"]] == ["get_weather", JSON_TOOL]
    assert older["tool_choice"] == {"type": "any"}  # a tool of the client's, or the answer
    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = to_anthropic_request(
        {**body, "tools": [WEATHER_TOOL], "tool_choice": named}, OLDER, stream=False
    )
    assert forced["tool_choice"] == {"type": "tool", "name": "get_weather"}
    none = to_anthropic_request(
        {**body, "tools": [WEATHER_TOOL], "tool_choice": "none"}, OLDER, stream=False
    )
    assert [t["name"] for t in none["tools"]] == [JSON_TOOL]
    serial = to_anthropic_request({**body, "parallel_tool_calls": False}, OLDER, stream=False)
    assert serial["tool_choice"] == {"type": "tool", "name": JSON_TOOL}
    clash = {**WEATHER_TOOL, "function": {**WEATHER_TOOL["function"], "name": JSON_TOOL}}
    with pytest.raises(InvalidRequest, match="reserved"):
        to_anthropic_request({**body, "tools": [clash]}, NATIVE, stream=False)
    with pytest.raises(InvalidRequest):
        bad = {"type": "json_schema", "json_schema": {"name": "F"}}
        to_anthropic_request({**body, "response_format": bad}, NATIVE, stream=False)
    text = to_anthropic_request({**body, "response_format": {"type": "text"}}, OLDER, stream=False)
    assert "tools" not in text and "output_config" not in text


def test_which_models_take_json_outputs() -> None:
    for model in [
        "claude-sonnet-4-5-20250929",
        "claude-haiku-4-5",
        "claude-opus-4-6",
        "claude-opus-5",
        "anthropic.claude-sonnet-4-5-20250929-v1:0",
    ]:
        assert native_json_outputs(model), model
    for model in [
        "claude-3-7-sonnet-20250219",
        "claude-3-5-haiku-latest",
        "claude-sonnet-4-20250514",
        "claude-opus-4-1-20250805",
        "claude-3-opus-20240229",
        "my-claude",
        "claude-fake",
    ]:
        assert not native_json_outputs(model), model


def test_native_schema_keeps_to_the_json_outputs_subset() -> None:
    schema = {
        "type": "object",
        "title": "T",
        "properties": {
            "n": {"type": "integer", "minimum": 1, "maximum": 9, "description": "A count."},
            "s": {"type": "string", "maxLength": 5, "format": "email"},
            "d": {"type": "string", "format": "color"},
            "xs": {"type": "array", "items": {"$ref": "#/$defs/X"}, "minItems": 1, "maxItems": 3},
            "e": {"enum": ["a", "b"], "type": "string"},
            "u": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        },
        "required": ["n"],
        "additionalProperties": True,
        "$defs": {"X": {"type": "object", "properties": {"k": {"type": "boolean"}}}},
    }
    assert native_schema(schema) == {
        "$defs": {
            "X": {
                "type": "object",
                "properties": {"k": {"type": "boolean"}},
                "additionalProperties": False,
            }
        },
        "type": "object",
        "title": "T",
        "properties": {
            "n": {"type": "integer", "description": "A count.\n\n{minimum: 1, maximum: 9}"},
            "s": {"type": "string", "format": "email", "description": "{maxLength: 5}"},
            "d": {"type": "string", "description": '{format: "color"}'},
            "xs": {
                "type": "array",
                "items": {"$ref": "#/$defs/X"},
                "minItems": 1,
                "description": "{maxItems: 3}",
            },
            "e": {"enum": ["a", "b"]},
            "u": {
                "anyOf": [{"type": "string"}, {"type": "null"}],
                "description": "{default: null}",
            },
        },
        "additionalProperties": False,
        "required": ["n"],
    }


# -- 3. thinking kept whole ----------------------------------------------------------------------


def weather(city: str) -> str:
    return f"{city}: 21 C"


def check_tool_turns(claude: Claude) -> None:
    """Every request after the first sent the tool turn back as Anthropic requires:
    [thinking (signed), redacted thinking?, text, tool_use], exactly as issued."""
    assert not claude.refusals, claude.refusals
    for request in claude.requests[1:]:
        turn = request["messages"][-2]["content"]
        kinds = [b["type"] for b in turn]
        call = turn[-1]
        assert kinds[-2:] == ["text", "tool_use"]
        assert turn[: len(kinds) - 2] == claude.issued[call["id"]]
        assert kinds[0] == "thinking"


async def chat_tool_loop(
    client: openai.AsyncOpenAI, keep: Callable[[Any], dict[str, Any] | Any], **extra: Any
) -> list[Any]:
    """The OpenAI tool loop, non-streaming: `keep` makes the message sent back of an answer."""
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    answers = []
    while True:
        completion = await client.chat.completions.create(
            model="claude", messages=messages, tools=[WEATHER_TOOL], **extra
        )
        message: Any = completion.choices[0].message
        answers.append(completion)
        messages.append(keep(message))
        if not message.tool_calls:
            return answers
        for call in message.tool_calls:
            city = json.loads(call.function.arguments)["city"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": weather(city)})


async def test_thinking_tool_loop_sends_signed_thinking_back(
    make_claude: MakeClaude, no_memo: None
) -> None:
    """The openai SDK's own loop (the answer's message appended as it came) keeps the
    `thinking_blocks` the gateway adds: three rounds, each accepted by the fake."""
    claude, gw = await make_claude()
    answers = await chat_tool_loop(gw.client(), lambda m: m, reasoning_effort="low")
    assert [a.choices[0].finish_reason for a in answers] == ["tool_calls"] * 3 + ["stop"]
    assert answers[-1].choices[0].message.content == "Done after 3 tool results."
    check_tool_turns(claude)
    first = answers[0].choices[0].message
    assert first.reasoning_content == "Round 1: what do I need next?"
    assert first.thinking_blocks == [
        {
            "type": "thinking",
            "thinking": first.reasoning_content,
            "signature": sign(first.reasoning_content),
        }
    ]
    second = answers[1].choices[0].message.thinking_blocks
    assert [b["type"] for b in second] == ["thinking", "redacted_thinking"]


async def test_a_client_that_drops_the_signature_is_refused_as_anthropic_would(
    make_claude: MakeClaude, no_memo: None
) -> None:
    """The fake is strict: without the gateway's help (no memory, and no conversation to take
    it from: threading off), a tool turn without its signed thinking is a 400, which reaches
    the client as one."""
    claude, gw = await make_claude(conversations={"threading": "header"})

    def plain(message: Any) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [c.model_dump() for c in message.tool_calls or ()],
        }

    with pytest.raises(openai.BadRequestError, match="must start with a thinking block"):
        await chat_tool_loop(gw.client(), plain, reasoning_effort="low")
    assert len(claude.refusals) == 1


async def test_signed_thinking_a_client_drops_is_restored_from_its_conversation(
    make_claude: MakeClaude, no_memo: None
) -> None:
    """No memory of signed thinking, and a client that keeps none: the request's history
    matches the stored turns of its conversation (threaded by that history), whose answers
    carry their signed thinking, and the gateway puts it back for the Anthropic upstream."""
    claude, gw = await make_claude()

    def plain(message: Any) -> dict[str, Any]:
        return {
            "role": "assistant",
            "content": message.content,
            "tool_calls": [c.model_dump() for c in message.tool_calls or ()],
        }

    answers = await chat_tool_loop(gw.client(), plain, reasoning_effort="low")
    assert answers[-1].choices[0].message.content == "Done after 3 tool results."
    assert claude.refusals == []
    check_tool_turns(claude)


async def test_thinking_tool_loop_streamed_by_a_client_that_keeps_no_thinking(
    make_claude: MakeClaude, memo: None
) -> None:
    """A streaming loop that rebuilds each message from its text and tool calls only (as most
    hand-written loops and LangChain do): the gateway puts the signed thinking back from the
    answers it parsed, by their tool_use ids."""
    claude, gw = await make_claude()
    client = gw.client()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    rounds = 0
    while True:
        stream = await client.chat.completions.create(
            model="claude",
            messages=messages,
            tools=[WEATHER_TOOL],
            reasoning_effort="medium",
            stream=True,
        )
        text = ""
        thinking_blocks: list[Any] = []
        calls: dict[int, dict[str, Any]] = {}
        async for chunk in stream:
            delta = chunk.choices[0].delta
            text += delta.content or ""
            thinking_blocks += getattr(delta, "thinking_blocks", None) or []
            for call in delta.tool_calls or ():
                calls.setdefault(call.index, {"id": call.id, "name": "", "arguments": ""})
                calls[call.index]["name"] += call.function.name or ""
                calls[call.index]["arguments"] += call.function.arguments or ""
        assert thinking_blocks  # sent whole, once each block ended
        rounds += 1
        tool_calls = [
            {
                "id": c["id"],
                "type": "function",
                "function": {"name": c["name"], "arguments": c["arguments"]},
            }
            for c in calls.values()
        ]
        messages.append(
            {
                "role": "assistant",
                "content": text,
                **({"tool_calls": tool_calls} if tool_calls else {}),
            }
        )
        if not tool_calls:
            break
        for call in tool_calls:
            city = json.loads(call["function"]["arguments"])["city"]
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": weather(city)})
    assert rounds == 4 and text == "Done after 3 tool results."
    check_tool_turns(claude)


async def test_thinking_tool_loop_through_the_sdk_stream_helper(
    make_claude: MakeClaude, no_memo: None
) -> None:
    """`client.chat.completions.stream()` accumulates the `thinking_blocks` deltas (their
    `index`), so its final message goes back whole."""
    claude, gw = await make_claude()
    client = gw.client()
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    while True:
        async with client.chat.completions.stream(
            model="claude", messages=messages, tools=[WEATHER_TOOL], reasoning_effort="low"
        ) as stream:
            completion = await stream.get_final_completion()
        message: Any = completion.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            city = json.loads(call.function.arguments)["city"]
            messages.append({"role": "tool", "tool_call_id": call.id, "content": weather(city)})
    assert message.content == "Done after 3 tool results."
    check_tool_turns(claude)


async def test_thinking_is_recorded_with_its_signature(make_claude: MakeClaude, memo: None) -> None:
    claude, gw = await make_claude()
    answers = await chat_tool_loop(gw.client(), lambda m: m, reasoning_effort="low")
    conversation_id = (
        await gw.client().chat.completions.with_raw_response.create(
            model="claude", messages=[{"role": "user", "content": "Hi"}]
        )
    ).headers["X-Conversation-Id"]
    await gw.flush()  # the turns' writes committed, not only journaled
    rows = gw.query(
        "SELECT payload FROM events WHERE type = 'assistant/message' AND conversation_id != ?"
        " ORDER BY seq",
        conversation_id,
    )
    contents = [json.loads(row[0])["content"] for row in rows]
    assert len(contents) == len(answers) == 4
    second = contents[1]
    assert [b["type"] for b in second] == ["reasoning", "redacted_thinking", "text", "tool_call"]
    assert second[0]["signature"] == sign(second[0]["text"])
    assert second[1]["data"] == {"data": claude.issued[second[3]["id"]][1]["data"]}
    # The derived history carries them as the message's thinking_blocks.
    assert assistant_message(second)["thinking_blocks"] == claude.issued[second[3]["id"]]


async def test_previous_response_id_loop_and_its_branch(
    make_claude: MakeClaude, no_memo: None
) -> None:
    """Stateful clients send no history: the store's, derived with its thinking_blocks, goes
    back to Anthropic. A second follow-up of the same response (a fork: a branch) too."""
    claude, gw = await make_claude()
    client = gw.client()
    tools = [
        {
            "type": "function",
            "name": "get_weather",
            "parameters": WEATHER_TOOL["function"]["parameters"],
        }
    ]
    response = await client.responses.create(
        model="claude", input=QUESTION, tools=tools, reasoning={"effort": "low"}
    )
    first = response
    for _ in CITIES:
        [call] = [item for item in response.output if item.type == "function_call"]
        response = await client.responses.create(
            model="claude",
            previous_response_id=response.id,
            input=[
                {
                    "type": "function_call_output",
                    "call_id": call.call_id,
                    "output": weather(json.loads(call.arguments)["city"]),
                }
            ],
            tools=tools,
            reasoning={"effort": "low"},
        )
    assert response.output_text == "Done after 3 tool results."
    check_tool_turns(claude)
    # A fork of the first response: its branch's history keeps the signed thinking.
    [call] = [item for item in first.output if item.type == "function_call"]
    fork = await client.responses.create(
        model="claude",
        previous_response_id=first.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "Paris: 30 C"}],
        tools=tools,
        reasoning={"effort": "low"},
    )
    assert fork.status == "completed"
    check_tool_turns(claude)


async def test_history_repair_puts_back_the_signed_thinking(
    make_claude: MakeClaude, no_memo: None
) -> None:
    """A chat UI drops the answer the user stopped; the gateway puts the delivered prefix back,
    its signed thinking included, and Anthropic takes it."""
    claude, gw = await make_claude()
    claude.stall_after_text = True
    client = gw.client()
    raw = await client.chat.completions.with_raw_response.create(
        model="claude",
        messages=[{"role": "user", "content": "Hi"}],
        reasoning_effort="low",
        stream=True,
    )
    conversation_id = raw.headers["X-Conversation-Id"]
    stream = raw.parse()
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            break  # the user presses Stop
    await stream.close()
    answer = await recorded_answer(gw, conversation_id)
    assert answer["interrupted"] is True
    assert [b["type"] for b in answer["content"]] == ["reasoning", "text"]
    follow = await client.chat.completions.with_raw_response.create(
        model="claude",
        messages=[{"role": "user", "content": "Hi"}, {"role": "user", "content": "Go on."}],
        reasoning_effort="low",
        extra_headers={"X-Conversation-Id": conversation_id},
    )
    assert follow.headers["X-Gateway-History-Repaired"] == "1"
    assert not claude.refusals
    turn = claude.requests[-1]["messages"][1]
    thinking = answer["content"][0]["text"]
    assert turn["content"] == [
        {"type": "thinking", "thinking": thinking, "signature": sign(thinking)},
        {"type": "text", "text": answer["content"][1]["text"]},
    ]


def test_derived_messages_carry_thinking_blocks() -> None:
    """The derived message a repaired history (or a stored response's) holds carries its
    thinking_blocks: what the Anthropic request builder needs to send it back."""
    blocks: list[dict[str, Any]] = [
        {"type": "reasoning", "text": "Hmm.", "signature": sign("Hmm.")},
        {"type": "redacted_thinking", "data": {"data": "opaque"}, "text": ""},
        {"type": "text", "text": "Partial"},
    ]
    message = assistant_message(blocks)
    assert message["thinking_blocks"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": sign("Hmm.")},
        {"type": "redacted_thinking", "data": "opaque"},
    ]
    body: dict[str, Any] = {
        "messages": [
            {"role": "user", "content": "Hi"},
            message,
            {"role": "user", "content": "Go on."},
        ],
        "reasoning_effort": "low",
    }
    sent = to_anthropic_request(body, NATIVE, stream=True)
    assert sent["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "Hmm.", "signature": sign("Hmm.")},
        {"type": "redacted_thinking", "data": "opaque"},
        {"type": "text", "text": "Partial"},
    ]
    # With thinking off, Anthropic wants no thinking blocks: they are left out.
    off = to_anthropic_request({**body, "reasoning_effort": None}, NATIVE, stream=True)
    assert off["messages"][1]["content"] == [{"type": "text", "text": "Partial"}]
    # No answer but an Anthropic one has them.
    assert "thinking_blocks" not in assistant_message([{"type": "reasoning", "text": "x"}])


def test_unsigned_thinking_blocks_are_left_out() -> None:
    message = {
        "role": "assistant",
        "content": "Hi",
        "thinking_blocks": [
            {"type": "thinking", "thinking": "x", "signature": ""},
            {"type": "thinking", "thinking": "y"},
            {"type": "redacted_thinking"},
            "junk",
            {"type": "thinking", "thinking": "z", "signature": "s", "index": 0},
        ],
    }
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "a"}, message, {"role": "user", "content": "b"}]
    }
    sent = to_anthropic_request({**body, "reasoning_effort": "low"}, NATIVE, stream=True)
    assert sent["messages"][1]["content"] == [
        {"type": "thinking", "thinking": "z", "signature": "s"},
        {"type": "text", "text": "Hi"},
    ]


def test_signed_thinking_memory_is_bounded_and_exact() -> None:
    memory = SignedThinking(max_chars=100)
    block = {"type": "thinking", "thinking": "t" * 30, "signature": "s" * 10}
    memory.remember(["a", "b"], [block])
    assert memory.restore(["a", "b"]) == [block]
    assert memory.restore(["a"]) == [] and memory.restore(["b", "a"]) == []
    memory.remember(["c"], [block])
    memory.remember(["d"], [block])  # over the bound: the least recently used goes
    assert memory.restore(["a", "b"]) == []
    assert memory.restore(["c"]) == [block] and memory.restore(["d"]) == [block]
    memory.remember(["e"], [{"type": "thinking", "thinking": "t" * 200, "signature": "s"}])
    assert memory.restore(["e"]) == []  # larger than the whole memory: not kept


# -- reasoning_effort: the budget rule -----------------------------------------------------------


@pytest.mark.parametrize(
    ("effort", "cap", "budget", "max_tokens"),
    [
        ("high", 2000, 16384, 18384),  # the issue's case: the answer keeps its 2,000
        ("high", None, 16384, 20480),  # no cap: 4,096 for the answer
        ("medium", 100_000, 4096, 100_000),  # room enough already: the cap stays
        ("medium", 6000, 4096, 8192),  # raised until 4,096 are left for the answer
        ("low", 500, 1024, 1524),
        ("minimal", 64_000, 1024, 64_000),
    ],
)
def test_reasoning_effort_budget_leaves_room_for_the_answer(
    effort: str, cap: int | None, budget: int, max_tokens: int
) -> None:
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": "Hi"}],
        "reasoning_effort": effort,
    }
    if cap is not None:
        body["max_completion_tokens"] = cap
    sent = to_anthropic_request(body, NATIVE, stream=True)
    assert sent["thinking"] == {"type": "enabled", "budget_tokens": budget}
    assert sent["max_tokens"] == max_tokens
    assert max_tokens - budget >= min(cap or 4096, 4096)
    # An explicit `thinking` is the client's own: sent as given.
    explicit = {**body, "thinking": {"type": "enabled", "budget_tokens": 2048}}
    want = cap if cap is not None else 2048 + 4096
    assert to_anthropic_request(explicit, NATIVE, stream=True)["max_tokens"] == want


async def test_reasoning_effort_high_with_a_small_cap_end_to_end(make_claude: MakeClaude) -> None:
    claude, gw = await make_claude()
    completion = await gw.client().chat.completions.create(
        model="claude",
        messages=[{"role": "user", "content": "Hi"}],
        reasoning_effort="high",
        max_tokens=2000,
    )
    assert completion.choices[0].message.content == "Done after 0 tool results."
    sent = claude.requests[-1]
    assert (sent["thinking"]["budget_tokens"], sent["max_tokens"]) == (16384, 18384)


# -- 2. prompt caching ---------------------------------------------------------------------------

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
LONG = "A long shared prefix. " * 50


def cached_chat_body() -> dict[str, Any]:
    """A chat request with `cache_control` in each place the OpenAI-dialect extension puts it."""
    return {
        "model": "claude",
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": LONG, "cache_control": HOUR}]},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Context: " + LONG, "cache_control": EPHEMERAL},
                    {"type": "text", "text": "What is the weather?"},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "toolu_a",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {
                "role": "tool",
                "tool_call_id": "toolu_a",
                "content": "Paris: 21 C",
                "cache_control": EPHEMERAL,
            },
        ],
        "tools": [{**WEATHER_TOOL, "cache_control": EPHEMERAL}],
    }


def check_cached_anthropic_body(sent: dict[str, Any]) -> None:
    """Where Anthropic expects `cache_control`: on the tool, the system block, the content
    block, the tool_result block."""
    assert sent["tools"][0]["cache_control"] == EPHEMERAL
    assert sent["system"] == [{"type": "text", "text": LONG, "cache_control": HOUR}]
    assert sent["messages"][0]["content"] == [
        {"type": "text", "text": "Context: " + LONG, "cache_control": EPHEMERAL},
        {"type": "text", "text": "What is the weather?"},
    ]
    assert sent["messages"][2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_a",
            "content": "Paris: 21 C",
            "cache_control": EPHEMERAL,
        }
    ]


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_chat_cache_control_reaches_anthropic_and_cached_tokens_come_back(
    make_claude: MakeClaude, streaming: bool
) -> None:
    claude, gw = await make_claude()
    client = gw.client()
    usages = []
    for _ in range(2):  # the first writes the prefix to the cache, the second reads it
        if streaming:
            stream = await client.chat.completions.create(
                **cached_chat_body(), stream=True, stream_options={"include_usage": True}
            )
            usages += [chunk.usage async for chunk in stream if chunk.usage]
        else:
            usages.append((await client.chat.completions.create(**cached_chat_body())).usage)
        check_cached_anthropic_body(claude.requests[-1])
    write, read = usages
    assert write.prompt_tokens == INPUT + CACHED
    assert write.prompt_tokens_details.cached_tokens == 0
    assert write.cache_creation_input_tokens == CACHED
    assert read.prompt_tokens == INPUT + CACHED
    assert read.prompt_tokens_details.cached_tokens == CACHED
    assert read.completion_tokens == OUTPUT
    assert not claude.refusals


def test_cache_control_on_a_message_marks_its_last_block() -> None:
    body: dict[str, Any] = {
        "messages": [
            {"role": "system", "content": "Be brief.", "cache_control": EPHEMERAL},
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "Hi", "cache_control": EPHEMERAL},
            {
                "role": "assistant",
                "content": [{"type": "text", "text": "Hello", "cache_control": EPHEMERAL}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://x.test/a.png"},
                        "cache_control": EPHEMERAL,
                    },
                ],
            },
        ],
        "tools": [
            {
                "type": "function",
                "function": {**WEATHER_TOOL["function"], "cache_control": EPHEMERAL},
            }
        ],
    }
    sent = to_anthropic_request(body, NATIVE, stream=True)
    assert sent["system"] == [
        {"type": "text", "text": "Be brief.", "cache_control": EPHEMERAL},
        {"type": "text", "text": "Be kind."},
    ]
    assert sent["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": EPHEMERAL}]},
        {
            "role": "assistant",
            "content": [{"type": "text", "text": "Hello", "cache_control": EPHEMERAL}],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "url", "url": "https://x.test/a.png"},
                    "cache_control": EPHEMERAL,
                }
            ],
        },
    ]
    assert sent["tools"][0]["cache_control"] == EPHEMERAL
    # Without any, the system prompt stays one string.
    plain = to_anthropic_request({"messages": body["messages"][1:3]}, NATIVE, stream=True)
    assert plain["system"] == "Be kind."


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_messages_cache_control_is_kept_and_cache_usage_comes_back(
    make_claude: MakeClaude, streaming: bool
) -> None:
    """Native `cache_control` on /v1/messages reaches Anthropic where the client put it."""
    claude, gw = await make_claude()
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key", max_retries=0)
    request: dict[str, Any] = {
        "model": "claude",
        "max_tokens": 1000,
        "system": [{"type": "text", "text": LONG, "cache_control": HOUR}],
        "tools": [
            {
                "name": "get_weather",
                "input_schema": WEATHER_TOOL["function"]["parameters"],
                "cache_control": EPHEMERAL,
            }
        ],
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Context: " + LONG, "cache_control": EPHEMERAL},
                    {"type": "text", "text": "What is the weather?"},
                ],
            },
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_a",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_a",
                        "content": "Paris: 21 C",
                        "cache_control": EPHEMERAL,
                    }
                ],
            },
        ],
    }
    usages = []
    try:
        for _ in range(2):
            if streaming:
                async with client.messages.stream(**request) as stream:
                    message = await stream.get_final_message()
            else:
                message = await client.messages.create(**request)
            usages.append(message.usage)
            check_cached_anthropic_body(claude.requests[-1])
    finally:
        await client.close()
    write, read = usages
    assert (write.cache_creation_input_tokens, write.cache_read_input_tokens) == (CACHED, 0)
    assert (read.cache_creation_input_tokens, read.cache_read_input_tokens) == (0, CACHED)
    assert read.input_tokens == INPUT
    assert not claude.refusals


@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_responses_report_cached_tokens(make_claude: MakeClaude, streaming: bool) -> None:
    """The Responses API has no `cache_control` to send; a prefix Anthropic read from its
    cache (`always_cached`: as one cached by another request) is reported in its own fields."""
    claude, gw = await make_claude()
    claude.always_cached = True
    client = gw.client()
    if streaming:
        async with client.responses.stream(model="claude", input="Hi") as stream:
            response = await stream.get_final_response()
    else:
        response = await client.responses.create(model="claude", input="Hi")
    assert response.usage is not None
    assert response.usage.input_tokens == INPUT + CACHED
    assert response.usage.input_tokens_details.cached_tokens == CACHED
    assert response.usage.output_tokens == OUTPUT


def test_cache_usage_in_each_dialects_fields() -> None:
    """One Anthropic report (a read and a write), as each client dialect renders it."""
    usage = openai_usage(
        {
            "input_tokens": 5,
            "cache_read_input_tokens": 100,
            "cache_creation_input_tokens": 40,
            "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 30},
            "output_tokens": 3,
        }
    )
    chat = chat_usage(usage)
    assert chat["prompt_tokens"] == 145 and chat["total_tokens"] == 148
    assert chat["prompt_tokens_details"] == {"cached_tokens": 100}
    assert chat["cache_creation_input_tokens"] == 40
    assert "provider_usage" not in chat
    assert anthropic_usage(usage) == {
        "input_tokens": 5,
        "output_tokens": 3,
        "cache_creation_input_tokens": 40,
        "cache_read_input_tokens": 100,
        "cache_creation": {"ephemeral_5m_input_tokens": 10, "ephemeral_1h_input_tokens": 30},
    }
    assert responses_usage(usage)["input_tokens_details"] == {
        "cached_tokens": 100,
        "cache_write_tokens": 40,
    }
    # From an OpenAI upstream: only reads, inside prompt_tokens.
    openai_style = {
        "prompt_tokens": 50,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 32},
    }
    assert anthropic_usage(openai_style) == {
        "input_tokens": 18,
        "output_tokens": 2,
        "cache_read_input_tokens": 32,
    }


async def test_messages_client_thinking_tool_loop(make_claude: MakeClaude, no_memo: None) -> None:
    """An Anthropic SDK client's tool loop through /v1/messages: its thinking and
    redacted_thinking blocks (signed) reach Anthropic again exactly as they came."""
    claude, gw = await make_claude()
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key", max_retries=0)
    tool: Any = {"name": "get_weather", "input_schema": WEATHER_TOOL["function"]["parameters"]}
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    try:
        while True:
            message = await client.messages.create(
                model="claude",
                max_tokens=4000,
                thinking={"type": "enabled", "budget_tokens": 1024},
                tools=[tool],
                messages=messages,
            )
            messages.append(
                {"role": "assistant", "content": [b.model_dump() for b in message.content]}
            )
            calls = [b for b in message.content if b.type == "tool_use"]
            if not calls:
                break
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": call.id,
                            "content": weather(str(call.input["city"])),
                        }
                        for call in calls
                    ],
                }
            )
    finally:
        await client.close()
    assert message.content[-1].type == "text"
    assert message.content[-1].text == "Done after 3 tool results."
    check_tool_turns(claude)


async def test_langchain_thinking_tool_loop(make_claude: MakeClaude, memo: None) -> None:
    """LangChain sends an AIMessage back as its text and tool calls, no thinking_blocks: the
    gateway's memory of the answers it parsed makes the loop work."""
    claude, gw = await make_claude()
    llm = ChatOpenAI(
        model="claude",
        base_url=gw.url + "/v1",
        api_key="test-key",
        max_retries=0,
        timeout=10,
        reasoning_effort="low",
    ).bind_tools([WEATHER_TOOL])
    messages: list[BaseMessage] = [HumanMessage(QUESTION)]
    while True:
        answer = await llm.ainvoke(messages)
        assert isinstance(answer, AIMessage)
        messages.append(answer)
        if not answer.tool_calls:
            break
        for call in answer.tool_calls:
            messages.append(ToolMessage(weather(call["args"]["city"]), tool_call_id=call["id"]))
    assert answer.text == "Done after 3 tool results."
    check_tool_turns(claude)
