"""No silent drops: a request parameter reaches the upstream in its own form, or is refused.

Every parameter a wire format cannot carry is a `400 unsupported_parameter` naming it and the
deployment, before anything is sent; with the alias's `drop_params: true` it is dropped instead
and the answer lists it in `X-Gateway-Dropped-Params` (gateway/providers/params.py). Driven end
to end: a real gateway over loopback, the fake upstreams of each wire format.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import aiohttp
import pytest

from gateway.errors import UpstreamHTTPError, UpstreamStreamError
from gateway.providers.anthropic_messages import AnthropicStreamParser, finish_reason
from gateway.providers.params import ANTHROPIC, Policy, anthropic_fields, responses_fields
from gateway.stream.events import Finish
from gateway.stream.sse import SSEFrame
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeServer, FakeUpstream, MakeServer, replay, sse, status
from tests.providers.upstreams import AnthropicServer, GeminiServer

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
ANSWER = ["Paris", "."]
FUNCTION = {"name": "f", "parameters": {"type": "object", "properties": {}}}

# The parameters each wire format cannot carry, with a value that asks for something.
ANTHROPIC_REFUSED: list[tuple[str, Any]] = [
    ("n", 2),
    ("seed", 7),
    ("logprobs", True),
    ("top_logprobs", 3),
    ("frequency_penalty", 0.5),
    ("presence_penalty", -0.5),
    ("logit_bias", {"50256": -100}),
    ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("prediction", {"type": "content", "content": "Paris."}),
    ("web_search_options", {"search_context_size": "low"}),
    ("functions", [FUNCTION]),
    ("function_call", "auto"),
    ("verbosity", "low"),
    ("prompt_cache_key", "tenant-1"),
    ("prompt_cache_retention", "24h"),
    ("service_tier", "flex"),
    ("reasoning_effort", "xhigh"),
]
RESPONSES_REFUSED: list[tuple[str, Any]] = [
    ("n", 2),
    ("seed", 7),
    ("stop", ["END"]),
    ("logprobs", True),
    ("top_logprobs", 2),
    ("frequency_penalty", 0.5),
    ("presence_penalty", 0.5),
    ("logit_bias", {"50256": -100}),
    ("modalities", ["text", "audio"]),
    ("audio", {"voice": "alloy", "format": "wav"}),
    ("prediction", {"type": "content", "content": "Paris."}),
    ("web_search_options", {}),
    ("functions", [FUNCTION]),
    ("function_call", "auto"),
    ("top_k", 5),
    ("thinking", {"type": "enabled", "budget_tokens": 2048}),
]
# What litellm says gemini-2.5-flash cannot take.
LITELLM_REFUSED: list[tuple[str, Any]] = [
    ("logit_bias", {"50256": -100}),
    ("top_logprobs", 2),
    ("prediction", {"type": "content", "content": "Paris."}),
    ("prompt_cache_key", "tenant-1"),
    ("top_k", 5),
]
LITELLM_SKIP = importlib.util.find_spec("litellm") is None


def alias(name: str, fake: FakeServer, *, drop: bool = False, **deployment: Any) -> dict[str, Any]:
    model: dict[str, Any] = {
        "name": name,
        "retry": {"max_attempts": 1},
        "deployments": [fake.deployment(name=f"{name}-upstream", **deployment)],
    }
    if drop:
        model["drop_params"] = True
    return model


async def post(
    gw: GatewayUnderTest, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> tuple[int, dict[str, str], Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + path, json=body) as response,
    ):
        raw = await response.read()
        if response.content_type == "application/json":
            return response.status, dict(response.headers), await response.json()
        return response.status, dict(response.headers), raw.decode()


def chat(model: str, **params: Any) -> dict[str, Any]:
    return {"model": model, "messages": QUESTION, "stream": True, **params}


async def assert_refused(
    gw: GatewayUnderTest, fake: FakeServer, model: str, name: str, value: Any
) -> None:
    status_, _, body = await post(gw, chat(model, **{name: value}))
    assert status_ == 400, (name, body)
    error = body["error"]
    assert error["code"] == "unsupported_parameter", error
    assert error["param"] == name
    assert error["type"] == "invalid_request_error"
    assert f"{model}-upstream" in error["message"] and "drop_params" in error["message"]
    assert fake.requests == []  # nothing was sent anywhere


async def assert_dropped(
    gw: GatewayUnderTest, fake: FakeServer, model: str, name: str, value: Any
) -> dict[str, Any]:
    status_, headers, text = await post(gw, chat(model, **{name: value}))
    assert status_ == 200, (name, text)
    assert headers["X-Gateway-Dropped-Params"] == name
    assert ANSWER[0] in text
    assert len(fake.requests) == 1
    return fake.requests[0]


# -- Anthropic -------------------------------------------------------------------------------


@pytest.fixture
async def anthropic(aiohttp_server: MakeServer) -> AnthropicServer:
    return await AnthropicServer().start(aiohttp_server)


@pytest.mark.parametrize(
    ("name", "value"), ANTHROPIC_REFUSED, ids=[c[0] for c in ANTHROPIC_REFUSED]
)
async def test_a_parameter_anthropic_cannot_carry_is_refused(
    make_gateway: MakeGateway, anthropic: AnthropicServer, name: str, value: Any
) -> None:
    gw = await make_gateway(models=[alias("claude", anthropic)])
    await assert_refused(gw, anthropic, "claude", name, value)


@pytest.mark.parametrize(
    ("name", "value"), ANTHROPIC_REFUSED, ids=[c[0] for c in ANTHROPIC_REFUSED]
)
async def test_drop_params_drops_it_for_anthropic_and_says_so(
    make_gateway: MakeGateway, anthropic: AnthropicServer, name: str, value: Any
) -> None:
    gw = await make_gateway(models=[alias("claude", anthropic, drop=True)])
    anthropic.text(ANSWER)
    sent = await assert_dropped(gw, anthropic, "claude", name, value)
    assert name not in sent
    if name == "service_tier":
        assert "service_tier" not in sent
    if name == "reasoning_effort":
        assert "thinking" not in sent


async def test_several_refused_parameters_are_named_and_all_dropped(
    make_gateway: MakeGateway, anthropic: AnthropicServer
) -> None:
    gw = await make_gateway(
        models=[alias("claude", anthropic), alias("loose", anthropic, drop=True)]
    )
    status_, _, body = await post(gw, chat("claude", seed=1, n=3, temperature=0.5))
    assert status_ == 400
    assert body["error"]["param"] == "seed"
    assert "'n'" in body["error"]["message"]
    anthropic.text(ANSWER)
    status_, headers, _ = await post(gw, chat("loose", seed=1, n=3, temperature=0.5))
    assert status_ == 200
    assert headers["X-Gateway-Dropped-Params"] == "seed, n"
    assert anthropic.requests[0]["temperature"] == 0.5


async def test_values_that_ask_for_nothing_pass_without_a_word(
    make_gateway: MakeGateway, anthropic: AnthropicServer
) -> None:
    gw = await make_gateway(models=[alias("claude", anthropic)])
    anthropic.text(ANSWER)
    defaults = {
        "n": 1,
        "logprobs": False,
        "top_logprobs": 0,
        "frequency_penalty": 0,
        "presence_penalty": 0.0,
        "logit_bias": {},
        "seed": None,
        "modalities": ["text"],
        "response_format": {"type": "text"},
        "store": True,  # the gateway records every turn
        "metadata": {"app": "test"},  # recorded with the turn
        "stream_options": {"include_usage": False},
    }
    status_, headers, text = await post(gw, chat("claude", **defaults))
    assert status_ == 200, text
    assert "X-Gateway-Dropped-Params" not in headers


async def test_anthropic_takes_its_own_forms(
    make_gateway: MakeGateway, anthropic: AnthropicServer
) -> None:
    """`service_tier`, `safety_identifier` and `top_k` reach Anthropic in its own names."""
    gw = await make_gateway(models=[alias("claude", anthropic)])
    anthropic.text(ANSWER)
    anthropic.text(ANSWER)
    params = {"service_tier": "default", "safety_identifier": "hash-1", "top_k": 5}
    assert (await post(gw, chat("claude", **params)))[0] == 200
    sent = anthropic.requests[0]
    assert sent["service_tier"] == "standard_only"
    assert sent["metadata"] == {"user_id": "hash-1"}
    assert sent["top_k"] == 5
    # `user` says it first; `auto` is Anthropic's too.
    params = {"service_tier": "auto", "safety_identifier": "hash-1", "user": "u-1"}
    assert (await post(gw, chat("claude", **params)))[0] == 200
    assert anthropic.requests[1]["service_tier"] == "auto"
    assert anthropic.requests[1]["metadata"] == {"user_id": "u-1"}


async def test_a_responses_client_is_refused_in_openai_shape(
    make_gateway: MakeGateway, anthropic: AnthropicServer
) -> None:
    gw = await make_gateway(models=[alias("claude", anthropic)])
    body = {"model": "claude", "input": "Hi", "prompt_cache_key": "tenant-1"}
    status_, _, answer = await post(gw, body, "/v1/responses")
    assert status_ == 400
    assert answer["error"]["code"] == "unsupported_parameter"
    assert answer["error"]["param"] == "prompt_cache_key"
    assert anthropic.requests == []


# -- the plan ------------------------------------------------------------------------------------


async def test_a_plan_is_checked_whole_before_the_first_attempt(
    make_gateway: MakeGateway, make_upstream: Any, anthropic: AnthropicServer
) -> None:
    """The primary could take `seed`, its fallback could not: refused before either is tried,
    naming the fallback, so a retry never lands where the parameter would be lost. Under
    `drop_params` the primary gets it, and the fallback, when it answers, gets it dropped."""
    openai = await make_upstream()

    def model(name: str, drop: bool) -> dict[str, Any]:
        return {
            "name": name,
            "drop_params": drop,
            "retry": {"max_attempts": 2, "backoff_s": 0},
            "deployments": [
                openai.deployment(name=f"{name}-openai", priority=0),
                anthropic.deployment(name=f"{name}-anthropic", priority=1),
            ],
        }

    gw = await make_gateway(models=[model("strict", False), model("loose", True)])
    status_, _, body = await post(gw, chat("strict", seed=7))
    assert status_ == 400
    assert "'strict-anthropic'" in body["error"]["message"]
    assert openai.requests == [] and anthropic.requests == []

    status_, headers, _ = await post(gw, chat("loose", seed=7))
    assert status_ == 200
    assert headers["X-Gateway-Deployment"] == "loose-openai"
    assert "X-Gateway-Dropped-Params" not in headers
    assert openai.requests[-1]["seed"] == 7

    openai.push(status(503, {"error": {"message": "busy", "type": "server_error"}}))
    anthropic.text(ANSWER)
    status_, headers, _ = await post(gw, chat("loose", seed=7))
    assert status_ == 200
    assert headers["X-Gateway-Deployment"] == "loose-anthropic"
    assert headers["X-Gateway-Dropped-Params"] == "seed"
    assert "seed" not in anthropic.requests[-1]


async def test_a_refused_request_records_nothing(
    make_gateway: MakeGateway, anthropic: AnthropicServer
) -> None:
    """Bad input changes nothing: the 400 comes before the turn begins."""
    gw = await make_gateway(models=[alias("claude", anthropic)])
    status_, headers, _ = await post(gw, chat("claude", seed=7))
    assert status_ == 400
    assert "X-Conversation-Id" not in headers
    await gw.flush()
    assert gw.query("SELECT COUNT(*) FROM turns") == [(0,)]
    assert gw.query("SELECT COUNT(*) FROM conversations") == [(0,)]
    assert anthropic.requests == []


# -- a native Responses upstream ---------------------------------------------------------------


@pytest.fixture
async def responses(make_upstream: Any) -> FakeUpstream:
    fake: FakeUpstream = await make_upstream()
    return fake


@pytest.mark.parametrize(
    ("name", "value"), RESPONSES_REFUSED, ids=[c[0] for c in RESPONSES_REFUSED]
)
async def test_a_parameter_the_responses_api_cannot_carry_is_refused_or_dropped(
    make_gateway: MakeGateway, responses: FakeUpstream, name: str, value: Any
) -> None:
    gw = await make_gateway(
        models=[
            alias("gpt", responses, api="responses"),
            alias("loose", responses, api="responses", drop=True),
        ]
    )
    await assert_refused(gw, responses, "gpt", name, value)
    responses.push(replay("openai-responses-text-function-call.sse"))
    status_, headers, _ = await post(gw, chat("loose", **{name: value}))
    assert status_ == 200
    assert headers["X-Gateway-Dropped-Params"] == name


async def test_the_responses_api_takes_its_own_forms(
    make_gateway: MakeGateway, responses: FakeUpstream
) -> None:
    gw = await make_gateway(models=[alias("gpt", responses, api="responses")])
    responses.push(replay("openai-responses-text-function-call.sse"))
    schema = {"name": "capital", "schema": {"type": "object"}, "strict": True}
    params = {
        "response_format": {"type": "json_schema", "json_schema": schema},
        "verbosity": "low",
        "service_tier": "flex",
        "prompt_cache_key": "tenant-1",
        "safety_identifier": "hash-1",
        "max_completion_tokens": 99,
        "metadata": {"app": "test"},
    }
    assert (await post(gw, chat("gpt", **params)))[0] == 200
    sent = responses.requests[0]
    assert sent["text"] == {"format": {"type": "json_schema", **schema}, "verbosity": "low"}
    assert (sent["service_tier"], sent["prompt_cache_key"]) == ("flex", "tenant-1")
    assert sent["safety_identifier"] == "hash-1"
    assert sent["max_output_tokens"] == 99
    assert sent["metadata"] == {"app": "test"}


# -- litellm -----------------------------------------------------------------------------------


@pytest.fixture
async def gemini(aiohttp_server: MakeServer, monkeypatch: pytest.MonkeyPatch) -> GeminiServer:
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    return await GeminiServer().start(aiohttp_server)


@pytest.mark.skipif(LITELLM_SKIP, reason="litellm is not installed")
@pytest.mark.filterwarnings(r"ignore::DeprecationWarning:litellm\.")
@pytest.mark.parametrize(("name", "value"), LITELLM_REFUSED, ids=[c[0] for c in LITELLM_REFUSED])
async def test_a_parameter_litellm_cannot_map_is_refused_or_dropped(
    make_gateway: MakeGateway, gemini: GeminiServer, name: str, value: Any
) -> None:
    gw = await make_gateway(models=[alias("g", gemini), alias("loose", gemini, drop=True)])
    await assert_refused(gw, gemini, "g", name, value)
    gemini.text(ANSWER)
    await assert_dropped(gw, gemini, "loose", name, value)


# -- the policy itself -------------------------------------------------------------------------


def test_fields_no_api_has_are_never_refused() -> None:
    """A field that is no OpenAI parameter goes to OpenAI-compatible upstreams only; it is not
    the client's to steer an adapter with (tests/security/test_api_base.py)."""
    body = {"model": "m", "messages": QUESTION, "api_base": "http://evil", "litellm_params": {}}
    assert Policy("anthropic", ANTHROPIC).refused(body) == []


