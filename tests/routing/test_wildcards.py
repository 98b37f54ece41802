"""Pattern aliases: an alias ending in `*` serves every id with its prefix, and a `*` in a
deployment's model sends what the alias's `*` matched."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from gateway.config import ConfigError, parse_config
from gateway.errors import ModelNotFound
from gateway.metering.keys import Principal
from gateway.routing.router import Router
from gateway.upstream.pool import UpstreamPool
from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream


def router(models: list[dict[str, Any]]) -> Router:
    return Router(parse_config({"models": models}).config, UpstreamPool())


def openai_at(model: str, name: str, **extra: Any) -> dict[str, Any]:
    return {
        "provider": "openai",
        "api_base": "http://127.0.0.1:9/v1",
        "model": model,
        "name": name,
        **extra,
    }


MODELS = [
    {"name": "gpt-4.1", "deployments": [openai_at("exact-upstream", "exact")]},
    {"name": "openai/*", "deployments": [openai_at("*", "openai-any")]},
    {"name": "openai/gpt-4*", "deployments": [openai_at("azure-*", "gpt4-family")]},
    {"name": "*", "deployments": [openai_at("*", "anything")]},
    {"name": "claude-*", "deployments": [openai_at("claude-*", "claude-any")]},
]


def test_an_exact_alias_wins_over_every_pattern() -> None:
    alias = router(MODELS).alias("gpt-4.1")
    assert alias.name == "gpt-4.1"
    assert [d.upstream_model for d in alias.deployments] == ["exact-upstream"]


def test_a_pattern_sends_the_id_without_its_literal_prefix() -> None:
    alias = router(MODELS).alias("openai/o3-mini")
    assert (alias.name, alias.model) == ("openai/*", "openai/o3-mini")
    [deployment] = alias.deployments
    assert (deployment.name, deployment.upstream_model) == ("openai-any", "o3-mini")


def test_the_longest_pattern_wins_among_patterns() -> None:
    r = router(MODELS)
    assert r.alias("openai/gpt-4o").deployments[0].upstream_model == "azure-o"
    assert r.alias("openai/gpt-3.5").deployments[0].upstream_model == "gpt-3.5"
    # `*` alone takes what nothing longer does, sent whole.
    assert r.alias("mistral-large").deployments[0].upstream_model == "mistral-large"


def test_a_star_inside_the_deployment_model_keeps_its_literal_parts() -> None:
    alias = router(MODELS).alias("claude-sonnet-4-5")
    assert alias.deployments[0].upstream_model == "claude-sonnet-4-5"


def test_a_pattern_with_no_catch_all_refuses_other_ids() -> None:
    r = router(MODELS[:2])
    with pytest.raises(ModelNotFound):
        r.alias("anthropic/claude")


def test_resolved_deployments_share_their_pattern_deployments_health() -> None:
    r = router(MODELS)
    one, two = r.alias("openai/a").deployments[0], r.alias("openai/b").deployments[0]
    assert one.provider is not two.provider
    assert one.health is two.health
    assert r.alias("openai/a") is r.alias("openai/a")  # made once, kept


def test_the_price_is_the_model_actually_sent() -> None:
    r = router([{"name": "openai/*", "deployments": [openai_at("*", "any")]}])
    priced = r.alias("openai/gpt-4o-mini").deployments[0]
    unknown = r.alias("openai/no-such-model-xyz").deployments[0]
    assert priced.price is not None and priced.price.input == pytest.approx(0.15e-6)
    assert unknown.price is None


def test_a_pattern_fallback_serves_what_the_first_pattern_matched() -> None:
    r = router(
        [
            {
                "name": "openai/*",
                "fallbacks": ["backup/*"],
                "deployments": [openai_at("*", "primary")],
            },
            {"name": "backup/*", "deployments": [openai_at("*", "backup")]},
        ]
    )
    plan = r.plan(r.alias("openai/gpt-4.1"), {"messages": []})
    assert [(d.name, d.upstream_model) for d in plan] == [
        ("primary", "gpt-4.1"),
        ("backup", "gpt-4.1"),
    ]


def test_a_key_may_list_a_pattern_or_the_ids_it_serves() -> None:
    r = router(MODELS)
    by_pattern = Principal("key", models=("openai/*",))
    by_id = Principal("key", models=("openai/gpt-4.1",))
    assert r.alias("openai/o3", by_pattern).model == "openai/o3"
    assert r.alias("openai/gpt-4.1", by_id).model == "openai/gpt-4.1"
    with pytest.raises(ModelNotFound):
        r.alias("openai/o3", by_id)
    assert r.known("openai/anything") and r.known("claude-x") and r.known("zzz")
    assert not router(MODELS[:2]).known("claude-x")


@pytest.mark.parametrize(
    ("models", "message"),
    [
        ([{"name": "a*b", "deployments": [{"provider": "demo"}]}], "may only end an alias"),
        (
            [{"name": "exact", "deployments": [{"provider": "demo", "model": "x-*"}]}],
            "only under an alias whose name ends in `*`",
        ),
        (
            [{"name": "p/*", "deployments": [{"provider": "demo", "model": "*-*"}]}],
            "may hold one `*`",
        ),
    ],
)
def test_misplaced_stars_are_config_errors(models: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"models": models})
    assert message in str(raised.value)
    assert "models[0]" in str(raised.value)


async def test_the_upstream_receives_the_id_a_pattern_matched(
    make_gateway: MakeGateway, aiohttp_server: Any
) -> None:
    upstream = await FakeUpstream(plain_answer="Hello.").start(aiohttp_server)
    deployment = upstream.deployment(model="*")
    gw = await make_gateway(
        models=[
            {"name": "openai/*", "deployments": [deployment]},
            {"name": "fake", "deployments": [upstream.deployment()]},
        ]
    )
    client = gw.client()
    answer = await client.chat.completions.create(
        model="openai/gpt-4o-mini", messages=[{"role": "user", "content": "hi"}]
    )
    assert upstream.requests[-1]["model"] == "gpt-4o-mini"
    assert answer.choices[0].message.content
    # An exact alias is untouched by the pattern.
    await client.chat.completions.create(model="fake", messages=[{"role": "user", "content": "hi"}])
    assert upstream.requests[-1]["model"] == upstream.model
    # The turn records the id the client asked for; its usage, the model sent and its price.
    await gw.flush()
    rows = gw.query("SELECT alias, model, cost_usd FROM usage ORDER BY created_at")
    assert rows[0][0] == "openai/*" and rows[0][1] == "gpt-4o-mini"
    assert rows[0][2] is not None and rows[0][2] > 0
    models = await client.models.retrieve("openai/gpt-4o-mini")
    assert models.id == "openai/gpt-4o-mini"
    with pytest.raises(openai.NotFoundError):
        await client.chat.completions.create(
            model="anthropic/claude", messages=[{"role": "user", "content": "hi"}]
        )
