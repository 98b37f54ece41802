"""Every body the gateway sends upstream is one the provider's own SDK types accept.

A matrix of client dialect (OpenAI chat, OpenAI Responses, Anthropic Messages) x provider
(an OpenAI-compatible deployment, an Anthropic one) x feature (text, tools, parallel tool calls,
thinking / reasoning, images, structured output, prompt caching, tool results, a history with
an interrupted answer). Each cell drives the real gateway over loopback against the fake
upstream (tests/fakes.py, tests/providers/upstreams.py) and checks every request the fake got:

- against the provider SDK's request type, strictly: `openai.types.chat.CompletionCreateParams`
  for an OpenAI upstream, `anthropic.types.MessageCreateParams` for an Anthropic one. The SDKs'
  TypedDicts are validated with pydantic `TypeAdapter`, with no key allowed that the type does
  not have, every lazily validated iterable read to its end, and a block matched only by one of
  the SDK's response models (which the param unions also take) counted as a failure;
- that the feature got there in the wire's own form (nothing dropped on the way).

Two allowances, both for OpenAI upstreams (docs/providers.md, "Request parameters"):

- an OpenAI chat client talking to an OpenAI-compatible deployment gets its body relayed as sent
  (docs/providers.md, "Client dialects"), so the extensions it put there itself
  (`cache_control`, `reasoning_content`, `thinking_blocks`: what OpenRouter, LiteLLM and
  Anthropic's compatibility endpoint take) are its own; those cells check they went through
  unchanged, and validate the rest;
- earlier reasoning in a history the gateway translated goes back as an assistant message's
  `reasoning_content`, the form the OpenAI-compatible servers that reason take back
  (tests/http/test_item_reference.py holds it): it is taken out before validating, and nothing
  else of the gateway's own may be there.
"""

from __future__ import annotations

import collections.abc
import typing
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
import pytest
import typing_extensions
from anthropic.types import MessageCreateParams
from openai.types.chat import CompletionCreateParams
from pydantic import BaseModel, ConfigDict, TypeAdapter, ValidationError

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeServer, FakeUpstream, MakeServer
from tests.providers.upstreams import AnthropicServer

DIALECTS = ("chat", "responses", "messages")
PROVIDERS = ("openai", "anthropic")
FEATURES = (
    "text",
    "tools",
    "parallel_tools",
    "thinking",
    "images",
    "structured_output",
    "caching",
    "tool_results",
    "interrupted_history",
)
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}

# Cells that fail today for work in progress elsewhere: (dialect, provider, feature) -> why.
XFAIL: dict[tuple[str, str, str], str] = {}

# Cells the gateway refuses by design (docs/providers.md, "Request parameters"): a Responses
# client's caching is `prompt_cache_key`, which an Anthropic deployment cannot carry.
REFUSED: dict[tuple[str, str, str], str] = {
    ("responses", "anthropic", "caching"): "prompt_cache_key",
}


# -- the providers' own request types, strict ----------------------------------------------------


def _typed_dicts(tp: Any, seen: set[Any]) -> None:
    if typing_extensions.is_typeddict(tp):
        if tp not in seen:
            seen.add(tp)
            for hint in typing_extensions.get_type_hints(tp).values():
                _typed_dicts(hint, seen)
        return
    value = getattr(tp, "__value__", None)  # a `type X = ...` alias
    if value is not None:
        _typed_dicts(value, seen)
    for arg in typing.get_args(tp):
        _typed_dicts(arg, seen)


def strict_adapter(tp: Any) -> TypeAdapter[Any]:
    """A TypeAdapter for an SDK's TypedDict request type that forbids unknown keys at every
    level. (The config is set on the SDK's classes only while the schema is built.)"""
    seen: set[Any] = set()
    _typed_dicts(tp, seen)
    saved = {cls: cls.__dict__.get("__pydantic_config__") for cls in seen}
    for cls in seen:
        cls.__pydantic_config__ = ConfigDict(extra="forbid", arbitrary_types_allowed=True)
    try:
        return TypeAdapter(tp)
    finally:
        for cls, config in saved.items():
            if config is None:
                del cls.__pydantic_config__
            else:
                cls.__pydantic_config__ = config