def test_mapped_fields() -> None:
    assert anthropic_fields({"service_tier": "priority"}) == {}
    assert responses_fields({"response_format": {"type": "json_object"}}) == {
        "text": {"format": {"type": "json_object"}}
    }
    assert responses_fields({"response_format": {"type": "text"}}) == {}


# -- stop reasons and error types in the client's own set -----------------------------------------


@pytest.mark.parametrize(
    ("stop", "finish"),
    [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("refusal", "content_filter"),
        ("pause_turn", "stop"),
        ("a_reason_from_the_future", "stop"),
    ],
)
def test_anthropic_stop_reasons_become_openai_finish_reasons(stop: str, finish: str) -> None:
    assert finish_reason(stop) == finish
    frame = {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {}}
    parser = AnthropicStreamParser()
    events, _ = parser.feed(SSEFrame(event="message_delta", data=sse_data(frame), raw=b""))
    assert Finish(finish) in events


def sse_data(obj: dict[str, Any]) -> str:
    return sse(obj).decode().removeprefix("data: ").strip()


async def test_an_openai_client_gets_openai_error_types(
    make_gateway: MakeGateway, anthropic: AnthropicServer
) -> None:
    """Anthropic's `overloaded_error` reaches an OpenAI client as `server_error` (its `code`
    keeps `overloaded`); an Anthropic client still gets Anthropic's own type."""
    gw = await make_gateway(models=[alias("claude", anthropic)])
    anthropic.http_error(529, "Overloaded")
    status_, _, body = await post(gw, chat("claude"))
    assert status_ == 529
    assert (body["error"]["type"], body["error"]["code"]) == ("server_error", "overloaded")
    anthropic.http_error(529, "Overloaded")
    message = {"model": "claude", "max_tokens": 50, "messages": QUESTION}
    status_, _, body = await post(gw, message, "/v1/messages")
    assert body["error"]["type"] == "overloaded_error"
    error = UpstreamStreamError("busy", upstream={"type": "api_error", "status_code": 500})
    assert error.to_openai()["error"]["type"] == "server_error"
    assert UpstreamHTTPError(500, "boom").to_openai()["error"]["type"] == "upstream_error"


