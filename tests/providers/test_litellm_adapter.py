"""The litellm adapter against a fake Gemini API on loopback (litellm's `gemini/` provider).

Gemini's wire format is nothing like OpenAI's, so these tests prove the whole way round: the
OpenAI body goes through litellm's translation to a real HTTP request, and Gemini's SSE or JSON
comes back as OpenAI chat SSE or a `chat.completion` that the gateway's own parsers read.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import orjson
import pytest
from aiohttp.test_utils import TestServer

from gateway.config import DeploymentConfig, TimeoutsConfig
from gateway.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamStreamError,
    UpstreamTimeout,
)
from gateway.providers.litellm_adapter import (
    LITELLM_LOGGERS,
    LiteLLMProvider,
    LiteLLMStreamResponse,
)
from gateway.providers.openai_chat import ChatStreamParser, parse_completion
from gateway.stream.assembler import BlockAssembler
from gateway.stream.sse import SSEDecoder
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes_gemini import (
    KEY,
    MODEL,
    TEXT_CHUNKS,
    FakeGemini,
    cut_after,
    failing,
    function_call,
    google_error,
    response,
    stalled,
    stream_of,
    text,
    thought,
    usage,
    whole,
)

# litellm's own deprecation warnings (its Pydantic usage) are not this adapter's.
pytestmark = pytest.mark.filterwarnings(r"ignore::DeprecationWarning:litellm\.")

BODY: dict[str, Any] = {
    "model": "alias",
    "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Say hello"},
    ],
    "temperature": 0.2,
    "max_tokens": 64,
}


@pytest.fixture
async def fake(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> FakeGemini:
    fake = FakeGemini()
    server = await aiohttp_server(fake.app())
    fake.url = str(server.make_url("/v1beta"))
    return fake


def provider(
    api_base: str,
    *,
    key: str = KEY,
    model: str = f"gemini/{MODEL}",
    extra_headers: dict[str, str] | None = None,
    **timeouts: float,
) -> LiteLLMProvider:
    # model_construct: independent of the config schema's validation of the `litellm` provider.
    config = DeploymentConfig.model_construct(
        provider="litellm",
        model=model,
        api_base=api_base,
        api_key=key or None,
        name=None,
        timeouts=TimeoutsConfig(**timeouts),
        extra_headers=extra_headers or {},
    )
    return LiteLLMProvider(config, model)


async def read_all(upstream: Any) -> bytes:
    parts = []
    while piece := await upstream.read():
        parts.append(piece)
    upstream.close()
    return b"".join(parts)


def chunks_of(raw: bytes) -> list[dict[str, Any] | str]:
    """The `data:` payloads of an SSE body, JSON-decoded except `[DONE]`."""
    decoder = SSEDecoder()
    frames = decoder.feed(raw) + decoder.flush()
    assert all(f.complete for f in frames)
    out: list[dict[str, Any] | str] = []
    for f in frames:
        assert f.data is not None
        out.append("[DONE]" if f.data == "[DONE]" else orjson.loads(f.data))
    return out


def assemble(raw: bytes) -> tuple[BlockAssembler, ChatStreamParser]:
    decoder = SSEDecoder()
    parser = ChatStreamParser()
    assembler = BlockAssembler()
    for f in decoder.feed(raw) + decoder.flush():
        events, kind = parser.feed(f)
        assert kind != "error"
        for event in events:
            assembler.feed(event)
    return assembler, parser


# -- streaming -----------------------------------------------------------------------------------


async def test_stream_arrives_as_openai_chat_sse(fake: FakeGemini) -> None:
    upstream = await provider(fake.url).chat(BODY, stream=True)
    assert upstream.usage_injected is True
    raw = await read_all(upstream)

    chunks = chunks_of(raw)
    assert chunks[-1] == "[DONE]"
    objects = [c for c in chunks if isinstance(c, dict)]
    for obj in objects:
        assert obj["object"] == "chat.completion.chunk"
        # What the OpenAI SDK builds from each frame, strictly validated.
        openai.types.chat.ChatCompletionChunk.model_validate(obj, strict=False)
        assert not any(k.startswith("vertex_ai") for k in obj)  # litellm's extras left out
    # The usage comes alone at the end, as OpenAI sends it, so the pipeline can hold it back.
    assert objects[-1]["choices"] == []
    assert objects[-1]["usage"]["prompt_tokens"] == 5
    assert objects[-1]["usage"]["completion_tokens"] == 4
    assert objects[-1]["usage"]["total_tokens"] == 9
    assert all("usage" not in obj for obj in objects[:-1])

    assembler, parser = assemble(raw)
    assert parser.done and parser.finished
    assert [b.to_content() for b in assembler.blocks()] == [
        {"type": "text", "text": "Hello, world!"}
    ]
    assert assembler.finish_reason == "stop"
    assert assembler.usage is not None and assembler.usage["prompt_tokens"] == 5

    # litellm translated the OpenAI body into Gemini's request.
    [seen] = fake.requests
    assert seen.path == f"/v1beta/models/{MODEL}:streamGenerateContent"
    assert seen.query == {"alt": "sse"}
    assert seen.headers["x-goog-api-key"] == KEY
    assert seen.body["contents"][-1]["role"] == "user"
    assert seen.body["contents"][-1]["parts"][-1] == {"text": "Say hello"}
    assert seen.body["generationConfig"]["temperature"] == 0.2
    assert seen.body["generationConfig"]["max_output_tokens"] == 64


async def test_litellm_logs_through_the_gateways_handlers_from_warning_up(
    fake: FakeGemini, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """litellm's own handler wrote a "LiteLLM completion() model=..." line per request in its
    own format (and the gateway's log had it again): its loggers now keep WARNING and up, and
    write only through the gateway's handlers."""
    caplog.set_level(logging.INFO)
    await read_all(await provider(fake.url).chat(BODY, stream=True))
    assert not [r for r in caplog.records if r.name in LITELLM_LOGGERS]
    assert "LiteLLM completion()" not in "".join(capsys.readouterr())
    for name in LITELLM_LOGGERS:
        assert logging.getLogger(name).handlers == []
        assert logging.getLogger(name).getEffectiveLevel() == logging.WARNING


async def test_usage_asked_for_by_the_client_is_not_injected(fake: FakeGemini) -> None:
    body = {**BODY, "stream_options": {"include_usage": True}}
    upstream = await provider(fake.url).chat(body, stream=True)
    assert upstream.usage_injected is False
    raw = await read_all(upstream)
    assert assemble(raw)[0].usage is not None


async def test_extra_headers_reach_the_provider(fake: FakeGemini) -> None:
    upstream = await provider(fake.url, extra_headers={"x-goog-user-project": "p-1"}).chat(
        BODY, stream=True
    )
    await read_all(upstream)
    assert fake.requests[0].headers["x-goog-user-project"] == "p-1"


async def test_only_openai_parameters_are_forwarded(fake: FakeGemini) -> None:
    body = {**BODY, "stop": ["END"], "metadata": {"x": 1}, "litellm_params": {"y": 2}}
    await read_all(await provider(fake.url).chat(body, stream=False))
    sent = fake.requests[0].body
    assert sent["generationConfig"]["stop_sequences"] == ["END"]
    assert "metadata" not in orjson.dumps(sent).decode()


async def test_reasoning_and_text_stream_as_separate_blocks(fake: FakeGemini) -> None:
    fake.push(
        stream_of(
            [
                response(thought("Greeting: "), usage_metadata=usage(5, 0, thoughts=3)),
                response(thought("keep it short."), usage_metadata=usage(5, 0, thoughts=6)),
                response(text("Hi!"), finish="STOP", usage_metadata=usage(5, 2, thoughts=6)),
            ]
        )
    )
    raw = await read_all(await provider(fake.url).chat(BODY, stream=True))
    assembler, _ = assemble(raw)
    assert [b.to_content() for b in assembler.blocks()][-1] == {"type": "text", "text": "Hi!"}
    kinds = [b.kind for b in assembler.blocks()]
    assert kinds[0] == "reasoning" and kinds[-1] == "text"
    reasoning = "".join(
        c["choices"][0]["delta"].get("reasoning_content", "")
        for c in chunks_of(raw)
        if isinstance(c, dict) and c["choices"]
    )
    assert reasoning == "Greeting: keep it short."
    assert assembler.finish_reason == "stop"


async def test_a_function_call_streams_as_an_indexed_tool_call(fake: FakeGemini) -> None:
    fake.push(
        stream_of(
            [
                response(
                    function_call("get_weather", {"city": "Paris"}), usage_metadata=usage(9, 5)
                ),
                response(text(""), finish="STOP", usage_metadata=usage(9, 5)),
            ]
        )
    )
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    upstream = await provider(fake.url).chat({**BODY, "tools": tools}, stream=True)
    raw = await read_all(upstream)
    calls = [
        call
        for c in chunks_of(raw)
        if isinstance(c, dict) and c["choices"]
        for call in c["choices"][0]["delta"].get("tool_calls", ())
    ]
    assert calls and all(call["index"] == 0 for call in calls)
    assembler, _ = assemble(raw)
    [block] = [b for b in assembler.blocks() if b.kind == "tool_call"]
    assert block.name == "get_weather"
    assert orjson.loads("".join(block.parts)) == {"city": "Paris"}
    assert assembler.finish_reason == "tool_calls"
    declarations = fake.requests[0].body["tools"][0]["function_declarations"]
    assert declarations[0]["name"] == "get_weather"


# -- non-streaming -------------------------------------------------------------------------------


async def test_non_streaming_answer_is_a_chat_completion(fake: FakeGemini) -> None:
    upstream = await provider(fake.url).chat(BODY, stream=False)
    assert upstream.usage_injected is False
    raw = await read_all(upstream)
    assert await upstream.read() == b""
    obj = orjson.loads(raw)
    assert obj["object"] == "chat.completion"
    openai.types.chat.ChatCompletion.model_validate(obj)
    assert obj["choices"][0]["message"] == {"role": "assistant", "content": "Hello, world!"}
    assert obj["usage"]["total_tokens"] == 9
    assembler = BlockAssembler.of(parse_completion(obj))
    assert [b.to_content() for b in assembler.blocks()] == [
        {"type": "text", "text": "Hello, world!"}
    ]
    assert assembler.finish_reason == "stop"
    [seen] = fake.requests
    assert seen.path == f"/v1beta/models/{MODEL}:generateContent"


async def test_non_streaming_function_call(fake: FakeGemini) -> None:
    fake.push(
        whole(
            response(
                function_call("get_weather", {"city": "Oslo"}),
                finish="STOP",
                usage_metadata=usage(9, 5),
            )
        )
    )
    raw = await read_all(await provider(fake.url).chat(BODY, stream=False))
    obj = orjson.loads(raw)
    openai.types.chat.ChatCompletion.model_validate(obj)
    [call] = obj["choices"][0]["message"]["tool_calls"]
    assert call["type"] == "function"
    assert call["function"]["name"] == "get_weather"
    assert orjson.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert obj["choices"][0]["finish_reason"] == "tool_calls"


# -- errors before the answer --------------------------------------------------------------------


RESOURCE_EXHAUSTED = google_error(
    429,
    "RESOURCE_EXHAUSTED",
    "Resource has been exhausted (e.g. check quota).",
    details=[{"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "7s"}],
)


@pytest.mark.parametrize("stream", [True, False])
async def test_rate_limit_is_a_retryable_429(fake: FakeGemini, stream: bool) -> None:
    fake.push(failing(429, RESOURCE_EXHAUSTED))
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(fake.url).chat(BODY, stream=stream)
    error = info.value
    assert error.status == 429
    assert error.retryable is True
    assert error.retry_after == 7.0  # from Google's RetryInfo
    assert error.to_openai() == {
        "error": {
            "message": "Resource has been exhausted (e.g. check quota).",
            "type": "rate_limit_error",
            "code": "rate_limit_exceeded",
            "param": None,
        }
    }
    assert len(fake.requests) == 1  # litellm did not retry on its own


async def test_retry_after_header_wins(fake: FakeGemini) -> None:
    fake.push(failing(429, RESOURCE_EXHAUSTED, {"Retry-After": "3"}))
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(fake.url).chat(BODY, stream=True)
    assert info.value.retry_after == 3.0


@pytest.mark.parametrize("stream", [True, False])
async def test_bad_request_is_not_retryable(fake: FakeGemini, stream: bool) -> None:
    fake.push(failing(400, google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload.")))
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(fake.url).chat(BODY, stream=stream)
    assert info.value.status == 400
    assert info.value.retryable is False
    assert info.value.to_openai()["error"]["message"] == "Invalid JSON payload."
    assert info.value.to_openai()["error"]["type"] == "invalid_request_error"


async def test_wrong_key_is_the_providers_error(fake: FakeGemini) -> None:
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(fake.url, key="AIza-wrong").chat(BODY, stream=True)
    assert info.value.status == 400
    assert "API key not valid" in info.value.message


async def test_an_unknown_model_is_a_404(fake: FakeGemini) -> None:
    config = DeploymentConfig.model_construct(
        provider="litellm", api_base=fake.url, api_key=KEY, timeouts=TimeoutsConfig()
    )
    with pytest.raises(UpstreamHTTPError) as info:
        await LiteLLMProvider(config, "gemini/gemini-0-nope").chat(BODY, stream=False)
    assert info.value.status == 404
    assert info.value.retryable is False
    assert info.value.to_openai()["error"]["type"] == "not_found_error"
    assert "gemini-0-nope is not found" in info.value.message


def test_a_model_string_litellm_cannot_place_fails_at_construction() -> None:
    with pytest.raises(ValueError, match="provider/model"):
        provider("http://127.0.0.1:9", model="no-such-provider/some-model")


async def test_a_missing_key_is_an_upstream_error_not_a_client_error(fake: FakeGemini) -> None:
    with pytest.MonkeyPatch.context() as env:
        env.delenv("GEMINI_API_KEY", raising=False)
        env.delenv("GOOGLE_API_KEY", raising=False)
        with pytest.raises(UpstreamError) as info:
            await provider(fake.url, key="").chat(BODY, stream=True)
    assert type(info.value) is UpstreamError
    assert info.value.status == 502 and info.value.retryable is True
    assert "GEMINI_API_KEY" in info.value.message
    assert "Traceback" not in info.value.message
    assert fake.requests == []


@pytest.mark.parametrize(("status", "kind"), [(500, "INTERNAL"), (503, "UNAVAILABLE")])
async def test_server_errors_keep_their_status(fake: FakeGemini, status: int, kind: str) -> None:
    fake.push(failing(status, google_error(status, kind, "The model is overloaded.")))
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(fake.url).chat(BODY, stream=True)
    assert info.value.status == status
    assert info.value.retryable is True
    assert info.value.message == "The model is overloaded."


async def test_non_json_error_keeps_status_and_text(fake: FakeGemini) -> None:
    fake.push(failing(502, "<html>Bad Gateway</html>"))
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(fake.url).chat(BODY, stream=True)
    assert info.value.status == 502  # not litellm's APIConnectionError "500"
    assert info.value.retryable is True
    assert "Bad Gateway" in info.value.message


@pytest.mark.parametrize("stream", [True, False])
async def test_connection_refused_is_a_connect_error(stream: bool) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(UpstreamConnectError) as info:
        await provider(f"http://127.0.0.1:{port}/v1beta").chat(BODY, stream=stream)
    assert info.value.retryable is True


async def test_a_stalled_upstream_times_out_on_litellms_backstop(fake: FakeGemini) -> None:
    fake.push(stalled())
    with pytest.raises(UpstreamTimeout) as info:
        await provider(fake.url, total_s=0.3).chat(BODY, stream=True)
    assert info.value.phase == "first_token"


async def test_cancelling_chat_drops_the_request(fake: FakeGemini) -> None:
    """The pipeline's first-token timeout cancels `chat()`; the provider must see it go."""
    fake.push(stalled())
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.5):
            await provider(fake.url).chat(BODY, stream=True)
    await asyncio.wait_for(fake.disconnected.wait(), 5)


# -- errors mid-stream ---------------------------------------------------------------------------


async def test_a_stream_cut_midway_raises_from_read(fake: FakeGemini) -> None:
    fake.push(cut_after(TEXT_CHUNKS[:2]))
    upstream = await provider(fake.url).chat(BODY, stream=True)
    received = b""
    with pytest.raises(UpstreamError) as info:
        while piece := await upstream.read():
            received += piece
    assert isinstance(info.value, UpstreamProtocolError)
    assert info.value.retryable is True
    # What came before the cut was relayed, and no made-up finish.
    assembler, parser = assemble(received)
    assert "".join(assembler.blocks()[0].parts) == "Hello, wor"
    assert not parser.finished
    assert await upstream.read() == b""
    upstream.close()


async def test_a_clean_end_without_finish_reason_looks_complete(fake: FakeGemini) -> None:
    """A known gap, pinned so that a litellm change shows: litellm's Gemini stream marks every
    chunk `finish_reason: "stop"` internally, so a stream that ends cleanly but early (no
    `finishReason`) cannot be told from a finished one, and the pipeline cannot flag it as
    incomplete as it does for OpenAI streams. A broken connection is detected (test above)."""
    fake.push(stream_of(TEXT_CHUNKS[:2]))
    raw = await read_all(await provider(fake.url).chat(BODY, stream=True))
    assembler, parser = assemble(raw)
    assert "".join(assembler.blocks()[0].parts) == "Hello, wor"
    assert parser.finished and assembler.finish_reason == "stop"


async def test_an_error_event_in_the_stream_is_a_stream_error(fake: FakeGemini) -> None:
    overloaded = google_error(503, "UNAVAILABLE", "The model is overloaded.")
    fake.push(stream_of(TEXT_CHUNKS[:1], then=b"data: " + orjson.dumps(overloaded) + b"\r\n\r\n"))
    upstream = await provider(fake.url).chat(BODY, stream=True)
    with pytest.raises(UpstreamStreamError) as info:
        while await upstream.read():
            pass
    assert info.value.upstream_status == 503
    assert info.value.retryable is True
    assert "overloaded" in info.value.message


async def test_close_mid_stream_drops_the_upstream_connection(fake: FakeGemini) -> None:
    fake.push(stream_of(TEXT_CHUNKS[:1], hang=True))
    upstream = await provider(fake.url).chat(BODY, stream=True)
    assert isinstance(upstream, LiteLLMStreamResponse)
    assert b"Hello" in await upstream.read()
    upstream.close()
    upstream.close()  # idempotent
    assert await upstream.read() == b""
    await asyncio.wait_for(fake.disconnected.wait(), 5)


# -- through the whole gateway -------------------------------------------------------------------


async def gemini_gateway(make_gateway: MakeGateway, fake: FakeGemini) -> GatewayUnderTest:
    deployment = {"provider": "litellm", "model": f"gemini/{MODEL}", "api_base": fake.url}
    return await make_gateway(
        models=[
            {
                "name": "gem",
                "retry": {"max_attempts": 1},
                "deployments": [{**deployment, "api_key": KEY}],
            }
        ]
    )


async def test_an_openai_client_streams_gemini_through_the_gateway(
    make_gateway: MakeGateway, fake: FakeGemini
) -> None:
    gw = await gemini_gateway(make_gateway, fake)
    client = gw.client()
    stream = await client.chat.completions.create(
        model="gem", messages=[{"role": "user", "content": "Say hello"}], stream=True
    )
    chunks = [chunk async for chunk in stream]
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == (
        "Hello, world!"
    )
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert all(c.usage is None for c in chunks)  # the injected usage chunk was held back

    stream = await client.chat.completions.create(
        model="gem",
        messages=[{"role": "user", "content": "Say hello"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[-1].usage is not None and chunks[-1].usage.total_tokens == 9


async def test_an_openai_client_gets_a_whole_gemini_answer_through_the_gateway(
    make_gateway: MakeGateway, fake: FakeGemini
) -> None:
    gw = await gemini_gateway(make_gateway, fake)
    completion = await gw.client().chat.completions.create(
        model="gem", messages=[{"role": "user", "content": "Say hello"}]
    )
    assert completion.choices[0].message.content == "Hello, world!"
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens == 5


async def test_a_gemini_rate_limit_reaches_the_client_as_openais(
    make_gateway: MakeGateway, fake: FakeGemini
) -> None:
    gw = await gemini_gateway(make_gateway, fake)
    fake.push(failing(429, RESOURCE_EXHAUSTED))
    with pytest.raises(openai.RateLimitError) as info:
        await gw.client().chat.completions.create(
            model="gem", messages=[{"role": "user", "content": "Say hello"}], stream=True
        )
    assert info.value.status_code == 429
    assert info.value.code == "rate_limit_exceeded"
    assert "Resource has been exhausted" in info.value.message
