"""A price change applies from the moment the configuration is reloaded (gateway.reload, what
SIGHUP runs), never to usage rows already written: each row keeps the unit prices it was charged
at and where they came from, so a report can show what was charged and re-rate it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from gateway.providers.litellm_adapter import load_litellm
from gateway.reload import Reloader
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import USAGE, FakeUpstream, completion

MICRO = 1e-6
MODEL = "acme-chat-1"  # in no bundled map: priced by the operator's file alone
HELLO = [{"role": "user", "content": "Hello"}]
OLD = {"input_cost_per_token": 1e-06, "output_cost_per_token": 4e-06}
NEW = {"input_cost_per_token": 3e-06, "output_cost_per_token": 1.5e-05}


def litellm_cost(prices: dict[str, float]) -> float:
    litellm = load_litellm()
    prompt_cost, completion_cost = litellm.cost_per_token(
        model=MODEL,
        prompt_tokens=USAGE["prompt_tokens"],
        completion_tokens=USAGE["completion_tokens"],
        custom_cost_per_token=prices,
    )
    return float(prompt_cost + completion_cost)


def rows(gw: GatewayUnderTest) -> list[tuple[Any, ...]]:
    return gw.query(
        "SELECT id, prompt_tokens, completion_tokens, cost_usd, prices, price_source"
        " FROM usage ORDER BY created_at"
    )


async def ask(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(completion("Hi."))
    await gw.client().chat.completions.create(model="m", messages=HELLO)  # type: ignore[arg-type]
    await gw.flush()


async def test_a_price_reload_applies_to_later_rows_and_never_rewrites_earlier_ones(
    make_gateway: MakeGateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    price_file = tmp_path / "prices.json"
    price_file.write_text(json.dumps({MODEL: OLD}))
    models = [{"name": "m", "deployments": [{**upstream.deployment(), "model": MODEL}]}]
    gw = await make_gateway(models, prices=str(price_file))
    await ask(gw, upstream)
    [before] = rows(gw)

    # The file changes, and the gateway is told to read its config again (SIGHUP).
    price_file.write_text(json.dumps({MODEL: NEW}))
    config = tmp_path / "gateway.json"
    store = {"url": f"sqlite:///{gw.db_path}"}
    config.write_text(json.dumps({"store": store, "models": models, "prices": str(price_file)}))
    assert await Reloader(gw.app, config).reload()
    await ask(gw, upstream)

    first, second = rows(gw)
    assert first == before  # the row written before the reload is as it was
    for row, prices in ((first, OLD), (second, NEW)):
        _, prompt, completion_tokens, cost, units, source = row
        assert cost == pytest.approx(litellm_cost(prices), abs=MICRO)
        assert source == f"price file ({MODEL})"
        charged = orjson.loads(units)
        assert (charged["input"], charged["output"]) == (
            prices["input_cost_per_token"],
            prices["output_cost_per_token"],
        )
        # The row's counts times its own unit prices give its cost back.
        assert prompt * charged["input"] + completion_tokens * charged["output"] == pytest.approx(
            cost, abs=MICRO
        )
    # Re-rating the earlier row at the prices now in force: what it would cost today.
    _, prompt, completion_tokens, *_ = first
    now = orjson.loads(second[4])
    rerated = prompt * now["input"] + completion_tokens * now["output"]
    assert rerated == pytest.approx(litellm_cost(NEW), abs=MICRO)
    assert rerated > first[3]
