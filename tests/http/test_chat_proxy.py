"""POST /v1/chat/completions as a drop-in proxy, driven by the real openai SDK."""

from __future__ import annotations

import aiohttp
import openai
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import (
    DONE,
    USAGE,
    FakeUpstream,
    chunk,
    completion,
    expected,
    fixture_bytes,
    frames,
    replay,
)

HELLO = [{"role": "user", "content": "What is the capital of the UK?"}]


async def test_stream_reaches_the_client_byte_for_byte(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(replay("openai-chat-text-usage.sse", piece=7))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + "/v1/chat/completions",
            json={
                "model": "fake",
                "messages": HELLO,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ) as response,
    ):
        body = await response.read()
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/event-stream")
        assert response.headers["X-Conversation-Id"]
        assert response.headers["X-Request-Id"]
        assert response.headers["X-Gateway-Attempts"] == "1"
    assert body == fixture_bytes("openai-chat-text-usage.sse")
    # The upstream got the client's body with the deployment's model id.
    assert upstream.requests[0]["model"] == "fake-model"
    assert upstream.requests[0]["messages"] == HELLO


async def test_openai_sdk_streams_text_and_the_turn_is_recorded(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(replay("openai-chat-text-usage.sse"))
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=HELLO, stream=True
    )
    conversation_id = response.headers["X-Conversation-Id"]
    text = ""
    async for part in response.parse():
        if part.choices and part.choices[0].delta.content:
            text += part.choices[0].delta.content
    assert text == expected("openai-chat-text-usage.sse")["content"]["value"]

    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    message = events[1]["payload"]
    assert message["content"] == [{"type": "text", "text": text}]
    assert message["interrupted"] is False
    assert message["finish_reason"] == "stop"
    assert message["usage"]["completion_tokens"] == 9
    assert message["route"] == {
        "provider": "openai",
        "deployment": "fake/0-openai",
        "model": "fake-model",
    }
    assert events[2]["payload"]["status"] == "completed"
    assert events[0]["payload"] == {"content": HELLO[0]["content"]}
    assert [e["seq"] for e in events] == [1, 2, 3]


async def test_usage_chunk_the_gateway_asked_for_is_not_forwarded(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(
        frames(chunk("Hi"), chunk(finish="stop"), chunk(usage=USAGE, no_choices=True), DONE)
    )
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + "/v1/chat/completions",
            json={"model": "fake", "messages": HELLO, "stream": True},
        ) as response,
    ):
        body = await response.read()
        conversation_id = response.headers["X-Conversation-Id"]
    assert upstream.requests[0]["stream_options"] == {"include_usage": True}
    assert body == chunk("Hi") + chunk(finish="stop") + DONE
    events = await gw.wait_turn_end(conversation_id)
    assert events[1]["payload"]["usage"] == USAGE  # metered all the same


async def test_tool_call_stream_is_assembled(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(replay("openai-chat-tool-call-usage.sse"))
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )
    async for _ in response.parse():
        pass
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    content = events[1]["payload"]["content"]
    assert content == [
        {
            "type": "tool_call",
            "id": "call_ZR5UUuTt3pf61kjwAJIYdVMj",
            "name": "get_capital",
            "arguments": '{"country":"UK"}',
        }
    ]
    assert events[1]["payload"]["finish_reason"] == "tool_calls"


async def test_reasoning_stream_is_assembled(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(replay("deepseek-chat-reasoning-content.sse", piece=100))
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=HELLO, stream=True
    )
    async for _ in response.parse():
        pass
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    want = expected("deepseek-chat-reasoning-content.sse")
    assert events[1]["payload"]["content"] == [
        {"type": "reasoning", "text": want["reasoning_content"]["value"]},
        {"type": "text", "text": want["content"]["value"]},
    ]


async def test_non_streaming_request(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(completion("London."))
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(model="fake", messages=HELLO)
    result = response.parse()
    assert result.choices[0].message.content == "London."
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    assert events[1]["payload"]["content"] == [{"type": "text", "text": "London."}]
    assert events[1]["payload"]["usage"] == USAGE
    assert upstream.requests[0].get("stream") is None


async def test_demo_provider_streams_without_a_key(gw: GatewayUnderTest) -> None:
    client = gw.client()
    stream = await client.chat.completions.create(model="demo", messages=HELLO, stream=True)
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert "demo provider" in text
    assert HELLO[0]["content"] in text
    again = await client.chat.completions.create(model="demo", messages=HELLO)
    assert again.choices[0].message.content == text  # deterministic


async def test_models_lists_the_aliases(gw: GatewayUnderTest) -> None:
    models = await gw.client().models.list()
    assert [m.id for m in models.data] == ["demo", "fake"]


async def test_unknown_model_is_404_and_nothing_is_recorded(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await gw.client().chat.completions.create(model="nope", messages=HELLO)
    assert caught.value.code == "model_not_found"
    assert caught.value.body["param"] == "model"  # type: ignore[index]
    await gw.flush()
    assert gw.query("SELECT count(*) FROM turns") == [(0,)]
    assert upstream.requests == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b"{not json", None),
        (b"[]", None),
        (b'{"model": "fake"}', "messages"),
        (b'{"model": "fake", "messages": []}', "messages"),
        (
            b'{"model": "fake", "messages": [{"role": "wizard", "content": "x"}]}',
            "messages[0].role",
        ),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
    ],
)
async def test_bad_requests_get_a_clear_400_and_change_nothing(
    gw: GatewayUnderTest, upstream: FakeUpstream, body: bytes, param: str | None
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"}
        ) as response,
    ):
        assert response.status == 400
        error = (await response.json())["error"]
        assert response.headers["X-Request-Id"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"]
    await gw.flush()
    assert gw.query("SELECT count(*) FROM turns") == [(0,)]
    assert gw.query("SELECT count(*) FROM events") == [(0,)]
    assert upstream.requests == []


async def test_request_id_is_echoed(gw: GatewayUnderTest) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.get(gw.url + "/health/live", headers={"X-Request-Id": "abc-123"}) as response,
    ):
        assert response.headers["X-Request-Id"] == "abc-123"


async def test_health_and_metrics(gw: GatewayUnderTest) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/health/ready") as response:
            assert response.status == 200
            assert (await response.json())["store"] == "ok"
        await gw.client().chat.completions.create(model="demo", messages=HELLO)
        async with session.get(gw.url + "/metrics") as response:
            text = await response.text()
    assert (
        'gateway_turns_total{reason="",status="completed"}' in text or "gateway_turns_total" in text
    )
    assert "gateway_requests_total" in text


async def test_oversized_bodies_and_unknown_routes_get_openai_shaped_errors(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway()
    big = (
        b'{"model": "demo", "messages": [{"role": "user", "content": "'
        + b"x" * (17 << 20)
        + b'"}]}'
    )
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/chat/completions", data=big, headers={"Content-Type": "application/json"}
        ) as response:
            assert response.status == 413
            assert (await response.json())["error"]["code"] == "payload_too_large"
        async with session.get(gw.url + "/v1/nothing-here") as response:
            assert response.status == 404
            assert (await response.json())["error"]["type"] == "invalid_request_error"
        async with session.delete(gw.url + "/v1/chat/completions") as response:
            assert response.status == 405
            assert (await response.json())["error"]["message"]
    await gw.flush()
    assert gw.query("SELECT count(*) FROM turns") == [(0,)]
