"""Each turn keeps the id of the answer its client was sent (the upstream's, when its bytes were
relayed unchanged; the gateway's, when it rendered the answer in the client's dialect), and that
id finds the conversation in the list and names the turn in its event log."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, completion, frames, replay
from tests.http.test_anthropic_upstream import FakeAnthropic
from tests.http.test_anthropic_upstream import gateway as anthropic_gateway

QUESTION = [{"role": "user", "content": "What is the capital of the UK?"}]
CAPTURED_ID = "chatcmpl-Dx0Xq5Xx9rHB2ehcHZCRDsnuymUXc"  # in openai-chat-text-usage.sse


async def get(gw: GatewayUnderTest, path: str) -> Any:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            gw.url + path, headers={"Authorization": "Bearer test-key"}
        ) as response:
            assert response.status == 200, await response.text()
            return await response.json()


async def recorded(gw: GatewayUnderTest, conversation_id: str) -> str | None:
    """The turn's response id, as the event log's `turns` and its `turn/end` both say it."""
    events = await gw.wait_turn_end(conversation_id)
    [turn] = (await get(gw, f"/v1/conversations/{conversation_id}/events"))["turns"]
    assert events[-1]["payload"].get("response_id") == turn["response_id"]
    return turn["response_id"]  # type: ignore[no-any-return]


async def found_by(gw: GatewayUnderTest, answer_id: str) -> list[str]:
    return [c["id"] for c in (await get(gw, f"/v1/conversations?id={answer_id}"))["data"]]


def anthropic_client(gw: GatewayUnderTest) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key", max_retries=0)


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(
    request: pytest.FixtureRequest, make_gateway: MakeGateway, upstream: FakeUpstream
) -> GatewayUnderTest:
    store = {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    return await make_gateway(upstream=upstream, store=store)


async def test_a_relayed_stream_keeps_the_upstreams_id_and_it_finds_the_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(replay("openai-chat-text-usage.sse"), completion("London."))
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION, stream=True
    )
    seen = {part.id async for part in raw.parse()}
    assert seen == {CAPTURED_ID}
    conversation_id = raw.headers["X-Conversation-Id"]
    assert await recorded(gw, conversation_id) == CAPTURED_ID
    await gw.client().chat.completions.create(model="fake", messages=QUESTION)  # another one
    assert await found_by(gw, CAPTURED_ID) == [conversation_id]
    assert await found_by(gw, CAPTURED_ID[:-1]) == []  # exact, not a prefix


async def test_a_relayed_whole_answer_keeps_the_upstreams_id(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(completion("London."))
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION
    )
    assert raw.parse().id == "chatcmpl-fake"
    assert await recorded(gw, raw.headers["X-Conversation-Id"]) == "chatcmpl-fake"


async def test_an_answer_rendered_in_anthropics_dialect_keeps_the_id_the_client_saw(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(replay("openai-chat-text-usage.sse"), completion("London."))
    async with anthropic_client(gw) as api:
        raw = await api.messages.with_raw_response.create(
            model="fake", max_tokens=100, messages=QUESTION, stream=True
        )
        ids = {e.message.id async for e in await raw.parse() if e.type == "message_start"}
        whole = await api.messages.with_raw_response.create(
            model="fake", max_tokens=100, messages=QUESTION
        )
    [streamed] = ids
    assert streamed.startswith("msg_") and streamed != CAPTURED_ID
    assert await recorded(gw, raw.headers["X-Conversation-Id"]) == streamed
    message = await whole.parse()
    assert message.id.startswith("msg_") and message.id != streamed
    assert await recorded(gw, whole.headers["X-Conversation-Id"]) == message.id
    assert await found_by(gw, message.id) == [whole.headers["X-Conversation-Id"]]


async def test_a_stream_the_client_left_keeps_the_id_it_was_sent(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(chunk("London "), chunk("is"), then="stall"))
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION, stream=True
    )
    stream = raw.parse()
    async for part in stream:
        if part.choices and part.choices[0].delta.content == "is":
            break
    await stream.close()
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    assert await recorded(gw, raw.headers["X-Conversation-Id"]) == "chatcmpl-fake"


async def test_a_failure_before_any_answer_has_no_response_id(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.http_error(400, "bad request")
    with pytest.raises(openai.BadRequestError) as refused:
        await gw.client().chat.completions.create(model="fake", messages=QUESTION)
    assert await recorded(gw, refused.value.response.headers["X-Conversation-Id"]) is None


async def test_an_anthropic_upstreams_message_id_passes_through(
    make_gateway: MakeGateway, aiohttp_server: Any
) -> None:
    fake = FakeAnthropic()
    fake.server = await aiohttp_server(fake.app)  # type: ignore[attr-defined]
    gw = await anthropic_gateway(make_gateway, fake)
    async with anthropic_client(gw) as api:
        raw = await api.messages.with_raw_response.create(
            model="claude", max_tokens=100, messages=QUESTION, stream=True
        )
        ids = {e.message.id async for e in await raw.parse() if e.type == "message_start"}
    assert ids == {"msg_01ALwQ87pTS7hH1PjSdC9wJD"}  # in anthropic-thinking-text.sse
    assert await recorded(gw, raw.headers["X-Conversation-Id"]) == "msg_01ALwQ87pTS7hH1PjSdC9wJD"
