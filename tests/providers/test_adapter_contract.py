"""The adapter contract: every upstream adapter looks the same to an OpenAI client and the record.

Each case runs end to end over every adapter: the real `openai` SDK (AsyncOpenAI) talks to the
gateway (a real aiohttp server), which talks over loopback to a fake upstream speaking the
adapter's own wire format (tests/fakes.py, tests/providers/upstreams.py): OpenAI-compatible chat
completions, Azure OpenAI, Anthropic Messages and, when the litellm adapter is there, through
litellm: the Gemini API, Vertex AI's Gemini and Anthropic endpoints, Bedrock (Converse, AWS
event-stream framing, SigV4), and, configured as litellm models but spoken by the gateway itself
(gateway/providers/native_routes.py), Groq, Mistral and Cohere's v2 chat. Each case asserts on
what the client received and on what the gateway recorded.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import openai
import pytest
from _pytest.mark import ParameterSet
from openai import AsyncStream
from openai.types import CompletionUsage
from openai.types.chat import ChatCompletionChunk, ChatCompletionMessageParam

import gateway.providers
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import COMPLETION_TOKENS, PROMPT_TOKENS, FakeServer, MakeServer
from tests.providers.upstreams import SERVERS

ALIAS = "m"
QUESTION_TEXT = "What is the capital of France?"
QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": QUESTION_TEXT}]
ANSWER = ["The capital", " of France", " is Paris."]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_capital",
            "parameters": {"type": "object", "properties": {"country": {"type": "string"}}},
        },
    }
]
FAILED = ["user/message", "assistant/attempt", "request/error", "turn/end"]
ANSWERED = ["user/message", "assistant/message", "turn/end"]


def _litellm_skip_reason() -> str | None:
    adapter = Path(gateway.providers.__file__).with_name("litellm_adapter.py")
    if not adapter.exists():
        return "gateway/providers/litellm_adapter.py does not exist"
    if importlib.util.find_spec("litellm") is None:
        return "litellm is not installed"
    return None


LITELLM_SKIP = _litellm_skip_reason()


def adapters(**xfail: str) -> list[ParameterSet]:
    """Every adapter as a `fake` parameter; `xfail` maps an adapter to the bug it hits (the
    gateway's, or litellm's for a provider reached through it)."""
    params = []
    for name in SERVERS:
        marks: list[pytest.MarkDecorator] = []
        if SERVERS[name].provider == "litellm" and LITELLM_SKIP:
            marks.append(pytest.mark.skip(reason=LITELLM_SKIP))
        if name in xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=xfail[name]))
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.fixture
async def fake(
    request: pytest.FixtureRequest, aiohttp_server: MakeServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[FakeServer]:
    """The fake upstream for the adapter named by the test's parameter, already listening."""
    name: str = request.param
    if SERVERS[name].provider == "litellm":
        # Keep litellm offline: its price list otherwise comes from the network at import.
        monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
        try:
            importlib.import_module("litellm")
        except Exception as exc:  # an install that cannot import is a skip, not a failure
            pytest.skip(f"import litellm failed: {exc!r}")
    server = await SERVERS[name]().start(aiohttp_server)
    yield server
    # A script still waiting to be let go (a case that failed before its client read what lets
    # it go) goes on now, so that the server closes at once rather than after its shutdown
    # timeout.
    server.release.set()


async def start_gateway(
    make_gateway: MakeGateway, fake: FakeServer, **deployment: Any
) -> GatewayUnderTest:
    """A gateway whose alias `m` has one attempt and one deployment: the fake."""
    return await make_gateway(
        models=[
            {
                "name": ALIAS,
                "retry": {"max_attempts": 1},
                "deployments": [fake.deployment(**deployment)],
            }
        ]
    )