# -- Responses parameters, in chat's names and then each wire's -----------------------------------

RESPONSES_PARAMS = {
    "max_output_tokens": 300,
    "metadata": {"app": "test"},
    "service_tier": "default",
    "prompt_cache_key": "tenant-1",
    "safety_identifier": "hash-1",
    "top_logprobs": 2,
    "store": False,
    "text": {"verbosity": "low"},
}


async def test_responses_parameters_reach_a_chat_upstream_in_chat_names(
    make_gateway: MakeGateway, responses: FakeUpstream
) -> None:
    gw = await make_gateway(models=[alias("gpt", responses)])
    body = {"model": "gpt", "input": "Hi", "stream": True, **RESPONSES_PARAMS}
    status_, _, text = await post(gw, body, "/v1/responses")
    assert status_ == 200, text
    sent = responses.requests[0]
    assert sent["max_completion_tokens"] == 300  # o-series and gpt-5 refuse `max_tokens`
    assert "max_tokens" not in sent
    assert sent["metadata"] == {"app": "test"} and sent["store"] is False
    assert (sent["service_tier"], sent["prompt_cache_key"]) == ("default", "tenant-1")
    assert sent["safety_identifier"] == "hash-1"
    assert (sent["logprobs"], sent["top_logprobs"]) == (True, 2)
    assert sent["verbosity"] == "low"


