"""A cancelled turn keeps every count the provider sent before the cut (Anthropic's
message_start has the exact input and cache counts), estimates only the rest, and flags an
estimate that cannot see hidden reasoning as a lower bound (docs/operations.md, "Usage and
cost")."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.providers.upstreams import AnthropicServer

START = {
    "input_tokens": 120,
    "cache_read_input_tokens": 3000,
    "cache_creation_input_tokens": 50,
    "cache_creation": {"ephemeral_5m_input_tokens": 50, "ephemeral_1h_input_tokens": 0},
    "output_tokens": 1,
}
PARTS = ["The contract ", "says that ", "the tenant ", "pays rent."]


@pytest.fixture
async def claude(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AnthropicServer:
    return await AnthropicServer().start(aiohttp_server)


def cut_after_text(claude: AnthropicServer) -> None:
    """message_start with its usage, a text block, then nothing: the stream stalls."""
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": claude.model,
               "content": [], "stop_reason": None, "usage": START}  # fmt: skip
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": p}}
            for p in PARTS
        ),
    ]

    async def script(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(claude.event(event))
        await asyncio.Event().wait()  # until the gateway goes away
        return response

    claude.push(script)


async def cancel_midway(gw: GatewayUnderTest, **extra: Any) -> str:
    """A stream the client leaves after its text arrived; the conversation it is in."""
    response = await gw.client().chat.completions.with_raw_response.create(
        model="claude", messages=[{"role": "user", "content": "Summarise."}], stream=True, **extra
    )
    seen = ""
    async for part in response.parse():
        seen += (part.choices[0].delta.content or "") if part.choices else ""
        if seen == "".join(PARTS):
            break
    await response.parse().close()
    return response.headers["X-Conversation-Id"]


@pytest.mark.parametrize(
    ("extra", "source"),
    [({}, "estimated"), ({"reasoning_effort": "low"}, "estimated_lower_bound")],
)
async def test_a_cancel_keeps_the_providers_input_counts(
    make_gateway: MakeGateway,
    claude: AnthropicServer,
    extra: dict[str, Any],
    source: str,
) -> None:
    gw = await make_gateway(models=[{"name": "claude", "deployments": [claude.deployment()]}])
    cut_after_text(claude)
    conversation_id = await cancel_midway(gw, **extra)
    events = await gw.wait_turn_end(conversation_id)
    assert events[-1]["payload"]["status"] == "aborted"
    await gw.flush()
    (row,) = gw.query(
        "SELECT prompt_tokens, cached_tokens, cache_write_5m_tokens, completion_tokens,"
        " usage_source FROM usage"
    )
    prompt, cached, written, completion, recorded_source = row
    # Exactly what message_start said, not a tokenizer's guess at "Summarise.".
    assert (prompt, cached, written) == (120 + 3000 + 50, 3000, 50)
    assert completion > 1  # the text received, estimated
    assert recorded_source == source
    # The client never got a usage chunk it did not ask for, nor the partial one.


async def test_the_early_count_never_reaches_the_client_as_a_usage_chunk(
    make_gateway: MakeGateway, claude: AnthropicServer
) -> None:
    gw = await make_gateway(models=[{"name": "claude", "deployments": [claude.deployment()]}])
    claude.text(["Hello", " there"])
    stream = await gw.client().chat.completions.create(
        model="claude",
        messages=[{"role": "user", "content": "Hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    usages = [part.usage for part in [p async for p in stream] if part.usage is not None]
    assert len(usages) == 1  # the final count, once, at the end
    assert usages[0].completion_tokens > 1
