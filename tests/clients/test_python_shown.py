"""clients/python/gateway_shown.py with the real `openai` and `anthropic` SDKs: an app that
renders slowly and stops leaves the record equal to what it showed, byte for byte.

Each test runs the gateway and a fake OpenAI-compatible upstream on loopback. The sync SDKs run
on a thread (the gateway serves on this test's event loop). "The whole answer was delivered" is
waited for as the gateway's own record of the turn's end, never as a pause.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import AsyncExitStack, ExitStack
from typing import Any

import anthropic
import gateway_shown
import openai
import pytest
from gateway_shown import AsyncShownStream, ShownReportError, ShownStream, text_of

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import DONE, FakeUpstream, chunk, paused

QUESTION = "Three tips, please."
PARTS = ["Hi 👋 ", "世界! ", "1. 🍎 Eat well. ", "2. 睡觉 ", "3. Drink water."]
TEXT = "".join(PARTS)
PIECES = 2  # how many pieces the app had rendered when the user pressed Stop

FLAVOURS = ["openai_chat", "openai_responses", "anthropic_create", "anthropic_stream"]


# -- the app: opens a stream with one SDK, renders pieces, stops ------------------------------


def piece(flavour: str, item: Any) -> str:
    """The text the app renders from one item, the way that SDK's examples read it."""
    if flavour == "anthropic_stream":
        return str(item.text) if item.type == "text" else ""
    return text_of(item)


def open_sync(gw: GatewayUnderTest, flavour: str, stack: ExitStack) -> Any:
    if flavour.startswith("openai"):
        client = stack.enter_context(
            openai.OpenAI(base_url=gw.url + "/v1", api_key="test-key", max_retries=0)
        )
        if flavour == "openai_chat":
            return client.chat.completions.create(
                model="fake", messages=[{"role": "user", "content": QUESTION}], stream=True
            )
        return client.responses.create(model="fake", input=QUESTION, stream=True)
    claude = stack.enter_context(
        anthropic.Anthropic(base_url=gw.url, api_key="test-key", max_retries=0)
    )
    request: dict[str, Any] = {
        "model": "fake",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    if flavour == "anthropic_create":
        return claude.messages.with_raw_response.create(**request, stream=True)
    return stack.enter_context(claude.messages.stream(**request))


async def open_async(gw: GatewayUnderTest, flavour: str, stack: AsyncExitStack) -> Any:
    if flavour.startswith("openai"):
        client = gw.client()
        if flavour == "openai_chat":
            return await client.chat.completions.with_raw_response.create(
                model="fake", messages=[{"role": "user", "content": QUESTION}], stream=True
            )
        return await client.responses.create(model="fake", input=QUESTION, stream=True)
    claude = await stack.enter_async_context(
        anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key", max_retries=0)
    )
    request: dict[str, Any] = {
        "model": "fake",
        "max_tokens": 200,
        "messages": [{"role": "user", "content": QUESTION}],
    }
    if flavour == "anthropic_create":
        return await claude.messages.create(**request, stream=True)
    return await stack.enter_async_context(claude.messages.stream(**request))


async def slow_reader_async(
    gw: GatewayUnderTest, flavour: str, before_stop: Callable[[str], Any]
) -> tuple[str, AsyncShownStream]:
    """Render PIECES pieces, call `before_stop(conversation_id)`, stop. (shown, wrapper)"""
    shown = ""
    async with AsyncExitStack() as stack:
        stream = AsyncShownStream(await open_async(gw, flavour, stack))
        async with stream:
            rendered = 0
            async for item in stream:
                text = piece(flavour, item)
                if text:
                    shown += text
                    rendered += 1
                if rendered == PIECES:
                    await before_stop(stream.response.headers["X-Conversation-Id"])
                    break
    return shown, stream


def slow_reader_sync(
    gw: GatewayUnderTest, flavour: str, before_stop: Callable[[str], Any]
) -> tuple[str, ShownStream]:
    shown = ""
    with ExitStack() as stack:
        stream = ShownStream(open_sync(gw, flavour, stack))
        with stream:
            rendered = 0
            for item in stream:
                text = piece(flavour, item)
                if text:
                    shown += text
                    rendered += 1
                if rendered == PIECES:
                    before_stop(stream.response.headers["X-Conversation-Id"])
                    break
    return shown, stream


async def recorded_answer(gw: GatewayUnderTest, conversation_id: str) -> str:
    messages = await gw.messages(conversation_id)
    assert messages[-1]["role"] == "assistant"
    return str(messages[-1]["content"])


def turn_status(events: list[dict[str, Any]]) -> str:
    return str(next(e["payload"]["status"] for e in events if e["type"] == "turn/end"))


# -- the slow renderer ------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_a_slow_reader_that_stops_is_recorded_as_it_showed(
    gw: GatewayUnderTest, upstream: FakeUpstream, flavour: str, mode: str
) -> None:
    """The whole answer reached the app's socket (the turn ended completed) while it had
    rendered two pieces; it stops there, and the record is those two pieces."""
    upstream.text(PARTS)
    ended: list[dict[str, Any]] = []

    async def whole_answer_delivered(conversation_id: str) -> None:
        ended.extend(await gw.wait_turn_end(conversation_id))

    if mode == "async":
        shown, stream = await slow_reader_async(gw, flavour, whole_answer_delivered)
    else:
        loop = asyncio.get_running_loop()

        def wait(conversation_id: str) -> None:
            coroutine = whole_answer_delivered(conversation_id)
            asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout=30)

        shown, stream = await asyncio.to_thread(slow_reader_sync, gw, flavour, wait)
    assert turn_status(ended) == "completed"
    assert shown == TEXT[: len(shown)] and 0 < len(shown) < len(TEXT)
    assert stream.truncation is not None
    assert stream.truncation["content"] == shown
    conversation_id = stream.response.headers["X-Conversation-Id"]
    assert await recorded_answer(gw, conversation_id) == shown


