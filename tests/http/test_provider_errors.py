"""Provider faults become recorded attempts and clear errors; nothing enters model history."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FAILED_TURN, FakeUpstream, chunk, fixture_bytes, frames, replay, status

QUESTION = [{"role": "user", "content": "Hello?"}]


@pytest.mark.parametrize(
    ("code", "body", "error_class"),
    [
        (
            500,
            {"error": {"message": "boom", "type": "server_error", "code": None}},
            openai.InternalServerError,
        ),
        (
            429,
            {
                "error": {
                    "message": "slow down",
                    "type": "rate_limit_error",
                    "code": "rate_limit_exceeded",
                }
            },
            openai.RateLimitError,
        ),
        (
            400,
            {
                "error": {
                    "message": "bad field",
                    "type": "invalid_request_error",
                    "param": "temperature",
                    "code": None,
                }
            },
            openai.BadRequestError,
        ),
    ],
)
async def test_http_error_before_streaming_is_returned_and_recorded(
    gw: GatewayUnderTest,
    upstream: FakeUpstream,
    code: int,
    body: dict[str, object],
    error_class: type[Exception],
) -> None:
    upstream.push(status(code, body, headers={"Retry-After": "3"} if code == 429 else None))
    with pytest.raises(error_class) as caught:
        await gw.client().chat.completions.create(model="fake", messages=QUESTION, stream=True)
    error = caught.value
    assert isinstance(error, openai.APIStatusError)
    assert error.status_code == code
    assert error.body == body["error"]  # the provider's own error object, in OpenAI shape
    conversation_id = error.response.headers["X-Conversation-Id"]
    if code == 429:
        assert error.response.headers["Retry-After"] == "3"
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == FAILED_TURN
    assert events[1]["payload"]["reason"] == "provider_error"
    assert events[2]["payload"]["status"] == code
    assert events[2]["payload"]["retryable"] is (code != 400)
    assert events[3]["payload"]["status"] == "error"
    assert events[3]["payload"]["reason"] == "provider_error"
    assert await gw.messages(conversation_id) == QUESTION


async def test_html_error_page_becomes_an_openai_shaped_error(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(status(502, "<html><body>Bad Gateway</body></html>"))
    with pytest.raises(openai.APIStatusError) as caught:
        await gw.client().chat.completions.create(model="fake", messages=QUESTION)
    assert caught.value.status_code == 502
    assert caught.value.body["type"] == "upstream_error"  # type: ignore[index]
    assert "Bad Gateway" in caught.value.body["message"]  # type: ignore[index]


async def test_reset_mid_stream_ends_with_an_error_event(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(chunk("Partial "), chunk("answer"), then="reset"))
    body, conversation_id = await gw.post_stream(
        {"model": "fake", "messages": QUESTION, "stream": True}
    )
    assert body.startswith(chunk("Partial ") + chunk("answer"))
    assert body.endswith(b"\n\n")
    assert b'data: {"error":' in body
    assert b"[DONE]" not in body
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == FAILED_TURN
    attempt = events[1]["payload"]
    assert attempt["reason"] == "provider_error"
    assert attempt["stream"][0]["parts"] == ["Partial ", "answer"]  # kept for audit
    assert events[3]["payload"]["status"] == "error"
    assert await gw.messages(conversation_id) == QUESTION


async def test_a_stream_that_failed_after_delivery_keeps_what_the_client_got(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """The delivered prefix of a failed attempt is its own (for audit and usage), never model
    history: only a user's cancel turns delivered text into an interrupted message."""
    parts = [f"word{i} " for i in range(20)]
    upstream.push(frames(*(chunk(p) for p in parts), then="reset"))
    body, conversation_id = await gw.post_stream(
        {"model": "fake", "messages": QUESTION, "stream": True}
    )
    assert body.startswith(b"".join(chunk(p) for p in parts))  # the client read all 20
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == FAILED_TURN
    delivered = events[1]["payload"]["delivered"]
    assert delivered["delivery"] in ("acked", "sent")
    assert 0 < delivered["frames"] <= len(parts)
    text = delivered["content"][0]["text"]
    assert "".join(parts).startswith(text) and text.startswith("word0 ")
    metered = events[3]["payload"]["metered"]
    assert metered["completion_delivered"] > 0
    assert await gw.messages(conversation_id) == QUESTION  # outside model history


