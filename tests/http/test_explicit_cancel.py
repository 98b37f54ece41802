"""POST /v1/chat/completions/{request_id}/cancel: a Stop button on another connection."""

from __future__ import annotations

import asyncio

import openai
import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, chunk, frames, hang_before_headers

QUESTION = [{"role": "user", "content": "Count slowly."}]
SENT = ["One, ", "two, ", "three, "]


async def test_cancel_ends_the_stream_after_the_last_delivered_delta(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(*(chunk(p) for p in SENT), then="stall"))
    client = gw.client(default_headers={"X-Request-Id": "req-stop-1"})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION, stream=True
    )
    assert response.headers["X-Request-Id"] == "req-stop-1"
    stream = response.parse()
    received: list[tuple[str, str | None]] = []
    async for part in stream:
        received.append((part.choices[0].delta.content or "", part.choices[0].finish_reason))
        if len(received) == len(SENT):
            status, body = await gw.post("/v1/chat/completions/req-stop-1/cancel", {})
            assert (status, body["status"]) == (200, "cancelled")
    # Every delta precedes the terminal chunk, which is the last; then the stream ends cleanly.
    assert received == [(p, None) for p in SENT] + [("", "cancelled")]
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    message = events[1]["payload"]
    assert message["interrupted"] is True
    assert message["content"] == [{"type": "text", "text": "".join(SENT)}]
    assert events[2]["payload"] | {"duration_ms": 0, "usage": None, "metered": None} == {
        "status": "aborted",
        "reason": "client_cancel",
        "attempts": 1,
        "duration_ms": 0,
        "usage": None,
        "metered": None,
        "response_id": "chatcmpl-fake",  # the id of the chunks the client had
    }
    # Finished now: cancelling again finds nothing in progress.
    status, body = await gw.post("/v1/chat/completions/req-stop-1/cancel", {})
    assert status == 404
    assert body["error"]["type"] == "invalid_request_error"


async def test_cancel_before_the_upstream_answers(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(hang_before_headers())
    client = gw.client(default_headers={"X-Request-Id": "req-stop-2"})
    task = asyncio.create_task(
        client.chat.completions.create(model="fake", messages=QUESTION, stream=True)
    )
    await asyncio.wait_for(upstream.stalled.wait(), 5)
    status, _ = await gw.post("/v1/chat/completions/req-stop-2/cancel", {})
    assert status == 200
    stream = await task
    parts = [p async for p in stream]
    assert [p.choices[0].finish_reason for p in parts] == ["cancelled"]
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    await gw.flush()
    conversation_id = gw.query("SELECT conversation_id FROM turns")[0][0]
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/attempt", "turn/end"]
    assert events[1]["payload"]["reason"] == "empty_prefix"
    assert events[2]["payload"]["reason"] == "client_cancel"


async def test_cancel_a_non_streaming_request(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(hang_before_headers())
    client = gw.client(default_headers={"X-Request-Id": "req-stop-3"})
    task = asyncio.create_task(client.chat.completions.create(model="fake", messages=QUESTION))
    await asyncio.wait_for(upstream.stalled.wait(), 5)
    status, _ = await gw.post("/v1/chat/completions/req-stop-3/cancel", {})
    assert status == 200
    with pytest.raises(openai.ConflictError) as caught:
        await task
    assert caught.value.code == "request_cancelled"


async def test_cancel_of_an_unknown_request_is_404(gw: GatewayUnderTest) -> None:
    status, body = await gw.post("/v1/chat/completions/nope/cancel", {})
    assert status == 404
    assert "nope" in body["error"]["message"]
