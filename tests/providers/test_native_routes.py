"""The litellm models the gateway speaks itself (gateway/providers/native_routes.py): which ones,
where they go, and the request each provider's own API takes. What comes back is tested end to
end in the adapter contract suite (test_adapter_contract.py: `groq`, `mistral`, `cohere`) and
in test_groq.py, test_mistral.py and test_cohere.py; this file holds what those cannot see."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.config import DeploymentConfig
from gateway.providers.cohere_chat import CohereStreamParser, cohere_request
from gateway.providers.mistral_chat import MistralStreamParser, mistral_request
from gateway.providers.native_routes import NativeChat, groq_request, native_provider
from gateway.stream.events import (
    REASONING,
    TOOL_CALL,
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamFailure,
    Usage,
)
from gateway.stream.sse import SSEFrame

TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "strict": True,
        "parameters": {
            "$schema": "http://json-schema.org/draft-07/schema#",
            "type": "object",
            "properties": {"country": {"type": "string"}},
            "additionalProperties": False,
        },
    },
}
HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "Be brief."},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "Where is this?", "cache_control": {"type": "ephemeral"}},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
        ],
    },
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "lookup", "arguments": '{"country": "France"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "Paris"},
]


class Pool:
    """Never posted to: these tests build adapters only."""

    async def post(self, endpoint: Any, body: bytes) -> Any:
        raise AssertionError("not posted")

    async def close(self) -> None:
        pass


def adapter(model: str, **config: Any) -> NativeChat | None:
    return native_provider(
        DeploymentConfig(provider="litellm", model=model, **config), Pool(), model
    )


@pytest.mark.parametrize(
    ("model", "api_base", "url"),
    [
        ("groq/openai/gpt-oss-120b", None, "https://api.groq.com/openai/v1/chat/completions"),
        ("mistral/mistral-small-latest", None, "https://api.mistral.ai/v1/chat/completions"),
        ("cohere_chat/command-a-03-2025", None, "https://api.cohere.com/v2/chat"),
        ("cohere/command-r-plus", "https://eu.example/v2/chat", "https://eu.example/v2/chat"),
        ("cohere/command-r-plus", "https://eu.example", "https://eu.example/v2/chat"),
        ("groq/llama-3.1-8b-instant", "http://127.0.0.1:9/openai/v1/", None),
    ],
)
def test_which_models_are_spoken_natively_and_where_they_go(
    model: str, api_base: str | None, url: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    for variable in ("GROQ_API_BASE", "MISTRAL_API_BASE", "COHERE_API_BASE"):
        monkeypatch.delenv(variable, raising=False)
    made = adapter(model, api_base=api_base)
    assert made is not None
    expected = url or "http://127.0.0.1:9/openai/v1/chat/completions"
    assert made._endpoint.url == expected


@pytest.mark.parametrize(
    "model",
    ["gemini/gemini-2.5-flash", "bedrock/anthropic.claude", "gpt-4o", "cohere_chat/v1/command-r"],
)
def test_other_litellm_models_stay_with_litellm(model: str) -> None:
    assert adapter(model) is None


def test_cohere_v2_route_names_the_model_without_its_route() -> None:
    made = adapter("cohere_chat/v2/command-r-plus")
    assert made is not None and made._model == "command-r-plus"


def test_the_api_base_comes_from_litellms_variable_when_the_config_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("MISTRAL_API_BASE", "https://mistral.internal/v1")
    made = adapter("mistral/mistral-small-latest")
    assert made is not None
    assert made._endpoint.url == "https://mistral.internal/v1/chat/completions"


def test_the_key_comes_from_litellms_variable_when_the_config_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("COHERE_API_KEY", raising=False)
    monkeypatch.setenv("CO_API_KEY", "co-from-env")
    made = adapter("cohere_chat/command-a-03-2025")
    assert made is not None
    assert made._endpoint.headers["Authorization"] == "Bearer co-from-env"
    configured = adapter("cohere_chat/command-a-03-2025", api_key="co-configured")
    assert configured is not None
    assert configured._endpoint.headers["Authorization"] == "Bearer co-configured"


def test_cohere_request() -> None:
    body = {
        "messages": HISTORY,
        "tools": [TOOL],
        "tool_choice": "required",
        "stop": "END",
        "top_p": 0.9,
        "max_completion_tokens": 300,
        "reasoning_effort": "high",
        "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}},
        "user": "u-1",
    }
    request = cohere_request(body, "command-a-reasoning-08-2025", stream=True)
    assert request == {
        "model": "command-a-reasoning-08-2025",
        "stream": True,
        "messages": [
            {"role": "system", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Where is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            {"role": "assistant", "tool_calls": HISTORY[2]["tool_calls"]},
            {"role": "tool", "tool_call_id": "call_1", "content": "Paris"},
        ],
        "p": 0.9,
        "max_tokens": 300,
        "stop_sequences": ["END"],
        "tools": [{"type": "function", "function": TOOL["function"]}],
        "tool_choice": "REQUIRED",
        "response_format": {"type": "json_object", "json_schema": {"type": "object"}},
        "thinking": {"type": "enabled"},
    }


def test_mistral_request() -> None:
    body = {
        "messages": HISTORY,
        "tools": [TOOL],
        "tool_choice": "required",
        "seed": 7,
        "max_completion_tokens": 300,
        "reasoning_effort": "low",
        "stream_options": {"include_usage": True},
        "user": "u-1",
    }
    request = mistral_request(body, "mistral-medium-2508", stream=True)
    assert request["random_seed"] == 7
    assert request["max_tokens"] == 300
    assert request["tool_choice"] == "any"
    assert request["reasoning_effort"] == "low"
    assert request["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "lookup",
                "parameters": {"type": "object", "properties": {"country": {"type": "string"}}},
            },
        }
    ]
    # Fields Mistral refuses are not sent; the carriers of other dialects neither.
    assert not {"seed", "user", "stream_options", "max_completion_tokens"} & request.keys()
    assert "cache_control" not in orjson.dumps(request["messages"]).decode()
    # A Magistral model reasons whatever it is told; the effort is not a field it takes.
    assert "reasoning_effort" not in mistral_request(body, "magistral-medium-latest", stream=True)


def test_mistral_messages_hold_only_mistrals_fields() -> None:
    """Mistral refuses fields it does not know: a name beside a user's message, a tool call's
    index, an earlier answer's reasoning (which a reasoning model gets back as a thinking part),
    an empty assistant message."""
    history = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "name": "ann", "content": "Capital of France?"},
        {
            "role": "assistant",
            "content": None,
            "reasoning_content": "A lookup.",
            "tool_calls": [
                {
                    "index": 0,
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "lookup", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "name": "lookup", "content": "Paris"},
        {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy."},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": "Thanks"},
    ]
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    sent = mistral_request({"messages": history}, "mistral-small-latest", stream=False)
    assert sent["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "content": "Paris", "tool_call_id": "c1", "name": "lookup"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Thanks"},
    ]
    thinking = mistral_request({"messages": history}, "magistral-medium-latest", stream=False)
    assert thinking["messages"][4]["content"] == [
        {"type": "thinking", "thinking": [{"type": "text", "text": "Easy."}], "closed": True},
        {"type": "text", "text": "Paris."},
    ]


def test_groq_request_keeps_openais_fields_but_the_gateways() -> None:
    body = {
        "messages": HISTORY,
        "temperature": 0.2,
        "reasoning_effort": "low",
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "metadata": {"tags": ["a"]},
    }
    request = groq_request(body, "openai/gpt-oss-120b", stream=False)
    assert request.keys() == {"model", "messages", "stream", "temperature", "reasoning_effort"}
    # An earlier answer goes without its reasoning and null fields, which Groq refuses.
    earlier = {
        "role": "assistant",
        "content": "Paris.",
        "reasoning_content": "Hm.",
        "refusal": None,
    }
    sent = groq_request({"messages": [earlier]}, "openai/gpt-oss-120b", stream=False)
    assert sent["messages"] == [{"role": "assistant", "content": "Paris."}]


def frame(obj: dict[str, Any]) -> SSEFrame:
    data = orjson.dumps(obj)
    return SSEFrame(b"data: " + data + b"\n\n", obj.get("type"), data.decode())


def test_a_cohere_tool_plan_is_reasoning_that_ends_where_the_call_starts() -> None:
    parser = CohereStreamParser()
    plan = {"message": {"tool_plan": "I will look it up."}}
    call = {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": ""}}
    seen = []
    for obj in (
        {"type": "message-start", "id": "m1", "delta": {"message": {"role": "assistant"}}},
        {"type": "tool-plan-delta", "delta": plan},
        {"type": "tool-call-start", "index": 0, "delta": {"message": {"tool_calls": call}}},
        {
            "type": "tool-call-delta",
            "index": 0,
            "delta": {"message": {"tool_calls": {"function": {"arguments": "{}"}}}},
        },
        {"type": "tool-call-end", "index": 0},
        {
            "type": "message-end",
            "delta": {
                "finish_reason": "TOOL_CALL",
                "usage": {"billed_units": {"input_tokens": 12, "output_tokens": 4}},
            },
        },
    ):
        events, kind = parser.feed(frame(obj))
        seen += events
    assert kind == "done" and parser.done and parser.finished
    assert parser.response_id == "m1"
    assert seen == [
        BlockStart(0, REASONING),
        BlockDelta(0, "I will look it up."),
        BlockEnd(0),
        BlockStart(1, TOOL_CALL, "c1", "lookup"),
        BlockDelta(1, "{}"),
        BlockEnd(1),
        Finish("tool_calls"),
        Usage({"prompt_tokens": 12, "completion_tokens": 4, "total_tokens": 16}),
    ]


@pytest.mark.parametrize("reason", ["ERROR", "TIMEOUT"])
def test_a_cohere_answer_that_fails_after_it_began_is_an_in_band_error(reason: str) -> None:
    parser = CohereStreamParser()
    end = {"type": "message-end", "delta": {"finish_reason": reason, "error": "Overloaded"}}
    events, kind = parser.feed(frame(end))
    assert kind == "error"
    assert isinstance(events[0], StreamFailure)
    assert events[0].message == "Overloaded"


def test_a_mistral_error_object_mid_stream_is_an_in_band_error() -> None:
    parser = MistralStreamParser()
    error = {"object": "error", "message": "Overloaded", "type": "internal_server_error"}
    events, kind = parser.feed(frame(error))
    assert kind == "error"
    assert events == [
        StreamFailure("Overloaded", {"message": "Overloaded", "type": "internal_server_error"})
    ]
