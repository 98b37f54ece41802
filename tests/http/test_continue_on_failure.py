"""continue_on_failure: a stream cut after delivery began is finished by the next deployment."""

from __future__ import annotations

from typing import Any

import aiohttp

from gateway.pipeline.continuation import CONTINUE_PROMPT
from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import DONE, USAGE, FakeUpstream, chunk, frames

QUESTION = [{"role": "user", "content": "Greet the world."}]


async def setup(
    make_gateway: MakeGateway,
    make_upstream: MakeUpstream,
    conversations: dict[str, Any] | None = None,
    **alias: Any,
) -> tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]:
    a, b = await make_upstream(), await make_upstream()
    gw = await make_gateway(
        **({"conversations": conversations} if conversations else {}),
        models=[
            {
                "name": "m",
                "continue_on_failure": True,
                "retry": {"backoff_s": 0.01},
                "deployments": [
                    {"provider": "openai", "api_base": a.url, "name": "a"},
                    {"provider": "openai", "api_base": b.url, "name": "b"},
                ],
                **alias,
            }
        ],
    )
    return gw, a, b


def text_of(body: bytes) -> str:
    import json

    out = ""
    for frame in body.split(b"\n\n"):
        if frame.startswith(b"data: {"):
            obj = json.loads(frame[6:])
            if obj.get("choices"):
                out += obj["choices"][0]["delta"].get("content") or ""
    return out


async def test_the_next_deployment_continues_after_the_delivered_text(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, b = await setup(make_gateway, make_upstream)
    a.push(frames(chunk("Hello, "), chunk("wor"), then="reset"))
    b.push(frames(chunk("ld!"), chunk(finish="stop"), chunk(usage=USAGE, no_choices=True), DONE))
    body, conversation_id = await gw.post_stream(
        {"model": "m", "messages": QUESTION, "stream": True}
    )
    assert text_of(body) == "Hello, world!"  # spliced, nothing repeated
    assert body.endswith(DONE)
    assert b"error" not in body
    # b was asked to continue from exactly what the client had.
    assert b.requests[0]["messages"] == [
        *QUESTION,
        {"role": "assistant", "content": "Hello, wor"},
        {"role": "user", "content": CONTINUE_PROMPT},
    ]
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == [
        "user/message",
        "assistant/attempt",
        "request/error",
        "assistant/message",
        "turn/end",
    ]
    message = events[3]["payload"]
    assert message["interrupted"] is False
    assert [(s["route"]["deployment"], s["content"], s["usage"]) for s in message["segments"]] == [
        ("a", [{"type": "text", "text": "Hello, wor"}], None),
        ("b", [{"type": "text", "text": "ld!"}], USAGE),
    ]
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{gw.url}/v1/conversations/{conversation_id}/messages") as r:
            messages = (await r.json())["data"]
    assert messages[-1] == {"role": "assistant", "content": "Hello, world!"}
    assert events[4]["payload"]["status"] == "completed"


async def test_without_a_deployment_left_the_stream_ends_with_an_error(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, b = await setup(make_gateway, make_upstream, retry={"max_attempts": 1})
    a.push(frames(chunk("Hello, "), then="reset"))
    body, conversation_id = await gw.post_stream(
        {"model": "m", "messages": QUESTION, "stream": True}
    )
    assert text_of(body) == "Hello, "
    assert b'data: {"error":' in body
    assert b.requests == []
    events = await gw.wait_turn_end(conversation_id)
    assert events[-1]["payload"]["status"] == "error"


async def test_a_continuation_that_fails_before_content_moves_on(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, b = await setup(
        make_gateway, make_upstream, retry={"max_attempts": 4, "backoff_s": 0.01}
    )
    a.push(frames(chunk("Hel"), then="reset"), frames(chunk("lo."), chunk(finish="stop"), DONE))
    b.push(frames(then="reset"))  # fails before any content: nothing sent, try again
    body, conversation_id = await gw.post_stream(
        {"model": "m", "messages": QUESTION, "stream": True}
    )
    assert text_of(body) == "Hello."
    events = await gw.wait_turn_end(conversation_id)
    message = next(e for e in events if e["type"] == "assistant/message")["payload"]
    assert [s["route"]["deployment"] for s in message["segments"]] == ["a", "a"]


async def test_a_cancel_during_the_continuation_keeps_every_delivered_segment(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, b = await setup(make_gateway, make_upstream)
    a.push(frames(chunk("Hello, "), then="reset"))
    b.push(frames(chunk("wor"), then="stall"))
    response = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, stream=True
    )
    stream = response.parse()
    seen = ""
    async for part in stream:
        seen += part.choices[0].delta.content or ""
        if seen == "Hello, wor":
            break
    await stream.close()
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    message = next(e for e in events if e["type"] == "assistant/message")["payload"]
    assert message["interrupted"] is True
    assert "".join(b["text"] for b in message["content"]) == "Hello, wor"
    assert [(s["route"]["deployment"], s["content"]) for s in message["segments"]] == [
        ("a", [{"type": "text", "text": "Hello, "}]),
        ("b", [{"type": "text", "text": "wor"}]),
    ]
    assert events[-1]["payload"]["status"] == "aborted"


async def test_the_record_caps_count_every_attempt_of_the_turn(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    """A hostile upstream cannot double what a turn records by failing and being continued:
    the continuation is capped at what the attempt before it left of the turn's caps."""
    gw, a, b = await setup(make_gateway, make_upstream, conversations={"record_max_text_chars": 10})
    a.push(frames(chunk("Hello, "), chunk("wor"), then="reset"))  # 10: the whole cap
    b.push(frames(chunk("ld! And more."), chunk(finish="stop"), DONE))
    body, conversation_id = await gw.post_stream(
        {"model": "m", "messages": QUESTION, "stream": True}
    )
    assert text_of(body) == "Hello, world! And more."  # the client gets every byte
    events = await gw.wait_turn_end(conversation_id)
    message = next(e for e in events if e["type"] == "assistant/message")["payload"]
    assert [(s["route"]["deployment"], s["content"]) for s in message["segments"]] == [
        ("a", [{"type": "text", "text": "Hello, wor"}]),
        ("b", []),
    ]
    assert message["truncated_record"] is True
