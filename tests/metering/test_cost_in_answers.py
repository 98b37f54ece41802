"""What an answer cost, where clients look: `X-Gateway-Cost-USD` on a whole answer, and
`usage.cost_usd` in a stream's usage chunk when the client asked for usage. The same figure as
the usage row and the turn's end, never one computed apart."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream
from tests.providers.upstreams import AnthropicServer

HELLO = [{"role": "user", "content": "Hello"}]
PRICE = {"input_cost_per_mtok": 2.5, "output_cost_per_mtok": 10}


@pytest.fixture
async def claude(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AnthropicServer:
    return await AnthropicServer().start(aiohttp_server)


async def priced(make_gateway: MakeGateway, deployment: dict[str, Any]) -> GatewayUnderTest:
    models = [{"name": "m", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    return await make_gateway(models)


async def billed(gw: GatewayUnderTest, conversation_id: str) -> float:
    """The turn's cost as its usage row holds it, and as its end says (the same)."""
    events = await gw.wait_turn_end(conversation_id)
    [(cost,)] = gw.query("SELECT cost_usd FROM usage WHERE conversation_id = ?", conversation_id)
    assert events[-1]["payload"]["metered"]["cost_usd"] == pytest.approx(cost, abs=1e-10)
    assert cost > 0
    return float(cost)


async def test_a_whole_answer_says_its_cost_in_a_header(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    upstream = await FakeUpstream(plain_answer="Hello there").start(aiohttp_server)
    gw = await priced(make_gateway, upstream.deployment(**PRICE))
    raw = await gw.client().chat.completions.with_raw_response.create(model="m", messages=HELLO)  # type: ignore[arg-type]
    header = raw.headers["X-Gateway-Cost-USD"]
    assert "e" not in header  # plain decimal notation, as a spreadsheet reads it
    assert float(header) == pytest.approx(await billed(gw, raw.headers["X-Conversation-Id"]))
    assert raw.parse().choices[0].message.content == "Hello there"


async def test_a_stream_that_asked_for_usage_gets_its_cost_in_the_usage_chunk(
    upstream: FakeUpstream, make_gateway: MakeGateway
) -> None:
    gw = await priced(make_gateway, upstream.deployment(**PRICE))
    upstream.text(["Hel", "lo"])
    stream = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=HELLO, stream=True, stream_options={"include_usage": True}
    )  # type: ignore[call-overload]
    chunks = [chunk async for chunk in stream.parse()]
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens > 0
    assert usage.model_extra is not None  # the SDK keeps the field as an extra
    cost = await billed(gw, stream.headers["X-Conversation-Id"])
    assert usage.model_extra["cost_usd"] == pytest.approx(cost, abs=1e-10)


async def test_a_stream_that_did_not_ask_for_usage_has_no_usage_chunk(
    upstream: FakeUpstream, make_gateway: MakeGateway
) -> None:
    gw = await priced(make_gateway, upstream.deployment(**PRICE))
    upstream.text(["Hel", "lo"])
    raw, conversation_id = await gw.post_stream({"model": "m", "messages": HELLO, "stream": True})
    assert b"cost_usd" not in raw and b'"usage"' not in raw
    await billed(gw, conversation_id)  # metered all the same


async def test_a_stream_rendered_from_another_wire_format_carries_its_cost(
    make_gateway: MakeGateway, claude: AnthropicServer
) -> None:
    gw = await priced(make_gateway, claude.deployment(**PRICE))
    claude.text(["Hel", "lo"])
    body = {
        "model": "m",
        "messages": HELLO,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    raw, conversation_id = await gw.post_stream(body)
    frames = [json.loads(f[6:]) for f in raw.decode().split("\n\n") if f.startswith("data: {")]
    [usage] = [f["usage"] for f in frames if f.get("usage")]
    assert usage["cost_usd"] == pytest.approx(await billed(gw, conversation_id), abs=1e-10)


async def test_an_anthropic_client_gets_the_header_too(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    upstream = await FakeUpstream(plain_answer="Hello there").start(aiohttp_server)
    gw = await priced(make_gateway, upstream.deployment(**PRICE))
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="k", max_retries=0)
    try:
        raw = await client.messages.with_raw_response.create(
            model="m", max_tokens=50, messages=[{"role": "user", "content": "Hello"}]
        )
    finally:
        await client.close()
    cost = await billed(gw, raw.headers["X-Conversation-Id"])
    assert float(raw.headers["X-Gateway-Cost-USD"]) == pytest.approx(cost)


async def test_an_unpriced_answer_says_no_cost(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    upstream = await FakeUpstream(plain_answer="Hello").start(aiohttp_server)
    gw = await priced(make_gateway, {**upstream.deployment(), "model": "an-unknown-model"})
    raw = await gw.client().chat.completions.with_raw_response.create(model="m", messages=HELLO)  # type: ignore[arg-type]
    assert "X-Gateway-Cost-USD" not in raw.headers


async def test_embeddings_and_api_calls_say_their_cost_too(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    from tests.http.test_media_endpoints import setup

    gw, _, key, _ = await setup(make_gateway, aiohttp_server)
    client = gw.client(key)
    made = await client.images.with_raw_response.generate(
        model="img", prompt="a lighthouse", n=2, size="1024x1024", quality="low"
    )
    assert float(made.headers["X-Gateway-Cost-USD"]) == pytest.approx(2 * 0.011)

    upstream = await FakeUpstream().start(aiohttp_server)
    priced = upstream.deployment(input_cost_per_mtok=0.02, output_cost_per_mtok=0)
    gw = await make_gateway([{"name": "e", "deployments": [priced]}])
    embedded = await gw.client().embeddings.with_raw_response.create(model="e", input="hi")
    await gw.flush()
    [(cost,)] = gw.query("SELECT cost_usd FROM usage WHERE endpoint = 'embeddings'")
    assert float(embedded.headers["X-Gateway-Cost-USD"]) == pytest.approx(cost) and cost > 0
