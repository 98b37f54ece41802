"""What a user saw is what the model remembers: cancels record exactly the delivered prefix."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.stream.compact import expand
from gateway.stream.events import BlockDelta
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, frames, hang_before_headers

QUESTION = [{"role": "user", "content": "List three things."}]


async def _read_then_close(gw: GatewayUnderTest, k: int) -> tuple[str, list[Any]]:
    """The real SDK reads exactly k chunks, then closes the stream; returns the conversation id."""
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION, stream=True
    )
    stream = response.parse()
    got = []
    async for part in stream:
        got.append(part)
        if len(got) == k:
            break
    await stream.close()
    return response.headers["X-Conversation-Id"], got


async def test_cancel_mid_text_records_exactly_the_chunks_read(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    pieces = ["1. Apples", " are red.\n", "2. Pears", " are green.\n", "3. Plums"]
    upstream.push(frames(*(chunk(p) for p in pieces[:3]), then="stall"))
    conversation_id, got = await _read_then_close(gw, 3)
    assert "".join(p.choices[0].delta.content for p in got) == "".join(pieces[:3])

    await asyncio.wait_for(upstream.disconnected.wait(), 5)  # the upstream saw its client go
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    message = events[1]["payload"]
    assert message["interrupted"] is True
    assert message["surface_op"] == "append"
    assert message["delivery"] == "acked"
    assert message["content"] == [{"type": "text", "text": "".join(pieces[:3])}]
    deltas = [e.text for _, e in expand(message["stream"]) if isinstance(e, BlockDelta)]
    assert deltas == pieces[:3]
    end = events[2]["payload"]
    assert end["status"] == "aborted"
    assert end["reason"] == "client_disconnect"


async def test_reasoning_only_cancel_keeps_the_reasoning(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(
        frames(chunk(reasoning="Let me think"), chunk(reasoning=" about fruit."), then="stall")
    )
    conversation_id, _ = await _read_then_close(gw, 2)
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    assert events[1]["payload"]["content"] == [
        {"type": "reasoning", "text": "Let me think about fruit."}
    ]
    messages = await gw.messages(conversation_id)
    assert messages[-1] == {
        "role": "assistant",
        "content": "",
        "reasoning_content": "Let me think about fruit.",
    }


async def test_text_then_half_a_tool_call_keeps_the_text_and_drops_the_call(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": ""},
    }
    upstream.push(
        frames(
            chunk("Let me check."),
            chunk(tool=call),
            chunk(tool={"index": 0, "function": {"arguments": '{"q": "fr'}}),
            then="stall",
        )
    )
    conversation_id, _ = await _read_then_close(gw, 3)
    events = await gw.wait_turn_end(conversation_id)
    assert events[1]["type"] == "assistant/message"
    assert events[1]["payload"]["content"] == [{"type": "text", "text": "Let me check."}]
    # The delivered timed stream keeps the call's fragments for audit; history does not.
    kinds = [r["type"] for r in events[1]["payload"]["stream"]]
    assert kinds == ["text", "end", "tool_call"]
    messages = await gw.messages(conversation_id)
    assert messages[-1] == {"role": "assistant", "content": "Let me check."}


async def test_whitespace_only_output_is_an_empty_prefix_attempt(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(chunk("\n\n"), chunk("  "), then="stall"))
    conversation_id, _ = await _read_then_close(gw, 2)
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/attempt", "turn/end"]
    assert events[1]["payload"]["reason"] == "empty_prefix"
    assert events[2]["payload"]["status"] == "aborted"
    assert await gw.messages(conversation_id) == QUESTION


async def test_cancel_before_the_upstream_answers(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(hang_before_headers())
    client = gw.client()
    task = asyncio.create_task(
        client.chat.completions.create(model="fake", messages=QUESTION, stream=True)
    )
    await asyncio.wait_for(upstream.stalled.wait(), 5)
    task.cancel()
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    await gw.flush()
    conversation_id = gw.query("SELECT conversation_id FROM turns")[0][0]
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/attempt", "turn/end"]
    assert events[1]["payload"]["reason"] == "empty_prefix"
    end = events[2]["payload"]
    assert end | {"duration_ms": 0, "metered": None} == {
        "status": "aborted",
        "reason": "client_disconnect",
        "attempts": 1,
        "duration_ms": 0,
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
        "metered": None,
    }
    # The upstream had the prompt: metered as an estimate, with nothing generated.
    assert end["metered"]["usage_source"] == "estimated"
    assert end["metered"]["prompt_tokens"] > 0
    assert end["metered"]["completion_tokens"] == 0


async def test_non_streaming_client_that_leaves_before_the_body_gets_an_empty_prefix_attempt(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(hang_before_headers())
    client = gw.client()
    task = asyncio.create_task(client.chat.completions.create(model="fake", messages=QUESTION))
    await asyncio.wait_for(upstream.stalled.wait(), 5)
    task.cancel()
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    await gw.flush()
    conversation_id = gw.query("SELECT conversation_id FROM turns")[0][0]
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/attempt", "turn/end"]
    assert events[1]["payload"]["reason"] == "empty_prefix"
    assert events[2]["payload"]["status"] == "aborted"
    assert await gw.messages(conversation_id) == QUESTION


async def test_cancel_with_the_demo_provider(make_gateway: MakeGateway) -> None:
    """The newcomer's path: no key, cancel halfway, read the conversation back."""
    gw = await make_gateway(
        models=[{"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 20}]}]
    )
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="demo", messages=QUESTION, stream=True
    )
    stream = response.parse()
    seen = ""
    async for part in stream:
        seen += part.choices[0].delta.content or ""
        if len(seen) > 40:
            break
    await stream.close()
    conversation_id = response.headers["X-Conversation-Id"]
    events = await gw.wait_turn_end(conversation_id)
    message = events[1]["payload"]
    assert message["interrupted"] is True
    # What the SDK had read, plus at most what was already in its socket when it closed.
    recorded = message["content"][0]["text"]
    assert recorded.startswith(seen)
    assert len(recorded) < len(seen) + 30
    messages = await gw.messages(conversation_id)
    assert messages[-1] == {"role": "assistant", "content": recorded}
