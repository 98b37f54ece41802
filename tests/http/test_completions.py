"""POST /v1/completions, OpenAI's legacy API, driven by the openai SDK: sent as the client wrote it
to a deployment that serves it, rendered from any other, and recorded as a turn like a chat (a
client that leaves keeps exactly the text it was delivered)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import DONE, FakeUpstream, frames, sse, status
from tests.providers.upstreams import AnthropicServer

MakeServer = Callable[..., Awaitable[TestServer]]
PROMPT = "Say this is a test"


def text_chunk(text: str, finish: str | None = None, **extra: Any) -> bytes:
    """One streamed `text_completion` chunk, as OpenAI sends it."""
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
    return sse(
        {
            "id": "cmpl-upstream1",
            "object": "text_completion",
            "created": 1,
            "model": "gpt-3.5-turbo-instruct",
            "choices": [choice],
            **extra,
        }
    )


def text_usage() -> bytes:
    usage = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}
    return sse({"id": "cmpl-upstream1", "object": "text_completion", "choices": [], "usage": usage})


WHOLE = {
    "id": "cmpl-upstream2",
    "object": "text_completion",
    "created": 1,
    "model": "gpt-3.5-turbo-instruct",
    "choices": [
        {"text": "\n\nThis is a test.", "index": 0, "logprobs": None, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
}


def anthropic_message(text: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-fake",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 2},
    }


async def setup(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, **alias: Any
) -> tuple[GatewayUnderTest, FakeUpstream, AnthropicServer]:
    openai_like = await FakeUpstream().start(aiohttp_server)
    claude = await AnthropicServer().start(aiohttp_server)
    gw = await make_gateway(
        models=[
            {"name": "instruct", "deployments": [openai_like.deployment()], **alias},
            {"name": "claude", "deployments": [claude.deployment()], **alias},
            {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]},
        ]
    )
    return gw, openai_like, claude


async def test_a_deployment_that_serves_completions_gets_the_clients_body(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, upstream, _ = await setup(make_gateway, aiohttp_server)
    upstream.push(status(200, WHOLE))
    client = gw.client()
    raw = await client.completions.with_raw_response.create(
        model="instruct", prompt=PROMPT, max_tokens=7, suffix="!", echo=True, logprobs=2
    )
    answer = raw.parse()
    assert answer.id == "cmpl-upstream2" and answer.choices[0].text == "\n\nThis is a test."
    assert upstream.seen[-1].path == "/v1/completions"
    assert upstream.requests[-1] == {
        "model": upstream.model,
        "prompt": PROMPT,
        "max_tokens": 7,
        "suffix": "!",
        "echo": True,
        "logprobs": 2,
    }
    # A turn like a chat: the prompt as the user's message, the completion as the answer.
    conversation_id = raw.headers["X-Conversation-Id"]
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    assert await gw.messages(conversation_id) == [
        {"role": "user", "content": PROMPT},
        {"role": "assistant", "content": "\n\nThis is a test."},
    ]
    [(endpoint,)] = gw.query("SELECT json_extract(request, '$.endpoint') FROM turns")
    assert endpoint == "openai.completions"
    # In the request log of turns, the conversation list, with its cost and tokens.
    status_code, listed = await gw.get(f"/v1/conversations?id={conversation_id}&include=usage")
    assert status_code == 200
    [row] = listed["data"]
    assert row["model"] == "instruct" and row["usage"]["prompt_tokens"] == 5
    [(prompt, completion, cost_source)] = gw.query(
        "SELECT prompt_tokens, completion_tokens, usage_source FROM usage"
    )
    assert (prompt, completion, cost_source) == (5, 7, "provider")


async def test_a_stream_passes_unchanged_and_is_metered(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, upstream, _ = await setup(make_gateway, aiohttp_server)
    sent = [text_chunk("This"), text_chunk(" is"), text_chunk(" a test."), text_chunk("", "stop")]
    upstream.push(frames(*sent, text_usage(), DONE))
    stream = await gw.client().completions.create(model="instruct", prompt=PROMPT, stream=True)
    texts = [c.choices[0].text async for c in stream if c.choices]
    assert "".join(texts) == "This is a test."
    # The gateway asked for usage to meter it; the client, who did not, never sees it.
    assert upstream.requests[-1]["stream_options"] == {"include_usage": True}
    await gw.flush()
    assert gw.query("SELECT completion_tokens, usage_source FROM usage") == [(7, "provider")]
    body, _ = await _raw_stream(
        gw, {"model": "instruct", "prompt": PROMPT, "stream": True}, upstream
    )
    assert body == b"".join(sent) + DONE


async def _raw_stream(
    gw: GatewayUnderTest, request: dict[str, Any], upstream: FakeUpstream
) -> tuple[bytes, str]:
    import aiohttp

    upstream.push(
        frames(
            text_chunk("This"),
            text_chunk(" is"),
            text_chunk(" a test."),
            text_chunk("", "stop"),
            text_usage(),
            DONE,
        )
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/completions", json=request) as response,
    ):
        return await response.read(), response.headers["X-Conversation-Id"]


@pytest.mark.parametrize("model", ["demo", "claude"])
async def test_any_other_deployment_answers_as_a_text_completion(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, model: str
) -> None:
    gw, _, claude = await setup(make_gateway, aiohttp_server)
    if model == "claude":
        claude.text(["Hello", " world."])
    client = gw.client()
    stream = await client.completions.create(
        model=model, prompt=PROMPT, stream=True, stream_options={"include_usage": True}
    )
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert chunks[0].object == "text_completion" and chunks[0].id.startswith("cmpl-")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    if model == "claude":
        assert text == "Hello world."
        [message] = claude.requests[-1]["messages"]
        assert message["role"] == "user" and claude.question(claude.requests[-1]) == PROMPT
        claude.push(status(200, anthropic_message("Hello world.")))
    whole = await client.completions.create(model=model, prompt=[PROMPT], max_tokens=50)
    assert whole.object == "text_completion" and whole.choices[0].text
    assert whole.choices[0].finish_reason == "stop"


async def test_completions_only_parameters_are_refused_by_name_where_chat_serves(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, _, claude = await setup(make_gateway, aiohttp_server)
    client = gw.client()
    for name, value in (("echo", True), ("suffix", "}"), ("best_of", 3), ("logprobs", 1)):
        with pytest.raises(openai.BadRequestError) as raised:
            await client.completions.create(model="claude", prompt=PROMPT, **{name: value})
        assert raised.value.body["param"] == name  # type: ignore[index]
    # Asking for nothing beyond the default is no parameter at all.
    claude.push(status(200, anthropic_message("ok")))
    done = await client.completions.create(model="claude", prompt=PROMPT, echo=False, best_of=1)
    assert done.choices[0].text == "ok"


async def test_drop_params_drops_them_for_a_chat_deployment(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, _, claude = await setup(make_gateway, aiohttp_server, drop_params=True)
    claude.push(status(200, anthropic_message("ok")))
    raw = await gw.client().completions.with_raw_response.create(
        model="claude", prompt=PROMPT, suffix="}", max_tokens=20
    )
    assert raw.headers["X-Gateway-Dropped-Params"] == "suffix"
    assert "suffix" not in claude.requests[-1]


async def test_one_prompt_a_request(make_gateway: MakeGateway, aiohttp_server: MakeServer) -> None:
    gw, upstream, _ = await setup(make_gateway, aiohttp_server)
    client = gw.client()
    for prompt in (["one", "two"], [1, 2, 3], [[1, 2]], 5):
        with pytest.raises(openai.BadRequestError) as raised:
            await client.completions.create(model="instruct", prompt=prompt)  # type: ignore[arg-type]
        assert raised.value.body["param"] == "prompt"  # type: ignore[index]
    assert upstream.requests == []
    await gw.flush()
    assert gw.query("SELECT COUNT(*) FROM turns") == [(0,)]


async def test_a_client_that_leaves_keeps_what_it_was_delivered(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, upstream, _ = await setup(make_gateway, aiohttp_server)
    upstream.push(frames(text_chunk("Once upon"), text_chunk(" a time"), then="stall"))
    client = gw.client()
    raw = await client.completions.with_raw_response.create(
        model="instruct", prompt="Tell a story", stream=True
    )
    stream = raw.parse()
    seen = ""
    async for chunk in stream:
        seen += chunk.choices[0].text
        if seen == "Once upon a time":
            break
    await stream.close()
    conversation_id = raw.headers["X-Conversation-Id"]
    events = await gw.wait_turn_end(conversation_id)
    message = next(e for e in events if e["type"] == "assistant/message")
    assert message["payload"]["interrupted"] is True
    assert await gw.messages(conversation_id) == [
        {"role": "user", "content": "Tell a story"},
        {"role": "assistant", "content": "Once upon a time"},
    ]
    assert events[-1]["payload"]["status"] == "aborted"
