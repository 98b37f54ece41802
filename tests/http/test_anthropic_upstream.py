"""An OpenAI client talking to an Anthropic deployment: translated both ways, recorded the same."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web

from gateway.providers.anthropic_messages import AnthropicStreamParser
from gateway.stream.assembler import BlockAssembler
from gateway.stream.sse import SSEDecoder
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import expected, fixture_bytes


class FakeAnthropic:
    def __init__(self) -> None:
        self.app = web.Application()
        self.app.router.add_post("/v1/messages", self.handle)
        self.requests: list[dict[str, Any]] = []
        self.body = fixture_bytes("anthropic-thinking-text.sse")
        self.stall_after: int | None = None  # SSE events to send before stalling
        self.stalled = asyncio.Event()
        self.disconnected = asyncio.Event()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(await request.json())
        assert request.headers["x-api-key"] == "sk-ant"
        if not self.requests[-1].get("stream"):
            return web.json_response(
                {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude",
                    "content": [{"type": "text", "text": "Plain answer."}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": 10, "output_tokens": 3},
                }
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            events = self.body.split(b"\n\n")[:-1]
            for i, event in enumerate(events):
                if self.stall_after is not None and i == self.stall_after:
                    self.stalled.set()
                    await asyncio.Event().wait()
                await response.write(event + b"\n\n")
        except asyncio.CancelledError:
            self.disconnected.set()
            raise
        await response.write_eof()
        return response


@pytest.fixture
async def anthropic(aiohttp_server: Any) -> FakeAnthropic:
    fake = FakeAnthropic()
    fake.server = await aiohttp_server(fake.app)  # type: ignore[attr-defined]
    return fake


async def gateway(make_gateway: MakeGateway, fake: FakeAnthropic) -> GatewayUnderTest:
    url = str(fake.server.make_url(""))  # type: ignore[attr-defined]
    return await make_gateway(
        models=[
            {
                "name": "claude",
                "deployments": [
                    {
                        "provider": "anthropic",
                        "api_base": url,
                        "api_key": "sk-ant",
                        "model": "claude-x",
                    }
                ],
            }
        ]
    )


async def test_openai_client_streams_from_anthropic(
    make_gateway: MakeGateway, anthropic: FakeAnthropic
) -> None:
    gw = await gateway(make_gateway, anthropic)
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="claude",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, reasoning, finish, usage = "", "", None, None
    async for part in response.parse():
        if part.usage:
            usage = part.usage
        if part.choices:
            delta = part.choices[0].delta
            text += delta.content or ""
            reasoning += getattr(delta, "reasoning_content", None) or ""
            finish = part.choices[0].finish_reason or finish
    blocks = expected("anthropic-thinking-text.sse")["blocks"]
    assert reasoning == blocks[0]["thinking"]["value"]
    assert text == blocks[1]["text"]["value"]
    assert finish == "stop"
    assert usage is not None and usage.completion_tokens > 0
    sent = anthropic.requests[0]
    assert sent["model"] == "claude-x"
    assert sent["system"] == "Be brief."
    assert [m["role"] for m in sent["messages"]] == ["user"]

    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    content = events[1]["payload"]["content"]
    assert [b["type"] for b in content] == ["reasoning", "text"]
    assert content[0]["text"] == reasoning
    assert content[0]["signature"] == blocks[0]["signature"]["value"]
    assert content[1]["text"] == text


def _prefix(events: int) -> tuple[str, str]:
    """(reasoning, text) carried by the fixture's first `events` SSE events."""
    parser = AnthropicStreamParser()
    assembler = BlockAssembler()
    for frame in SSEDecoder().feed(fixture_bytes("anthropic-thinking-text.sse"))[:events]:
        for event in parser.feed(frame)[0]:
            assembler.feed(event)
    kinds = {b.kind: b.text for b in assembler.blocks()}
    return kinds.get("reasoning", ""), kinds.get("text", "")


async def test_cancel_mid_stream_records_the_translated_prefix(
    make_gateway: MakeGateway, anthropic: FakeAnthropic
) -> None:
    gw = await gateway(make_gateway, anthropic)
    anthropic.stall_after = 40  # inside the text block
    want_reasoning, want_text = _prefix(40)
    assert want_reasoning and want_text
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="claude", messages=[{"role": "user", "content": "Hi"}], stream=True
    )
    stream = response.parse()
    seen_text, seen_reasoning = "", ""
    async for part in stream:
        delta = part.choices[0].delta
        seen_text += delta.content or ""
        seen_reasoning += getattr(delta, "reasoning_content", None) or ""
        if seen_text == want_text:
            break  # the client read everything sent before the stall
    await stream.close()
    await asyncio.wait_for(anthropic.disconnected.wait(), 5)
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    message = events[1]["payload"]
    assert message["interrupted"] is True
    assert message["content"] == [
        {
            "type": "reasoning",
            "text": want_reasoning,
            "signature": message["content"][0]["signature"],
        },
        {"type": "text", "text": want_text},
    ]
    assert seen_reasoning == want_reasoning


async def test_non_streaming_from_anthropic(
    make_gateway: MakeGateway, anthropic: FakeAnthropic
) -> None:
    gw = await gateway(make_gateway, anthropic)
    result = await gw.client().chat.completions.create(
        model="claude", messages=[{"role": "user", "content": "Hi"}]
    )
    assert result.choices[0].message.content == "Plain answer."
    assert result.choices[0].finish_reason == "stop"
    assert result.usage is not None and result.usage.prompt_tokens == 10
    assert json.loads(json.dumps(anthropic.requests[0]))["max_tokens"] > 0
