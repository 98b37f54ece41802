"""Audio tokens at audio prices: an answer whose provider counts audio inside its prompt and
completion (`prompt_tokens_details.audio_tokens`, `completion_tokens_details.audio_tokens`) is
billed as litellm's own cost function bills it, to the micro-dollar, not as text."""

from __future__ import annotations

from typing import Any

import pytest
from aiohttp import web

from gateway.metering.prices import lookup, price_map
from gateway.providers.litellm_adapter import load_litellm
from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream

MICRO = 1e-6
AUDIO_MODELS = ["gpt-audio", "gpt-4o-audio-preview-2024-12-17", "gpt-audio-mini"]
PROMPT, PROMPT_AUDIO, COMPLETION, COMPLETION_AUDIO = 1_000, 600, 500, 300


def usage() -> dict[str, Any]:
    return {
        "prompt_tokens": PROMPT,
        "completion_tokens": COMPLETION,
        "total_tokens": PROMPT + COMPLETION,
        "prompt_tokens_details": {"audio_tokens": PROMPT_AUDIO, "cached_tokens": 0},
        "completion_tokens_details": {"audio_tokens": COMPLETION_AUDIO, "reasoning_tokens": 0},
    }


def litellm_cost(model: str) -> float:
    litellm = load_litellm()
    prompt_cost, completion_cost = litellm.cost_per_token(
        model=model, custom_llm_provider="openai", usage_object=litellm.Usage(**usage())
    )
    return float(prompt_cost + completion_cost)


@pytest.mark.parametrize("model", AUDIO_MODELS)
def test_audio_is_billed_as_litellm_bills_it(model: str) -> None:
    price = lookup(model, "openai", price_map())
    assert price is not None and price.audio_input is not None
    ours = price.cost(PROMPT, COMPLETION, audio_in=PROMPT_AUDIO, audio_out=COMPLETION_AUDIO)
    assert ours == pytest.approx(litellm_cost(model), abs=MICRO)
    assert ours > price.cost(PROMPT, COMPLETION)  # audio is dearer than text


async def test_an_answer_with_audio_is_recorded_at_audio_prices(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    async def answer(request: web.Request) -> web.StreamResponse:
        message = {"role": "assistant", "content": "Here it is."}
        return web.json_response(
            {
                "id": "chatcmpl-a",
                "object": "chat.completion",
                "created": 1,
                "model": "gpt-audio",
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage(),
            }
        )

    deployment = {**upstream.deployment(), "model": "gpt-audio"}
    gw = await make_gateway([{"name": "voice", "deployments": [deployment]}])
    upstream.push(answer)
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="voice", messages=[{"role": "user", "content": "Say it."}]
    )
    await gw.flush()
    [(cost,)] = gw.query("SELECT cost_usd FROM usage")
    assert cost == pytest.approx(litellm_cost("gpt-audio"), abs=MICRO)
    assert float(raw.headers["X-Gateway-Cost-USD"]) == pytest.approx(cost)
