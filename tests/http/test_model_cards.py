"""`/v1/models` as clients pick from it: each alias with its context window, output limit,
modalities and prices where the bundled model map or the config knows them, true of every
deployment it may route to, and only the aliases the key may use."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream
from tests.http.test_auth import MASTER, admin, client, new_key


def deployment(upstream: FakeUpstream, model: str, **extra: Any) -> dict[str, Any]:
    return {**upstream.deployment(**extra), "model": model}


async def test_an_alias_says_what_its_model_takes_and_costs(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    models = [
        {"name": "smart", "deployments": [deployment(upstream, "gpt-4o")]},
        # Either deployment may answer: the smaller window, the dearer price.
        {
            "name": "mixed",
            "deployments": [
                deployment(upstream, "gpt-3.5-turbo"),
                deployment(
                    upstream,
                    "gpt-4o",
                    price={
                        "input_cost_per_token": 3e-6,
                        "output_cost_per_token": 12e-6,
                        "max_output_tokens": 2048,
                    },
                ),
            ],
        },
        {"name": "mystery", "deployments": [deployment(upstream, "an-unknown-model")]},
        {
            "name": "claude",
            "deployments": [
                {
                    "provider": "anthropic",
                    "api_base": upstream.url,
                    "api_key": "k",
                    "model": "claude-sonnet-4-5-20250929",
                }
            ],
        },
    ]
    gw = await make_gateway(models)
    listed = {m.id: m.model_extra or {} for m in (await gw.client().models.list()).data}
    assert listed["smart"] == {
        "context_window": 128_000,
        "max_output_tokens": 16_384,
        "input_modalities": ["text", "image", "file"],
        "output_modalities": ["text"],
        "pricing": {"input_per_mtok": 2.5, "output_per_mtok": 10.0, "cache_read_per_mtok": 1.25},
    }
    mixed = listed["mixed"]
    assert mixed["context_window"] == 16_385  # gpt-3.5-turbo's
    assert mixed["max_output_tokens"] == 2048  # the configured limit of one deployment
    assert mixed["input_modalities"] == ["text"]  # gpt-3.5-turbo takes no images
    assert mixed["pricing"]["input_per_mtok"] == 3.0 and mixed["pricing"]["output_per_mtok"] == 12
    assert listed["mystery"] == {}  # nothing known is guessed
    # Claude prices its prompt cache's writes as well as its reads.
    assert listed["claude"]["pricing"] == {
        "input_per_mtok": 3.0,
        "output_per_mtok": 15.0,
        "cache_read_per_mtok": 0.3,
        "cache_write_per_mtok": 3.75,
    }
    one = await gw.client().models.retrieve("smart")
    assert (one.model_extra or {})["context_window"] == 128_000


async def test_a_key_sees_the_cards_of_its_own_models_only(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    models = [
        {"name": "smart", "deployments": [deployment(upstream, "gpt-4o")]},
        {"name": "cheap", "deployments": [deployment(upstream, "gpt-4o-mini")]},
    ]
    gw = await make_gateway(models, auth={"master_key": MASTER})
    status, _ = await admin(gw, "POST", "/v1/gateway/teams", {"id": "red", "name": "Red"})
    assert status == 201
    key = (await new_key(gw, "red", models=["cheap"]))["key"]
    listed = (await client(gw, key).models.list()).data
    assert [m.id for m in listed] == ["cheap"]
    assert (listed[0].model_extra or {})["context_window"] == 128_000
    with pytest.raises(Exception, match="404"):
        await client(gw, key).models.retrieve("smart")
