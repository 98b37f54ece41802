"""A served turn leaves no reference cycle: its relay, and with it the request's whole object
graph, is freed as soon as its handler returns, never left to the cyclic collector (which
would walk and free every request's objects in its collections, on the event loop)."""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anthropic
import openai
import pytest
from aiohttp import web

from gateway.pipeline.relay import Relay
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, completion, replay
from tests.freed import all_freed, collector_off

QUESTION = [{"role": "user", "content": "What is the capital of the UK?"}]


class Served:
    """Every relay made meanwhile, and the aiohttp request each served, weakly."""

    def __init__(self) -> None:
        self.relays: list[weakref.ref[object]] = []
        self.requests: list[weakref.ref[object]] = []


@pytest.fixture
def served(monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    """What requests are served meanwhile; the cyclic collector off, so that only reference
    counting frees them."""
    made = Served()
    init = Relay.__init__

    def recording_init(
        self: Relay, gateway: Any, request: web.Request, *args: Any, **kw: Any
    ) -> None:
        init(self, gateway, request, *args, **kw)
        made.relays.append(weakref.ref(self))
        made.requests.append(weakref.ref(request))

    monkeypatch.setattr(Relay, "__init__", recording_init)
    with collector_off():
        yield made


async def _chat(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(completion("London."))
    await gw.client().chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "Capital of the UK?"}]
    )


async def _chat_stream(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(replay("openai-chat-text-usage.sse"))
    stream = await gw.client().chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "Capital of the UK?"}], stream=True
    )
    assert [c async for c in stream]


async def _messages_stream(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(replay("openai-chat-text-usage.sse"))
    async with (
        anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key", max_retries=0) as api,
        api.messages.stream(model="fake", max_tokens=100, messages=QUESTION) as stream,  # type: ignore[arg-type]
    ):
        assert "".join([t async for t in stream.text_stream])


async def _responses_stream(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(replay("openai-chat-text-usage.sse"))
    stream = await gw.client().responses.create(model="fake", input="Capital?", stream=True)
    assert [e.type async for e in stream][-1] == "response.completed"


async def _provider_error(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.http_error(400, "no such thing")
    with pytest.raises(openai.BadRequestError):
        await gw.client().chat.completions.create(
            model="fake", messages=[{"role": "user", "content": "Capital of the UK?"}]
        )


async def _client_leaves(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.stall_after(["London ", "is "])
    stream = await gw.client().chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "Capital of the UK?"}], stream=True
    )
    async for _ in stream:  # the first chunk
        break
    await stream.close()
    await asyncio.wait_for(upstream.disconnected.wait(), 5)


@pytest.mark.parametrize(
    "serve",
    [
        _chat,
        _chat_stream,
        _messages_stream,
        _responses_stream,
        _provider_error,
        _client_leaves,
    ],
    ids=[
        "chat",
        "chat-stream",
        "messages-stream",
        "responses-stream",
        "error",
        "client-leaves",
    ],
)
async def test_a_served_turn_is_freed_without_the_cyclic_collector(
    gw: GatewayUnderTest,
    upstream: FakeUpstream,
    served: Served,
    serve: Callable[[GatewayUnderTest, FakeUpstream], Awaitable[None]],
) -> None:
    await serve(gw, upstream)
    await all_freed(served.relays)


async def test_a_turn_answered_on_a_retry_is_freed_without_the_cyclic_collector(
    make_gateway: MakeGateway, upstream: FakeUpstream, served: Served
) -> None:
    retried = {"max_attempts": 2, "backoff_s": 0}
    gw = await make_gateway(
        [{"name": "fake", "retry": retried, "deployments": [upstream.deployment()]}]
    )
    upstream.http_error(503, "busy")  # the first attempt's error, kept by the plan
    upstream.push(completion("London."))
    answer = await gw.client().chat.completions.create(
        model="fake", messages=[{"role": "user", "content": "Capital of the UK?"}]
    )
    assert answer.choices[0].message.content == "London."
    assert len(upstream.requests) == 2
    await all_freed(served.relays)


async def test_a_stream_whose_client_left_frees_its_request(
    gw: GatewayUnderTest, upstream: FakeUpstream, served: Served
) -> None:
    """Its response never reaches its body's end, where aiohttp lets go of the request: nothing
    of the gateway's may hold the response from the request. (A client that keeps its
    connection open keeps its last request alive in aiohttp until the next one: this client
    closes it.)"""
    await _client_leaves(gw, upstream)
    await all_freed(served.relays + served.requests)
