"""Cache reads and writes at their own prices, reasoning at the output price: costs computed by
hand from the provider's own usage, through the real gateway and its fake upstreams."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.metering.prices import Price
from gateway.metering.usage import ProviderCounts, UsageRecord, provider_counts
from gateway.storage.db import Db
from gateway.storage.store import Store
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import DONE, FakeUpstream, chunk, frames, sse
from tests.providers.upstreams import AnthropicServer

HELLO = [{"role": "user", "content": "Summarise the attached contract."}]

# Claude Sonnet 4.5's list prices (the bundled map's `claude-sonnet-4-5`), USD per token.
SONNET = {
    "input_cost_per_token": 3e-06,
    "output_cost_per_token": 1.5e-05,
    "cache_read_input_token_cost": 3e-07,
    "cache_creation_input_token_cost": 3.75e-06,
    "cache_creation_input_token_cost_above_1hr": 6e-06,
}
# o3-mini's: cached input at half the input price.
O3_MINI = {
    "input_cost_per_token": 1.1e-06,
    "output_cost_per_token": 4.4e-06,
    "cache_read_input_token_cost": 5.5e-07,
}
COLUMNS = (
    "status",
    "usage_source",
    "prompt_tokens",
    "cached_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cost_usd",
)


def usage_row(gw: GatewayUnderTest) -> dict[str, Any]:
    [row] = gw.query(f"SELECT {', '.join(COLUMNS)} FROM usage")
    return dict(zip(COLUMNS, row, strict=True))


def anthropic_stream(start_usage: dict[str, Any], end_usage: dict[str, Any]) -> Any:
    """An Anthropic Messages stream whose `message_start` and `message_delta` carry these
    usages, as Anthropic sends them for a prompt that reads and writes the cache."""

    def event(obj: dict[str, Any]) -> bytes:
        return sse(obj, obj["type"])

    message = {
        "id": "msg_cache",
        "type": "message",
        "role": "assistant",
        "model": AnthropicServer.model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": start_usage,
    }
    body = [
        event({"type": "message_start", "message": message}),
        event({"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}),
        event(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "The contract says..."},
            }
        ),
        event({"type": "content_block_stop", "index": 0}),
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": end_usage,
            }
        ),
        event({"type": "message_stop"}),
    ]

    async def script(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for item in body:
            await response.write(item)
        await response.write_eof()
        return response

    return script


@pytest.fixture
async def claude(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AnthropicServer:
    return await AnthropicServer().start(aiohttp_server)


async def ask(gw: GatewayUnderTest, model: str) -> str:
    """A streamed chat completion read to its end; the conversation it was recorded in."""
    stream = await gw.client().chat.completions.with_raw_response.create(
        model=model, messages=HELLO, stream=True
    )
    async for _ in stream.parse():
        pass
    return stream.headers["X-Conversation-Id"]


async def test_anthropic_cache_writes_5m_and_1h_and_reads_each_at_their_price(
    make_gateway: MakeGateway, claude: AnthropicServer
) -> None:
    gw = await make_gateway(
        models=[{"name": "claude", "deployments": [claude.deployment(price=SONNET)]}]
    )
    # 50 plain input tokens, 10,000 read from the cache, 3,000 written to it: 2,000 for five
    # minutes and 1,000 for an hour; 400 output tokens (message_delta's count is cumulative).
    start = {
        "input_tokens": 50,
        "cache_creation_input_tokens": 3000,
        "cache_read_input_tokens": 10000,
        "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 1000},
        "output_tokens": 1,
    }
    claude.push(anthropic_stream(start, {"output_tokens": 400}))
    conversation_id = await ask(gw, "claude")
    events = await gw.wait_turn_end(conversation_id)
    # By hand, USD:
    #   plain input    50 x 3e-6    = 0.00015
    #   cache reads    10,000 x 3e-7   = 0.003
    #   5-minute writes 2,000 x 3.75e-6 = 0.0075
    #   1-hour writes   1,000 x 6e-6    = 0.006
    #   output          400 x 1.5e-5    = 0.006
    #   total                            0.02265
    # (All of the 13,050 prompt tokens at the input price would be 0.03975 + 0.006.)
    row = usage_row(gw)
    assert row == {
        "status": "completed",
        "usage_source": "provider",
        "prompt_tokens": 13050,
        "cached_tokens": 10000,
        "cache_write_5m_tokens": 2000,
        "cache_write_1h_tokens": 1000,
        "completion_tokens": 400,
        "reasoning_tokens": 0,
        "cost_usd": pytest.approx(0.02265, abs=1e-12),
    }
    metered = events[-1]["payload"]["metered"]
    assert (metered["cache_write_5m_tokens"], metered["cache_write_1h_tokens"]) == (2000, 1000)
    assert metered["cost_usd"] == pytest.approx(0.02265, abs=1e-12)


async def test_anthropic_cache_writes_without_a_split_are_five_minute_ones(
    make_gateway: MakeGateway, claude: AnthropicServer
) -> None:
    # Without an hour price of its own, an hour's write is billed at the five-minute one's.
    price = {k: v for k, v in SONNET.items() if k != "cache_creation_input_token_cost_above_1hr"}
    gw = await make_gateway(
        models=[{"name": "claude", "deployments": [claude.deployment(price=price)]}]
    )
    start = {
        "input_tokens": 10,
        "cache_creation_input_tokens": 1000,
        "cache_read_input_tokens": 0,
        "output_tokens": 1,
    }
    claude.push(anthropic_stream(start, {"output_tokens": 20}))
    await gw.wait_turn_end(await ask(gw, "claude"))
    row = usage_row(gw)
    assert (row["cache_write_5m_tokens"], row["cache_write_1h_tokens"]) == (1000, 0)
    # 10 x 3e-6 + 1,000 x 3.75e-6 + 20 x 1.5e-5 = 0.00003 + 0.00375 + 0.0003
    assert row["cost_usd"] == pytest.approx(0.00408, abs=1e-12)


async def test_openai_cached_input_at_its_price_and_reasoning_at_the_output_price(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(
        models=[{"name": "o3", "deployments": [upstream.deployment(price=O3_MINI)]}]
    )
    usage = {
        "prompt_tokens": 2000,
        "completion_tokens": 800,
        "total_tokens": 2800,
        "prompt_tokens_details": {"cached_tokens": 1500, "audio_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 600, "audio_tokens": 0},
    }
    upstream.push(
        frames(chunk("Done."), chunk(finish="stop"), chunk(usage=usage, no_choices=True), DONE)
    )
    await gw.wait_turn_end(await ask(gw, "o3"))
    # By hand: 500 uncached x 1.1e-6 = 0.00055; 1,500 cached x 5.5e-7 = 0.000825;
    # 800 completion (600 of them reasoning, all output) x 4.4e-6 = 0.00352; total 0.004895.
    assert usage_row(gw) == {
        "status": "completed",
        "usage_source": "provider",
        "prompt_tokens": 2000,
        "cached_tokens": 1500,
        "cache_write_5m_tokens": 0,
        "cache_write_1h_tokens": 0,
        "completion_tokens": 800,
        "reasoning_tokens": 600,
        "cost_usd": pytest.approx(0.004895, abs=1e-12),
    }


# -- the counts each price applies to -----------------------------------------------------------


def test_litellm_usage_names_cache_writes_its_own_way() -> None:
    # litellm's Anthropic usage: prompt_tokens holds reads and writes, the split in details.
    usage = {
        "prompt_tokens": 1300,
        "completion_tokens": 10,
        "total_tokens": 1310,
        "cache_creation_input_tokens": 200,
        "cache_read_input_tokens": 1000,
        "prompt_tokens_details": {
            "cached_tokens": 1000,
            "cache_creation_tokens": 200,
            "cache_creation_token_details": {
                "ephemeral_5m_input_tokens": 50,
                "ephemeral_1h_input_tokens": 150,
            },
        },
    }
    assert provider_counts(usage) == ProviderCounts(1300, 10, 0, 1000, 50, 150)


def test_reasoning_counted_beside_the_completion_is_added_to_it() -> None:
    # A provider whose completion_tokens leave the reasoning out (its total adds it).
    beside = {
        "prompt_tokens": 100,
        "completion_tokens": 50,
        "total_tokens": 750,
        "completion_tokens_details": {"reasoning_tokens": 600},
    }
    assert provider_counts(beside) == ProviderCounts(100, 650, 600, 0, 0, 0)
    # OpenAI's, where it is inside: unchanged.
    inside = {**beside, "completion_tokens": 650, "total_tokens": 750}
    assert provider_counts(inside) == ProviderCounts(100, 650, 600, 0, 0, 0)


def test_a_price_without_cache_prices_bills_the_cache_as_input() -> None:
    price = Price(input=2e-6, output=8e-6)
    # 1,000 prompt tokens, 300 read and 200 written (100 of them for an hour): all at input.
    assert price.cost(1000, 10, 300, 100, 100) == pytest.approx(1000 * 2e-6 + 10 * 8e-6)
    own = Price(input=2e-6, output=8e-6, cache_read=1e-7, cache_write=3e-6, cache_write_1h=4e-6)
    expected = 400 * 2e-6 + 300 * 1e-7 + 200 * 3e-6 + 100 * 4e-6 + 10 * 8e-6
    assert own.cost(1000, 10, 300, 200, 100) == pytest.approx(expected)


# -- the columns, in both stores -----------------------------------------------------------------


async def test_cache_writes_are_columns_of_the_usage_table(store: Store) -> None:
    record = UsageRecord(
        id="t:1",
        turn_id="t",
        conversation_id="c",
        team_id=None,
        key_id=None,
        user=None,
        alias="claude",
        deployment="d",
        provider="anthropic",
        model="m",
        created_at=1.0,
        status="completed",
        prompt_tokens=13050,
        completion_tokens=400,
        completion_delivered=400,
        reasoning_tokens=0,
        cached_tokens=10000,
        usage_source="provider",
        cost_usd=0.02265,
        ttft_ms=None,
        duration_ms=None,
        cache_write_5m_tokens=2000,
        cache_write_1h_tokens=1000,
    )
    store.write("usage", record.row())
    # A row an older gateway spooled, before these columns: replayed with none.
    old = {k: v for k, v in record.row().items() if not k.startswith("cache_write")}
    store.write("usage", {**old, "id": "u:1", "turn_id": "u"})
    await store.flush()

    async def read(db: Db) -> list[Any]:
        return list(
            await db.fetch(
                "SELECT id, cache_write_5m_tokens, cache_write_1h_tokens FROM usage ORDER BY id"
            )
        )

    rows = [tuple(r) for r in await store.run(read)]
    assert rows == [("t:1", 2000, 1000), ("u:1", None, None)]