@pytest.mark.parametrize("flavour", ["openai_chat", "anthropic_create"])
async def test_a_stop_while_the_answer_streams_is_recorded_as_shown(
    gw: GatewayUnderTest, upstream: FakeUpstream, flavour: str
) -> None:
    """The app stops while the turn is still running: the gateway records what its socket
    received (more than was rendered), then the report cuts it to what was shown."""
    upstream.stall_after(PARTS)

    async def nothing(conversation_id: str) -> None:
        pass

    shown, stream = await slow_reader_async(gw, flavour, nothing)
    conversation_id = stream.response.headers["X-Conversation-Id"]
    events = await gw.wait_turn_end(conversation_id)
    assert turn_status(events) == "aborted"
    assert stream.truncation is not None and stream.truncation["content"] == shown
    assert await recorded_answer(gw, conversation_id) == shown


async def test_a_report_sent_before_the_turn_has_ended_is_sent_again(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The turn ends only once the upstream is drained (`on_client_disconnect: drain`), which
    the test holds back until the helper's first report was answered `409 turn_in_progress`:
    the helper asks again, and the record ends as shown."""
    fake = await make_upstream()
    model = {
        "name": "m",
        "on_client_disconnect": "drain",
        "deployments": [{"provider": "openai", "api_base": fake.url}],
    }
    gw = await make_gateway(models=[model])
    fake.push(paused([chunk("One, "), chunk("two, ")], [chunk(finish="stop"), DONE]))
    loop = asyncio.get_running_loop()
    refused = asyncio.Event()
    answers: list[tuple[int, Any]] = []
    post = gateway_shown._post

    def watched_post(*args: Any) -> tuple[int, Any]:
        status, body = post(*args)
        answers.append((status, body))
        if status == 409:
            loop.call_soon_threadsafe(refused.set)
        return status, body

    monkeypatch.setattr(gateway_shown, "_post", watched_post)
    response = await gw.client().chat.completions.create(
        model="m", messages=[{"role": "user", "content": QUESTION}], stream=True
    )
    stream = AsyncShownStream(response)
    async for item in stream:
        if text_of(item):
            break
    closing = asyncio.create_task(stream.close())
    await asyncio.wait_for(refused.wait(), 10)
    fake.release.set()
    truncation = await asyncio.wait_for(closing, 20)
    assert truncation is not None and truncation["content"] == "One, "
    assert answers[0][1]["error"]["code"] == "turn_in_progress"
    assert answers[-1][0] == 200
    conversation_id = response.response.headers["X-Conversation-Id"]
    assert await recorded_answer(gw, conversation_id) == "One, "


async def test_manual_counting_leaves_out_a_piece_taken_but_not_shown(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """The user pressed Stop between the loop taking a piece and rendering it."""
    upstream.text(PARTS)
    response = await gw.client().chat.completions.create(
        model="fake", messages=[{"role": "user", "content": QUESTION}], stream=True
    )
    conversation_id = response.response.headers["X-Conversation-Id"]
    shown = ""
    async with AsyncShownStream(response, manual=True) as stream:
        async for item in stream:
            text = text_of(item)
            if text and shown:
                await gw.wait_turn_end(conversation_id)
                break  # Stop: this piece is never rendered
            shown += text
            stream.shown(text)
    assert shown == PARTS[0]
    assert await recorded_answer(gw, conversation_id) == shown


async def test_an_answer_read_and_shown_to_its_end_is_not_reported(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.text(PARTS)
    response = await gw.client().chat.completions.create(
        model="fake", messages=[{"role": "user", "content": QUESTION}], stream=True
    )
    async with AsyncShownStream(response) as stream:
        shown = "".join([text_of(item) async for item in stream])
    assert shown == TEXT
    assert stream.truncation is None
    conversation_id = response.response.headers["X-Conversation-Id"]
    events = await gw.wait_turn_end(conversation_id)
    assert not [e for e in events if e["type"] == "assistant/truncate"]


async def test_a_server_that_is_not_the_gateway_gets_no_report(upstream: FakeUpstream) -> None:
    upstream.text(PARTS)
    async with openai.AsyncOpenAI(base_url=upstream.url, api_key="k", max_retries=0) as client:
        response = await client.chat.completions.create(
            model="fake-model", messages=[{"role": "user", "content": QUESTION}], stream=True
        )
        async with AsyncShownStream(response) as stream:
            async for _ in stream:
                break
    assert stream.truncation is None
    assert len(upstream.requests) == 1


async def test_a_refused_report_raises(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    """A report the gateway refuses is an error the app sees, not a silent gap."""
    upstream.text(PARTS)
    response = await gw.client().chat.completions.create(
        model="fake", messages=[{"role": "user", "content": QUESTION}], stream=True
    )
    stream = AsyncShownStream(response, manual=True)
    async for item in stream:
        if text_of(item):
            break
    stream.shown(TEXT + "more than was ever sent")
    with pytest.raises(ShownReportError) as refused:
        await stream.close()
    assert refused.value.status == 400
    assert refused.value.body["error"]["code"] == "content_chars_past_delivered"