@dataclass
class ClientView:
    """What the SDK client assembled from one streamed answer."""

    conversation_id: str
    text: str = ""
    reasoning: str = ""
    tool_calls: dict[int, dict[str, str]] = field(default_factory=dict)
    finish_reason: str | None = None
    usage: CompletionUsage | None = None
    error: openai.APIError | None = None  # the stream raised it after the content above

    def add(self, chunk: ChatCompletionChunk) -> None:
        if chunk.usage is not None:
            self.usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            self.text += delta.content or ""
            self.reasoning += getattr(delta, "reasoning_content", None) or ""
            for call in delta.tool_calls or ():
                seen = self.tool_calls.setdefault(
                    call.index, {"id": "", "name": "", "arguments": ""}
                )
                seen["id"] = call.id or seen["id"]
                if call.function is not None:
                    seen["name"] = call.function.name or seen["name"]
                    seen["arguments"] += call.function.arguments or ""
            self.finish_reason = choice.finish_reason or self.finish_reason


async def stream_chat(
    gw: GatewayUnderTest, *, on_text: Callable[[str], bool] | None = None, **params: Any
) -> ClientView:
    """Stream one answer with the real SDK. After each chunk `on_text` gets the text so far;
    when it returns True the client stops reading and closes the stream (a cancel)."""
    response = await gw.client().chat.completions.with_raw_response.create(
        model=ALIAS, messages=QUESTION, stream=True, **params
    )
    view = ClientView(response.headers["X-Conversation-Id"])
    stream = cast(AsyncStream[ChatCompletionChunk], response.parse())
    try:
        async for chunk in stream:
            view.add(chunk)
            if on_text is not None and on_text(view.text):
                break
    except openai.APIError as error:
        view.error = error
    await stream.close()
    return view


def kinds(events: list[dict[str, Any]]) -> list[str]:
    return [e["type"] for e in events]


# -- the request -----------------------------------------------------------------------------


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_the_request_reaches_the_upstream_in_its_own_wire_format(
    make_gateway: MakeGateway, fake: FakeServer
) -> None:
    """The upstream gets one streaming request at its own URL, with its own auth header and
    model name, carrying the client's question."""
    gw = await start_gateway(make_gateway, fake)
    fake.text(ANSWER)
    await stream_chat(gw)
    assert len(fake.requests) == 1
    fake.check_request(fake.seen[0], fake.requests[0])
    assert fake.question(fake.requests[0]) == QUESTION_TEXT