def _drain(value: Any, where: str = "") -> Any:
    """Read every lazily validated iterable (which raises on a bad item); a response model
    where a param was expected means no param type matched."""
    if isinstance(value, BaseModel):
        raise AssertionError(
            f"{where or 'body'}: matches no request type, only the response model"
            f" {type(value).__name__} (extra fields: {value.model_extra})"
        )
    if isinstance(value, dict):
        return {k: _drain(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_drain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, collections.abc.Iterator):
        return [_drain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


SCHEMAS: dict[str, TypeAdapter[Any]] = {}


def validate(provider: str, body: dict[str, Any]) -> None:
    if provider not in SCHEMAS:
        tp = CompletionCreateParams if provider == "openai" else MessageCreateParams
        SCHEMAS[provider] = strict_adapter(tp)
    try:
        _drain(SCHEMAS[provider].validate_python(body))
    except ValidationError as exc:
        # A union's every arm reports; the keys no arm has say most about what is wrong.
        extra = sorted(
            {".".join(map(str, e["loc"])) for e in exc.errors() if e["type"] == "extra_forbidden"}
        )
        raise AssertionError(f"not a {provider} request: unknown keys {extra}; {exc}") from None


def test_the_strict_schemas_catch_what_they_should() -> None:
    good = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "stream": True}
    validate("openai", good)
    for bad in (
        {**good, "thinking": {"type": "enabled"}},
        {**good, "messages": [{"role": "user", "content": "Hi", "cache_control": {}}]},
        {**good, "messages": [{"role": "assistant", "content": "x", "thinking_blocks": []}]},
    ):
        with pytest.raises(Exception):  # noqa: B017 - a ValidationError or our AssertionError
            validate("openai", bad)
    text = {"type": "text", "text": "Hi"}
    good = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [text]}]}
    validate("anthropic", good)
    for bad in (
        {**good, "n": 2},
        {**good, "messages": [{"role": "user", "content": [{**text, "extra": 1}]}]},
        {**good, "tools": [{"name": "f", "input_schema": {"type": "object"}, "strict": 3}]},
    ):
        with pytest.raises(Exception):  # noqa: B017
            validate("anthropic", bad)


# -- what each client sends ------------------------------------------------------------------------

PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9aw"
    "AAAABJRU5ErkJggg=="
)
SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["city", "population"],
    "additionalProperties": False,
}
PARAMETERS = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CACHE = {"type": "ephemeral"}
SIGNATURE = "EqQBCkYIBxgCKkDsig=="


def chat_tool(**extra: Any) -> dict[str, Any]:
    function = {
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": PARAMETERS,
    }
    return {"type": "function", "function": function, **extra}


def chat_call(id: str, city: str) -> dict[str, Any]:
    arguments = orjson.dumps({"city": city}).decode()
    return {
        "id": id,
        "type": "function",
        "function": {"name": "get_weather", "arguments": arguments},
    }


def responses_tool() -> dict[str, Any]:
    return {
        "type": "function",
        "name": "get_weather",
        "description": "Weather in a city.",
        "parameters": PARAMETERS,
    }


def anthropic_tool(**extra: Any) -> dict[str, Any]:
    return {
        "name": "get_weather",
        "description": "Weather in a city.",
        "input_schema": PARAMETERS,
        **extra,
    }


