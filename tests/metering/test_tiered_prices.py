"""Prices above a prompt length: a prompt past a tier of the model's entry (Gemini 2.5 Pro
above 200k tokens, Claude on Bedrock above 200k, GPT-5.4 above 272k) is billed at that tier's
prices for every kind of token, as litellm's own cost functions bill it, to the micro-dollar;
and a usage row records the tier's unit prices it was charged at."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.metering.prices import lookup, price_map
from gateway.providers.litellm_adapter import load_litellm
from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream
from tests.metering.budgeted import MASTER

MICRO = 1e-6
# Entries of the bundled map with a tier, and the prompt length it starts above.
TIERED = [
    ("gemini/gemini-2.5-pro", 200_000),
    ("anthropic.claude-sonnet-4-5-20250929-v1:0", 200_000),
    ("azure/gpt-5.4", 272_000),
]


def litellm_cost(model: str, prompt: int, completion: int, cached: int) -> float:
    litellm = load_litellm()
    prompt_cost, completion_cost = litellm.cost_per_token(
        model=model,
        prompt_tokens=prompt,
        completion_tokens=completion,
        cache_read_input_tokens=cached,
    )
    return float(prompt_cost + completion_cost)


@pytest.mark.parametrize(("model", "above"), TIERED)
@pytest.mark.parametrize("past", [-50_000, 0, 1, 150_000])
def test_a_tier_is_billed_as_litellm_bills_it(model: str, above: int, past: int) -> None:
    price = lookup(model, "litellm", price_map())
    assert price is not None and [t.above for t in price.tiers] == [above]
    prompt, completion, cached = above + past, 3_000, 20_000
    ours = price.cost(prompt, completion, cached)
    assert ours == pytest.approx(litellm_cost(model, prompt, completion, cached), abs=MICRO)
    flat = price.at(0)  # the entry's own prices, for any prompt
    billed_flat = price.cost(prompt, completion, cached) == pytest.approx(
        flat.input * (prompt - cached) + flat.output * completion + (flat.cache_read or 0) * cached
    )
    assert billed_flat == (past <= 0)  # past the tier's start: dearer


async def test_a_usage_row_is_charged_at_its_tier(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    upstream.model = "gemini-2.5-pro"  # priced from the bundled map
    prompt, completion = 250_000, 1_000

    async def answer(request: web.Request) -> web.StreamResponse:
        usage = {"prompt_tokens": prompt, "completion_tokens": completion}
        message = {"role": "assistant", "content": "ok"}
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": upstream.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
        )

    models: list[dict[str, Any]] = [
        {"name": "pro", "retry": {"max_attempts": 1}, "deployments": [upstream.deployment()]}
    ]
    gw = await make_gateway(models=models, auth={"master_key": MASTER})
    upstream.push(answer)
    await gw.client(api_key=MASTER).chat.completions.create(
        model="pro", messages=[{"role": "user", "content": "Hello"}]
    )
    await gw.flush()
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session,
        session.get(gw.url + "/v1/usage/requests?format=jsonl") as r,
    ):
        [row] = [json.loads(line) for line in (await r.text()).splitlines()]
    expected = litellm_cost("gemini/gemini-2.5-pro", prompt, completion, 0)
    assert row["cost_usd"] == pytest.approx(expected, abs=MICRO)
    assert row["prices"]["input"] == pytest.approx(2.5e-6)  # the tier's, not 1.25e-6
    assert row["prices"]["output"] == pytest.approx(1.5e-5)
    assert row["price_source"] == "bundled map (gemini-2.5-pro)"
