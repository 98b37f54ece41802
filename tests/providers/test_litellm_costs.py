"""What an answer from each provider litellm reaches costs, as the client and the record see it.

Over every litellm fake of the adapter contract suite (tests/providers/upstreams.py): a streamed
answer with `stream_options.include_usage` carries `usage.cost_usd`, the provider's token counts
at the prices of litellm's bundled map, and the usage row records the same figure.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from _pytest.mark import ParameterSet

from tests.conftest import MakeGateway
from tests.fakes import COMPLETION_TOKENS, PROMPT_TOKENS, MakeServer
from tests.providers.test_adapter_contract import (
    ANSWER,
    LITELLM_SKIP,
    start_gateway,
    stream_chat,
)
from tests.providers.upstreams import SERVERS

pytestmark = pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")

# The entry of litellm's price map each fake's model is priced by.
PRICED_AS = {
    "gemini": "gemini/gemini-2.5-flash",
    "bedrock": "anthropic.claude-3-7-sonnet-20250219-v1:0",
    "vertex-gemini": "gemini-2.5-flash",
    "vertex-anthropic": "vertex_ai/claude-sonnet-4-5@20250929",
    "groq": "groq/openai/gpt-oss-120b",
    "mistral": "mistral/magistral-medium-latest",
    "cohere": "command-a-03-2025",
}


def litellm_fakes() -> list[ParameterSet]:
    params = []
    for name, server in SERVERS.items():
        if server.provider != "litellm":
            continue
        params.append(pytest.param(name, id=name))
    return params


def price(name: str) -> float:
    spec = importlib.util.find_spec("litellm")
    assert spec is not None and spec.origin is not None
    table = Path(spec.origin).with_name("model_prices_and_context_window_backup.json")
    entry = json.loads(table.read_text())[PRICED_AS[name]]
    return float(
        PROMPT_TOKENS * entry["input_cost_per_token"]
        + COMPLETION_TOKENS * entry["output_cost_per_token"]
    )


@pytest.mark.parametrize("name", litellm_fakes())
async def test_the_usage_chunk_says_what_the_answer_cost(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, name: str
) -> None:
    fake = await SERVERS[name]().start(aiohttp_server)
    gw = await start_gateway(make_gateway, fake)
    fake.text(ANSWER)
    view = await stream_chat(gw, stream_options={"include_usage": True})
    assert view.error is None
    assert view.usage is not None
    assert (view.usage.prompt_tokens, view.usage.completion_tokens) == (
        PROMPT_TOKENS,
        COMPLETION_TOKENS,
    )
    cost = (view.usage.model_extra or {}).get("cost_usd")
    assert cost == pytest.approx(price(name))

    await gw.wait_turn_end(view.conversation_id)
    await gw.flush()
    [(recorded,)] = gw.query("SELECT cost_usd FROM usage")
    assert recorded == pytest.approx(price(name))
