"""OpenAI's service tiers priced as served: an answer the provider says it served at `priority`
or `flex` (its `service_tier`) is billed at that tier's prices, as litellm's cost function bills
it, to the micro-dollar; the default tier at the entry's own."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp import web

from gateway.metering.prices import lookup, price_map
from gateway.providers.litellm_adapter import load_litellm
from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream

MICRO = 1e-6
USAGE = {
    "prompt_tokens": 20_000,
    "completion_tokens": 3_000,
    "total_tokens": 23_000,
    "prompt_tokens_details": {"cached_tokens": 5_000},
}


def litellm_cost(model: str, tier: str | None) -> float:
    litellm = load_litellm()
    prompt_cost, completion_cost = litellm.cost_per_token(
        model=model,
        custom_llm_provider="openai",
        usage_object=litellm.Usage(**USAGE),
        service_tier=tier,
    )
    return float(prompt_cost + completion_cost)


@pytest.mark.parametrize("tier", ["priority", "flex", None])
def test_a_tier_is_billed_as_litellm_bills_it(tier: str | None) -> None:
    price = lookup("gpt-5", "openai", price_map())
    assert price is not None
    served = price.for_service_tier(tier)
    ours = served.cost(20_000, 3_000, 5_000)
    assert ours == pytest.approx(litellm_cost("gpt-5", tier), abs=MICRO)
    if tier is not None:
        assert ours != price.cost(20_000, 3_000, 5_000)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_an_answer_served_at_priority_is_recorded_at_its_price(
    make_gateway: MakeGateway, upstream: FakeUpstream, stream: bool
) -> None:
    def body(obj: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": "chatcmpl-t",
            "created": 1,
            "model": "gpt-5",
            "service_tier": "priority",
            **obj,
        }

    async def answer(request: web.Request) -> web.StreamResponse:
        if not stream:
            message = {"role": "assistant", "content": "Fast."}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response(
                body({"object": "chat.completion", "choices": [choice], "usage": USAGE})
            )
        response = await upstream.start_sse(request)
        for chunk in (
            {"choices": [{"index": 0, "delta": {"content": "Fast."}, "finish_reason": None}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"choices": [], "usage": USAGE},
        ):
            await upstream.write(
                response,
                b"data: "
                + orjson.dumps(body({"object": "chat.completion.chunk", **chunk}))
                + b"\n\n",
            )
        await upstream.write(response, b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    deployment = {**upstream.deployment(), "model": "gpt-5"}
    gw = await make_gateway([{"name": "g", "deployments": [deployment]}])
    upstream.push(answer)
    client = gw.client()
    if stream:
        async for _ in await client.chat.completions.create(
            model="g", messages=[{"role": "user", "content": "Hi"}], stream=True
        ):
            pass
    else:
        await client.chat.completions.create(
            model="g", messages=[{"role": "user", "content": "Hi"}]
        )
    await gw.flush()
    [(cost,)] = gw.query("SELECT cost_usd FROM usage")
    assert cost == pytest.approx(litellm_cost("gpt-5", "priority"), abs=MICRO)