async def test_a_responses_client_names_store_only_when_it_said_so(
    make_gateway: MakeGateway, responses: FakeUpstream
) -> None:
    gw = await make_gateway(models=[alias("gpt", responses)])
    assert (await post(gw, {"model": "gpt", "input": "Hi", "stream": True}, "/v1/responses"))[0]
    assert "store" not in responses.requests[0] and "metadata" not in responses.requests[0]
    body = {"model": "gpt", "input": "Hi", "stream": True, "metadata": {"app": "x"}}
    assert (await post(gw, body, "/v1/responses"))[0] == 200
    # OpenAI keeps metadata only on a stored completion; a Response is stored unless told not.
    assert responses.requests[1]["store"] is True


async def test_responses_parameters_reach_anthropic_in_its_names(
    make_gateway: MakeGateway, anthropic: AnthropicServer
) -> None:
    gw = await make_gateway(models=[alias("claude", anthropic)])
    anthropic.text(ANSWER)
    params = {k: RESPONSES_PARAMS[k] for k in ("max_output_tokens", "service_tier", "store")}
    body = {"model": "claude", "input": "Hi", "stream": True, "safety_identifier": "hash-1"}
    status_, _, text = await post(gw, {**body, **params, "metadata": {"a": "b"}}, "/v1/responses")
    assert status_ == 200, text
    sent = anthropic.requests[0]
    assert sent["max_tokens"] == 300
    assert sent["service_tier"] == "standard_only"
    assert sent["metadata"] == {"user_id": "hash-1"}
    # Chat's names for them: `top_logprobs` asks for `logprobs`, `text.verbosity` is `verbosity`.
    refused = {
        "top_logprobs": "logprobs",
        "prompt_cache_key": "prompt_cache_key",
        "text": "verbosity",
    }
    for name, param in refused.items():
        status_, _, answer = await post(gw, {**body, name: RESPONSES_PARAMS[name]}, "/v1/responses")
        assert (status_, answer["error"]["param"]) == (400, param)
    assert len(anthropic.requests) == 1