def tool_use(id: str, city: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": id, "name": "get_weather", "input": {"city": city}}


def chat_body(feature: str) -> dict[str, Any]:
    system = {"role": "system", "content": "Be brief."}
    ask = {"role": "user", "content": "Weather in Paris and Rome?"}
    if feature == "text":
        return {"messages": [system, {"role": "user", "content": "Hi"}]}
    if feature == "tools":
        return {"messages": [system, ask], "tools": [chat_tool()], "tool_choice": "auto"}
    if feature == "parallel_tools":
        calls = {
            "role": "assistant",
            "content": None,
            "tool_calls": [chat_call("call_1", "Paris"), chat_call("call_2", "Rome")],
        }
        return {
            "messages": [
                system,
                ask,
                calls,
                {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
                {"role": "tool", "tool_call_id": "call_2", "content": "Rain"},
            ],
            "tools": [chat_tool()],
            "parallel_tool_calls": True,
        }
    if feature == "thinking":
        # Round two of a thinking + tool loop, the assistant turn as the gateway gave it.
        thought = {"type": "thinking", "thinking": "Paris first.", "signature": SIGNATURE}
        turn = {
            "role": "assistant",
            "content": None,
            "reasoning_content": "Paris first.",
            "thinking_blocks": [thought],
            "tool_calls": [chat_call("toolu_1", "Paris")],
        }
        tool = {"role": "tool", "tool_call_id": "toolu_1", "content": "Sunny"}
        return {
            "messages": [ask, turn, tool],
            "tools": [chat_tool()],
            "reasoning_effort": "high",
            "max_completion_tokens": 2000,
        }
    if feature == "images":
        parts = [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
        ]
        return {"messages": [{"role": "user", "content": parts}]}
    if feature == "structured_output":
        schema = {"name": "city", "schema": SCHEMA, "strict": True}
        return {
            "messages": [system, ask],
            "response_format": {"type": "json_schema", "json_schema": schema},
        }
    if feature == "caching":
        prefix = {"type": "text", "text": "A long shared prefix.", "cache_control": CACHE}
        return {
            "messages": [
                {"role": "system", "content": [prefix]},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi", "cache_control": CACHE}],
                },
            ],
            "tools": [chat_tool(cache_control=CACHE)],
        }
    if feature == "tool_results":
        calls = {
            "role": "assistant",
            "content": "Looking.",
            "tool_calls": [chat_call("call_1", "Paris")],
        }
        tool = {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "clear"}'}
        return {"messages": [ask, calls, tool], "tools": [chat_tool()]}
    raise AssertionError(feature)


def responses_body(feature: str) -> dict[str, Any]:
    ask = {"role": "user", "content": "Weather in Paris and Rome?"}

    def call(id: str, city: str) -> dict[str, Any]:
        arguments = orjson.dumps({"city": city}).decode()
        return {
            "type": "function_call",
            "call_id": id,
            "name": "get_weather",
            "arguments": arguments,
        }

    def output(id: str, text: str) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": id, "output": text}

    if feature == "text":
        return {"input": "Hi", "instructions": "Be brief."}
    if feature == "tools":
        return {"input": [ask], "tools": [responses_tool()], "tool_choice": "auto"}
    if feature == "parallel_tools":
        items = [
            ask,
            call("call_1", "Paris"),
            call("call_2", "Rome"),
            output("call_1", "Sunny"),
            output("call_2", "Rain"),
        ]
        return {"input": items, "tools": [responses_tool()], "parallel_tool_calls": True}
    if feature == "thinking":
        reasoning = {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Paris first."}],
        }
        items = [ask, reasoning, call("toolu_1", "Paris"), output("toolu_1", "Sunny")]
        return {
            "input": items,
            "tools": [responses_tool()],
            "reasoning": {"effort": "high"},
            "max_output_tokens": 2000,
        }
    if feature == "images":
        content = [
            {"type": "input_text", "text": "What is this?"},
            {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}"},
        ]
        return {"input": [{"role": "user", "content": content}]}
    if feature == "structured_output":
        fmt = {"type": "json_schema", "name": "city", "schema": SCHEMA, "strict": True}
        return {"input": [ask], "text": {"format": fmt}}
    if feature == "caching":
        return {
            "input": "Hi",
            "instructions": "A long shared prefix.",
            "prompt_cache_key": "tenant-1",
        }
    if feature == "tool_results":
        return {
            "input": [ask, call("call_1", "Paris"), output("call_1", '{"sky": "clear"}')],
            "tools": [responses_tool()],
        }
    raise AssertionError(feature)


def messages_body(feature: str) -> dict[str, Any]:
    ask = {"role": "user", "content": "Weather in Paris and Rome?"}
    base: dict[str, Any] = {"max_tokens": 300, "system": "Be brief."}
    if feature == "text":
        return {**base, "messages": [{"role": "user", "content": "Hi"}]}
    if feature == "tools":
        return {
            **base,
            "messages": [ask],
            "tools": [anthropic_tool()],
            "tool_choice": {"type": "auto"},
        }
    if feature == "parallel_tools":
        results = [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "Rain"},
        ]
        return {
            **base,
            "tools": [anthropic_tool()],
            "messages": [
                ask,
                {
                    "role": "assistant",
                    "content": [tool_use("toolu_1", "Paris"), tool_use("toolu_2", "Rome")],
                },
                {"role": "user", "content": results},
            ],
        }
    if feature == "thinking":
        thought = {"type": "thinking", "thinking": "Paris first.", "signature": SIGNATURE}
        result: dict[str, Any] = {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": "Sunny",
        }
        return {
            "max_tokens": 4096,
            "tools": [anthropic_tool()],
            "thinking": {"type": "enabled", "budget_tokens": 2048},
            "messages": [
                ask,
                {"role": "assistant", "content": [thought, tool_use("toolu_1", "Paris")]},
                {"role": "user", "content": [result]},
            ],
        }
    if feature == "images":
        image = {
            "type": "image",
            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
        }
        return {
            **base,
            "messages": [
                {"role": "user", "content": [image, {"type": "text", "text": "What is this?"}]}
            ],
        }
    if feature == "structured_output":
        return {
            **base,
            "messages": [ask],
            "output_config": {"format": {"type": "json_schema", "schema": SCHEMA}},
        }
    if feature == "caching":
        return {
            "max_tokens": 300,
            "system": [{"type": "text", "text": "A long shared prefix.", "cache_control": CACHE}],
            "tools": [anthropic_tool(cache_control=CACHE)],
            "messages": [
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Hi", "cache_control": CACHE}],
                }
            ],
        }
    if feature == "tool_results":
        result = {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": [{"type": "text", "text": '{"sky": "clear"}'}],
        }
        return {
            **base,
            "tools": [anthropic_tool()],
            "messages": [
                ask,
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Looking."}, tool_use("toolu_1", "Paris")],
                },
                {"role": "user", "content": [result]},
            ],
        }
    raise AssertionError(feature)


