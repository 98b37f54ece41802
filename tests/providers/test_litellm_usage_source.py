"""Whose count a litellm stream's usage is: the provider's, or litellm's own.

A provider litellm drives that reports no usage (an OpenAI-compatible server that ignores
`stream_options`, say Together AI's) still gets a usage chunk from litellm, counted by litellm
from the text. That count is marked `usage_source: "litellm"` in the usage the client and the
record see, never passed off as the provider's; the provider's own count carries no mark. Groq,
a litellm model the gateway reads itself (gateway/providers/native_routes.py), gets its own
count from `x_groq.usage` when that is the only one it sent.
"""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import COMPLETION_TOKENS, PROMPT_TOKENS, FakeUpstream, MakeServer, Reply, sse
from tests.providers.test_adapter_contract import ANSWER, LITELLM_SKIP, stream_chat

pytestmark = pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")

GROQ_SAID = {"prompt_tokens": 7000, "completion_tokens": 900, "total_tokens": 7900}
TOGETHER = "together_ai/meta-llama/Llama-3.3-70B-Instruct-Turbo"


class SilentUpstream(FakeUpstream):
    """An OpenAI-compatible stream that carries no usage, whatever the request asked."""

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        out = [sse(self.chunk_object({"role": "assistant", "content": ""}))]
        for block in reply.blocks:
            out += [sse(self.chunk_object({"content": p})) for p in block.parts]
        out.append(sse(self.chunk_object({}, "stop")))
        out.append(b"data: [DONE]\n\n")
        return out


class GroqUpstream(SilentUpstream):
    """Groq's stream with its usage only under `x_groq` on the last chunk."""

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        out = super().frames(reply, request, body)
        out[-2] = sse(self.chunk_object({}, "stop", x_groq={"usage": GROQ_SAID}))
        return out


async def litellm_gateway(
    make_gateway: MakeGateway,
    aiohttp_server: MakeServer,
    upstream: FakeUpstream,
    model: str = TOGETHER,
) -> GatewayUnderTest:
    await upstream.start(aiohttp_server)
    deployment = upstream.deployment(provider="litellm", model=model)
    return await make_gateway(
        models=[{"name": "m", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    )


async def test_litellms_own_count_is_marked_as_litellms(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    upstream = SilentUpstream()
    gw = await litellm_gateway(make_gateway, aiohttp_server, upstream)
    upstream.text(ANSWER)
    view = await stream_chat(gw, stream_options={"include_usage": True})
    assert view.error is None
    assert view.text == "".join(ANSWER)
    assert view.usage is not None
    assert (view.usage.model_extra or {}).get("usage_source") == "litellm"
    assert 0 < view.usage.prompt_tokens < 50  # counted from the short question

    events = await gw.wait_turn_end(view.conversation_id)
    usage = events[1]["payload"]["usage"]
    assert usage["usage_source"] == "litellm"
    assert usage["prompt_tokens"] == view.usage.prompt_tokens
    # And the bill says who counted: the usage row and the turn's metered totals.
    assert events[-1]["payload"]["metered"]["usage_source"] == "litellm"
    await gw.flush()
    assert gw.query("SELECT usage_source FROM usage") == [("litellm",)]


async def test_the_providers_count_carries_no_mark(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    upstream = FakeUpstream()  # usage in the standard chunk, as include_usage asks
    gw = await litellm_gateway(make_gateway, aiohttp_server, upstream)
    upstream.text(ANSWER)
    view = await stream_chat(gw, stream_options={"include_usage": True})
    assert view.usage is not None
    assert (view.usage.prompt_tokens, view.usage.completion_tokens) == (
        PROMPT_TOKENS,
        COMPLETION_TOKENS,
    )
    assert "usage_source" not in (view.usage.model_extra or {})

    events = await gw.wait_turn_end(view.conversation_id)
    assert "usage_source" not in events[1]["payload"]["usage"]


async def test_groqs_count_under_x_groq_is_groqs(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    upstream = GroqUpstream()
    gw = await litellm_gateway(make_gateway, aiohttp_server, upstream, "groq/llama-3.1-8b-instant")
    upstream.text(ANSWER)
    view = await stream_chat(gw, stream_options={"include_usage": True})
    assert view.error is None
    assert view.usage is not None
    assert view.usage.prompt_tokens == GROQ_SAID["prompt_tokens"]
    assert "usage_source" not in (view.usage.model_extra or {})

    events = await gw.wait_turn_end(view.conversation_id)
    assert events[1]["payload"]["usage"]["completion_tokens"] == GROQ_SAID["completion_tokens"]
    await gw.flush()
    assert gw.query("SELECT usage_source FROM usage") == [("provider",)]