# -- answers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_streamed_text(make_gateway: MakeGateway, fake: FakeServer) -> None:
    """The client assembles exactly the text the upstream sent, finished with "stop", and no
    usage chunk it did not ask for; the record holds that text as one text block."""
    gw = await start_gateway(make_gateway, fake)
    fake.text(ANSWER)
    view = await stream_chat(gw)
    assert view.error is None
    assert view.text == "".join(ANSWER)
    assert view.finish_reason == "stop"
    assert view.usage is None

    events = await gw.wait_turn_end(view.conversation_id)
    assert kinds(events) == ANSWERED
    message = events[1]["payload"]
    assert message["content"] == [{"type": "text", "text": "".join(ANSWER)}]
    assert message["finish_reason"] == "stop"
    assert message["interrupted"] is False
    assert events[2]["payload"]["status"] == "completed"


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_reasoning_reaches_the_client_as_reasoning_content(
    make_gateway: MakeGateway, fake: FakeServer
) -> None:
    """The upstream's reasoning (OpenAI-compatible `reasoning_content`, Anthropic `thinking`,
    Gemini thoughts) reaches the client as `reasoning_content` deltas, apart from the text; the
    record holds a "reasoning" block (with its signature, where the format has one) then the
    text block."""
    gw = await start_gateway(make_gateway, fake)
    reasoning = ["The user asks", " about France;", " that is Paris."]
    fake.reasoning_then_text(reasoning, ANSWER)
    view = await stream_chat(gw, reasoning_effort="low")
    assert view.error is None
    assert view.reasoning == "".join(reasoning)
    assert view.text == "".join(ANSWER)
    assert view.finish_reason == "stop"

    events = await gw.wait_turn_end(view.conversation_id)
    assert kinds(events) == ANSWERED
    expected_reasoning: dict[str, Any] = {"type": "reasoning", "text": "".join(reasoning)}
    if fake.reasoning_signature is not None:
        expected_reasoning["signature"] = fake.reasoning_signature
    assert events[1]["payload"]["content"] == [
        expected_reasoning,
        {"type": "text", "text": "".join(ANSWER)},
    ]
    assert events[1]["payload"]["finish_reason"] == "stop"


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_tool_call(make_gateway: MakeGateway, fake: FakeServer) -> None:
    """A tool call reaches the client with its id, name and the arguments assembled, finished
    with "tool_calls"; the record holds one tool_call block with the same id, name and
    arguments."""
    gw = await start_gateway(make_gateway, fake)
    arg_parts = ['{"coun', 'try": "Fr', 'ance"}']
    fake.tool_call("call_7Qx", "lookup_capital", arg_parts)
    view = await stream_chat(gw, tools=TOOLS)
    assert view.error is None
    assert view.text == ""
    assert list(view.tool_calls.values()) == [
        {"id": "call_7Qx", "name": "lookup_capital", "arguments": view.tool_calls[0]["arguments"]}
    ]
    assert json.loads(view.tool_calls[0]["arguments"]) == {"country": "France"}
    assert view.finish_reason == "tool_calls"

    events = await gw.wait_turn_end(view.conversation_id)
    assert kinds(events) == ANSWERED
    message = events[1]["payload"]
    assert message["content"] == [
        {
            "type": "tool_call",
            "id": "call_7Qx",
            "name": "lookup_capital",
            "arguments": view.tool_calls[0]["arguments"],
        }
    ]
    assert message["finish_reason"] == "tool_calls"


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_usage(make_gateway: MakeGateway, fake: FakeServer) -> None:
    """With `stream_options.include_usage` the client gets a usage chunk with the prompt and
    completion tokens the upstream reported (Anthropic's input/output tokens under OpenAI's
    names); the recorded message carries the same counts."""
    gw = await start_gateway(make_gateway, fake)
    fake.text(ANSWER)
    view = await stream_chat(gw, stream_options={"include_usage": True})
    assert view.error is None
    assert view.text == "".join(ANSWER)
    assert view.usage is not None
    assert (view.usage.prompt_tokens, view.usage.completion_tokens) == (
        PROMPT_TOKENS,
        COMPLETION_TOKENS,
    )
    assert view.usage.total_tokens == PROMPT_TOKENS + COMPLETION_TOKENS

    events = await gw.wait_turn_end(view.conversation_id)
    usage = events[1]["payload"]["usage"]
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
        PROMPT_TOKENS,
        COMPLETION_TOKENS,
    )
    assert events[2]["payload"]["usage"]["total_tokens"] == PROMPT_TOKENS + COMPLETION_TOKENS