BODIES: dict[str, Callable[[str], dict[str, Any]]] = {
    "chat": chat_body,
    "responses": responses_body,
    "messages": messages_body,
}


# -- that the feature got there ------------------------------------------------------------------


def _openai_parts(body: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        part
        for message in body["messages"]
        if isinstance(message.get("content"), list)
        for part in message["content"]
    ]


def _anthropic_blocks(body: dict[str, Any]) -> list[dict[str, Any]]:
    blocks = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"]]
    system = body.get("system")
    return blocks + (system if isinstance(system, list) else [])


def carried(provider: str, feature: str, dialect: str, body: dict[str, Any]) -> None:
    """The feature is in the upstream body, in the wire's own form."""
    if provider == "openai":
        messages = body["messages"]
        if feature == "text":
            assert messages[0]["role"] == "system" and "Hi" in str(messages[-1]["content"])
        elif feature == "tools":
            assert body["tools"][0]["function"]["name"] == "get_weather"
        elif feature == "parallel_tools":
            calls = [m for m in messages if m["role"] == "assistant" and m.get("tool_calls")]
            assert [len(m["tool_calls"]) for m in calls] == [2]
            assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == [
                calls[0]["tool_calls"][0]["id"],
                calls[0]["tool_calls"][1]["id"],
            ]
        elif feature == "thinking":
            assert body["reasoning_effort"] in ("low", "medium", "high")
        elif feature == "images":
            assert any(p["type"] == "image_url" for p in _openai_parts(body))
        elif feature == "structured_output":
            assert body["response_format"]["type"] == "json_schema"
            assert body["response_format"]["json_schema"]["schema"]["required"] == [
                "city",
                "population",
            ]
        elif feature == "caching":
            if dialect == "responses":
                assert body["prompt_cache_key"] == "tenant-1"
            # OpenAI caches prefixes by itself: nothing else to carry.
        elif feature == "tool_results":
            tool = [m for m in messages if m["role"] == "tool"]
            assert len(tool) == 1 and "clear" in str(tool[0]["content"])
        return
    blocks = _anthropic_blocks(body)
    kinds = [b["type"] for b in blocks]
    if feature == "text":
        assert body["system"] and "Hi" in str(body["messages"][-1])
    elif feature == "tools":
        assert body["tools"][0]["name"] == "get_weather"
    elif feature == "parallel_tools":
        assert kinds.count("tool_use") == 2 and kinds.count("tool_result") == 2
    elif feature == "thinking":
        assert body["thinking"]["type"] == "enabled"
        assert body["max_tokens"] > body["thinking"]["budget_tokens"]
        turn = next(m for m in body["messages"] if m["role"] == "assistant")
        thoughts = [b for b in turn["content"] if b["type"] == "thinking"]
        assert all(b.get("signature") for b in thoughts)  # never one Anthropic would refuse
        if dialect != "responses":  # a Responses reasoning item carries no signature
            # Anthropic refuses the tool turn of a thinking loop without its signed thinking.
            assert turn["content"][0] == {
                "type": "thinking",
                "thinking": "Paris first.",
                "signature": SIGNATURE,
            }
    elif feature == "images":
        assert "image" in kinds
    elif feature == "structured_output":
        forced = body.get("tool_choice") == {"type": "tool", "name": "json_answer"}
        assert forced or body.get("output_config", {}).get("format"), body
    elif feature == "caching":
        assert sum("cache_control" in b for b in blocks) >= 2, blocks
        assert "cache_control" in body["tools"][0]
    elif feature == "tool_results":
        assert "tool_result" in kinds and "clear" in str(blocks)


# -- the matrix ------------------------------------------------------------------------------------


