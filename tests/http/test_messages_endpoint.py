"""POST /v1/messages: Anthropic SDK clients through the gateway, to any provider."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, fixture_bytes, frames, replay
from tests.http.test_anthropic_upstream import FakeAnthropic
from tests.http.test_anthropic_upstream import gateway as anthropic_gateway

QUESTION = [{"role": "user", "content": "What is the capital of the UK?"}]


def client(gw: GatewayUnderTest, **kwargs: Any) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key", max_retries=0, **kwargs)


async def test_anthropic_sdk_streams_from_an_openai_upstream(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(replay("openai-chat-text-usage.sse"))
    async with client(gw) as api:
        async with api.messages.stream(
            model="fake", max_tokens=100, system="Be brief.", messages=QUESTION
        ) as stream:
            text = "".join([t async for t in stream.text_stream])
            message = await stream.get_final_message()
    assert text == "The capital of the UK is London."
    assert message.stop_reason == "end_turn"
    assert message.usage.output_tokens == 9
    sent = upstream.requests[0]
    assert sent["messages"] == [{"role": "system", "content": "Be brief."}, *QUESTION]
    assert sent["max_tokens"] == 100


async def test_recorded_like_any_turn_and_cancel_keeps_the_prefix(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    parts = ["London ", "is the ", "capital"]
    upstream.push(frames(*(chunk(p) for p in parts), then="stall"))
    async with client(gw) as api:
        response = await api.messages.with_raw_response.create(
            model="fake", max_tokens=100, messages=QUESTION, stream=True
        )
        conversation_id = response.headers["X-Conversation-Id"]
        stream = await response.parse()
        seen = ""
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                seen += event.delta.text
            if seen == "".join(parts):
                break
        await stream.close()
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    assert events[1]["payload"]["interrupted"] is True
    assert events[1]["payload"]["content"] == [{"type": "text", "text": "".join(parts)}]
    assert gw.query("SELECT request FROM turns")[0][0].find('"endpoint":"anthropic.messages"') >= 0


async def test_non_streaming_message(gw: GatewayUnderTest) -> None:
    async with client(gw) as api:
        message = await api.messages.create(model="demo", max_tokens=500, messages=QUESTION)
    assert message.content[0].type == "text"
    assert "demo provider" in message.content[0].text
    assert message.stop_reason == "end_turn"


async def test_errors_come_in_anthropics_shape(gw: GatewayUnderTest) -> None:
    async with client(gw) as api:
        with pytest.raises(anthropic.NotFoundError) as missing:
            await api.messages.create(model="nope", max_tokens=10, messages=QUESTION)
        assert missing.value.body == {
            "type": "error",
            "error": {"type": "not_found_error", "message": missing.value.body["error"]["message"]},  # type: ignore[index]
        }
        with pytest.raises(anthropic.BadRequestError) as bad:
            await api.post(
                "/v1/messages", body={"model": "demo", "messages": QUESTION}, cast_to=object
            )
        assert bad.value.body["error"]["type"] == "invalid_request_error"  # type: ignore[index]
        assert "max_tokens" in bad.value.body["error"]["message"]  # type: ignore[index]


async def test_an_anthropic_upstream_is_relayed_byte_for_byte(
    make_gateway: MakeGateway, aiohttp_server: Any
) -> None:
    fake = FakeAnthropic()
    fake.server = await aiohttp_server(fake.app)  # type: ignore[attr-defined]
    gw = await anthropic_gateway(make_gateway, fake)
    async with client(gw) as api:
        response = await api.messages.with_raw_response.create(
            model="claude", max_tokens=2000, messages=QUESTION, stream=True
        )
        raw = b"".join([piece async for piece in response.http_response.aiter_bytes()])
    assert raw == fixture_bytes("anthropic-thinking-text.sse")
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    assert [b["type"] for b in events[1]["payload"]["content"]] == ["reasoning", "text"]