async def test_sdk_raises_on_the_error_event(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(frames(chunk("Partial "), then="reset"))
    stream = await gw.client().chat.completions.create(model="fake", messages=QUESTION, stream=True)
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass


async def test_stream_without_a_terminal_event_is_an_aborted_finish(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(chunk("All "), chunk("good?"), then="end"))
    body, conversation_id = await gw.post_stream(
        {"model": "fake", "messages": QUESTION, "stream": True}
    )
    assert b'"code":"upstream_incomplete_stream"' in body
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == FAILED_TURN
    assert events[1]["payload"]["reason"] == "aborted_finish"
    assert await gw.messages(conversation_id) == QUESTION


@pytest.mark.parametrize(
    "name", ["openrouter-chat-error-chunk.sse", "groq-chat-reasoning-error-event.sse"]
)
async def test_in_band_error_events_are_provider_errors(
    gw: GatewayUnderTest, upstream: FakeUpstream, name: str
) -> None:
    upstream.push(replay(name))
    body, conversation_id = await gw.post_stream(
        {"model": "fake", "messages": QUESTION, "stream": True}
    )
    assert b"[DONE]" not in body
    assert body.endswith(b"\n\n")
    assert fixture_bytes(name).startswith(body.split(b'data: {"error"')[0])
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == FAILED_TURN
    assert events[1]["payload"]["reason"] == "provider_error"
    assert await gw.messages(conversation_id) == QUESTION


async def test_unreachable_upstream_is_a_502(make_gateway, tmp_path) -> None:  # type: ignore[no-untyped-def]
    gw = await make_gateway(
        models=[
            {
                "name": "down",
                "deployments": [{"provider": "openai", "api_base": "http://127.0.0.1:9/v1"}],
            }
        ]
    )
    with pytest.raises(openai.APIStatusError) as caught:
        await gw.client().chat.completions.create(model="down", messages=QUESTION)
    assert caught.value.status_code == 502
    assert caught.value.body["code"] == "upstream_connect_error"  # type: ignore[index]
    conversation_id = caught.value.response.headers["X-Conversation-Id"]
    assert caught.value.response.headers["X-Gateway-Attempts"] == "3"  # the default retry budget
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == [
        "user/message",
        *["assistant/attempt", "request/error"] * 3,
        "turn/end",
    ]


async def test_fallback_to_the_next_deployment_before_anything_was_sent(
    make_gateway, upstream: FakeUpstream
) -> None:  # type: ignore[no-untyped-def]
    gw = await make_gateway(
        models=[
            {
                "name": "chain",
                "deployments": [
                    {"provider": "openai", "api_base": "http://127.0.0.1:9/v1", "name": "dead"},
                    {"provider": "openai", "api_base": upstream.url, "name": "alive"},
                ],
            }
        ]
    )
    upstream.push(replay("openai-chat-text-usage.sse"))
    response = await gw.client().chat.completions.with_raw_response.create(
        model="chain", messages=QUESTION, stream=True
    )
    async for _ in response.parse():
        pass
    assert response.headers["X-Gateway-Deployment"] == "alive"
    assert response.headers["X-Gateway-Attempts"] == "2"
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    assert [e["type"] for e in events] == [
        "user/message",
        "assistant/attempt",
        "request/error",
        "assistant/message",
        "turn/end",
    ]
    assert events[3]["payload"]["route"]["deployment"] == "alive"
    assert events[3]["payload"]["attempt"] == 2