def cells() -> list[Any]:
    out = []
    for dialect in DIALECTS:
        for provider in PROVIDERS:
            for feature in FEATURES:
                marks = []
                reason = XFAIL.get((dialect, provider, feature))
                if reason is not None:
                    marks.append(pytest.mark.xfail(strict=True, reason=reason))
                out.append(
                    pytest.param(
                        dialect,
                        provider,
                        feature,
                        marks=marks,
                        id=f"{dialect}-{provider}-{feature}",
                    )
                )
    return out


@pytest.fixture
async def servers(aiohttp_server: MakeServer) -> dict[str, FakeServer]:
    return {
        "openai": await FakeUpstream().start(aiohttp_server),
        "anthropic": await AnthropicServer().start(aiohttp_server),
    }


async def post(
    gw: GatewayUnderTest, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + path, json=body, headers=headers or {}) as response,
    ):
        return response.status, dict(response.headers), await response.read()


async def interrupted(
    gw: GatewayUnderTest, fake: FakeServer, dialect: str
) -> tuple[dict[str, Any], dict[str, str]]:
    """A first answer cut off by its client after the first words; the follow-up request (its
    body and headers) that the gateway must send with that partial answer in its history."""
    fake.stall_after(["Partly ", "cloudy"])
    first = {**BODIES[dialect]("text"), "model": "m", "stream": True}
    response_id = ""
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + PATHS[dialect], json=first) as response,
    ):
        assert response.status == 200
        conversation = response.headers["X-Conversation-Id"]
        async for line in response.content:
            if b'"resp_' in line and not response_id:
                response_id = orjson.loads(line.removeprefix(b"data: "))["response"]["id"]
            if b"Partly" in line:
                break
        response.close()
    await gw.wait_turn_end(conversation)
    if dialect == "responses":
        return {"input": "And tomorrow?", "previous_response_id": response_id}, {}
    again = {"role": "user", "content": "And tomorrow?"}
    # The client's history leaves out the answer it stopped: the gateway puts it back.
    body = BODIES[dialect]("text")
    body["messages"] = [*body["messages"], again]
    return body, {"X-Conversation-Id": conversation}


@pytest.mark.parametrize(("dialect", "provider", "feature"), cells())
async def test_every_upstream_body_validates(
    make_gateway: MakeGateway,
    servers: dict[str, FakeServer],
    dialect: str,
    provider: str,
    feature: str,
) -> None:
    fake = servers[provider]
    model = {"name": "m", "retry": {"max_attempts": 1}, "deployments": [fake.deployment()]}
    gw = await make_gateway(models=[model])
    headers: dict[str, str] = {}
    if feature == "interrupted_history":
        body, headers = await interrupted(gw, fake, dialect)
    else:
        body = BODIES[dialect](feature)
    body = {**body, "model": "m", "stream": True}
    fake.text(["It is ", "sunny."])
    status, answer_headers, answer = await post(gw, PATHS[dialect], body, headers)

    refused = REFUSED.get((dialect, provider, feature))
    if refused is not None:
        assert status == 400 and orjson.loads(answer)["error"]["param"] == refused
        return
    assert status == 200, answer[:500]
    assert fake.requests, "nothing reached the upstream"
    for sent in fake.requests:
        checked = sent
        if (dialect, provider) == ("chat", "openai") and feature in ("thinking", "caching"):
            checked = _relayed_as_sent(sent, body)
        elif provider == "openai":
            checked = _without_reasoning_content(sent)
        validate(provider, checked)
    last = fake.requests[-1]
    if feature == "interrupted_history":
        assert answer_headers.get("X-Gateway-History-Repaired") == "1" or dialect == "responses"
        assistant = [m for m in last["messages"] if m["role"] == "assistant"]
        assert "Partly" in str(assistant), last["messages"]
    else:
        carried(provider, feature, dialect, last)


_CLIENT_EXTENSIONS = ("cache_control", "reasoning_content", "thinking_blocks")


def _relayed_as_sent(sent: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat client's body relayed to an OpenAI-compatible deployment: its own
    extensions went through as it sent them; the rest is checked against the schema."""
    assert sent["messages"] == body["messages"]
    assert sent.get("tools") == body.get("tools")

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in _CLIENT_EXTENSIONS}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return {k: strip(v) for k, v in sent.items()}


def _without_reasoning_content(sent: dict[str, Any]) -> dict[str, Any]:
    messages = [
        {k: v for k, v in m.items() if not (k == "reasoning_content" and m["role"] == "assistant")}
        for m in sent["messages"]
    ]
    return {**sent, "messages": messages}