# -- failures ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "error_class", "retryable"),
    [(500, openai.InternalServerError, True), (400, openai.BadRequestError, False)],
)
@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_http_error_before_streaming(
    make_gateway: MakeGateway,
    fake: FakeServer,
    code: int,
    error_class: type[openai.APIStatusError],
    retryable: bool,
) -> None:
    """An HTTP error status before any stream reaches the client with that status as an
    OpenAI-shaped error carrying the provider's message; the record is a failed attempt, the
    request error (retryable for a 500, not for a 400) and an errored turn."""
    gw = await start_gateway(make_gateway, fake)
    fake.http_error(code, "the upstream says no")
    with pytest.raises(error_class) as caught:
        await stream_chat(gw)
    error = caught.value
    assert error.status_code == code
    assert isinstance(error.body, dict)
    assert "the upstream says no" in error.body["message"]
    assert {"message", "type", "code"} <= error.body.keys()

    events = await gw.wait_turn_end(error.response.headers["X-Conversation-Id"])
    assert kinds(events) == FAILED
    assert events[1]["payload"]["reason"] == "provider_error"
    assert events[2]["payload"]["status"] == code
    assert events[2]["payload"]["retryable"] is retryable
    assert events[3]["payload"]["status"] == "error"
    assert events[3]["payload"]["reason"] == "provider_error"


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_error_event_mid_stream(make_gateway: MakeGateway, fake: FakeServer) -> None:
    """An in-band error after some content (an OpenAI-compatible `{"error": ...}` chunk,
    Anthropic's `event: error`) reaches the client as an `APIError` raised by its stream after
    that content; the record is a failed attempt with reason "provider_error"."""
    gw = await start_gateway(make_gateway, fake)
    fake.error_mid_stream(ANSWER[:2], "Overloaded")
    view = await stream_chat(gw)
    assert view.text == "".join(ANSWER[:2])
    assert isinstance(view.error, openai.APIError)
    assert "Overloaded" in view.error.message

    events = await gw.wait_turn_end(view.conversation_id)
    assert kinds(events) == FAILED
    assert events[1]["payload"]["reason"] == "provider_error"
    assert events[3]["payload"]["status"] == "error"


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_cut_connection_mid_stream(make_gateway: MakeGateway, fake: FakeServer) -> None:
    """The upstream's connection is cut (TCP abort) once the client has read some content: the
    client's stream raises `APIError` after that content; the record is a failed attempt with
    reason "provider_error"."""
    gw = await start_gateway(make_gateway, fake)
    fake.cut_after(ANSWER[:2])

    def cut_when_read(text: str) -> bool:
        if text == "".join(ANSWER[:2]):
            fake.release.set()
        return False

    view = await stream_chat(gw, on_text=cut_when_read)
    assert fake.release.is_set()
    assert view.text == "".join(ANSWER[:2])
    assert isinstance(view.error, openai.APIError)

    events = await gw.wait_turn_end(view.conversation_id)
    assert kinds(events) == FAILED
    assert events[1]["payload"]["reason"] == "provider_error"
    assert events[3]["payload"]["status"] == "error"


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_stall_mid_stream_hits_the_idle_timeout(
    make_gateway: MakeGateway, fake: FakeServer
) -> None:
    """An upstream that goes quiet after some content for longer than the deployment's
    `timeouts.idle_s`: the client's stream ends with an error coded `upstream_timeout_idle`
    after that content, the upstream sees its connection closed, and the turn ends in a
    timeout."""
    gw = await start_gateway(make_gateway, fake, timeouts={"idle_s": 0.3})
    fake.stall_after(ANSWER[:2])
    view = await stream_chat(gw)
    assert view.text == "".join(ANSWER[:2])
    assert isinstance(view.error, openai.APIError)
    assert view.error.code == "upstream_timeout_idle"
    await asyncio.wait_for(fake.disconnected.wait(), 5)

    events = await gw.wait_turn_end(view.conversation_id)
    assert kinds(events) == FAILED
    assert events[1]["payload"]["reason"] == "provider_error"
    assert events[2]["payload"]["code"] == "upstream_timeout_idle"
    assert events[3]["payload"]["status"] == "error"
    assert events[3]["payload"]["reason"] == "timeout"


@pytest.mark.parametrize("fake", adapters(), indirect=True)
async def test_client_cancel_mid_stream(make_gateway: MakeGateway, fake: FakeServer) -> None:
    """A client that reads everything the upstream sent before it went quiet, then closes its
    stream: the upstream sees the disconnect, and the record is an interrupted assistant
    message holding exactly the text the client read."""
    gw = await start_gateway(make_gateway, fake)
    fake.stall_after(ANSWER[:2])
    sent = "".join(ANSWER[:2])
    view = await stream_chat(gw, on_text=lambda text: text == sent)
    assert view.error is None
    assert view.text == sent
    await asyncio.wait_for(fake.disconnected.wait(), 5)

    events = await gw.wait_turn_end(view.conversation_id)
    assert kinds(events) == ANSWERED
    message = events[1]["payload"]
    assert message["interrupted"] is True
    assert message["content"] == [{"type": "text", "text": sent}]
    assert events[2]["payload"]["status"] == "aborted"
    assert events[2]["payload"]["reason"] == "client_disconnect"
