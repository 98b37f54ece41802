"""Strategies order an alias's deployments; unavailable ones drop out of the plan."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest

from gateway.config import parse_config
from gateway.routing.router import Router
from gateway.upstream.pool import UpstreamPool


async def router(strategy: str, deployments: list[dict[str, Any]], **alias: Any) -> Router:
    config = parse_config(
        {"models": [{"name": "m", "strategy": strategy, "deployments": deployments, **alias}]}
    ).config
    return Router(config, UpstreamPool(), rng=random.Random(7))


def demo(name: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "demo", "name": name, **extra}


BODY = {"messages": [{"role": "user", "content": "x" * 4000}], "max_tokens": 1000}


async def test_fallback_orders_by_priority_then_file_order() -> None:
    r = await router(
        "fallback", [demo("a", priority=2), demo("b"), demo("c", priority=1), demo("d")]
    )
    assert [d.name for d in r.plan(r.alias("m"), BODY)] == ["b", "d", "c", "a"]


async def test_weighted_split_follows_the_weights() -> None:
    r = await router("weighted", [demo("a", weight=3), demo("b", weight=1)])
    firsts = Counter(r.plan(r.alias("m"), BODY)[0].name for _ in range(4000))
    assert firsts["a"] / 4000 == pytest.approx(0.75, abs=0.03)
    assert set(firsts) == {"a", "b"}


async def test_least_busy_picks_the_fewest_in_flight() -> None:
    r = await router("least_busy", [demo("a"), demo("b"), demo("c")])
    deployments = {d.name: d for d in r.deployments()}
    for _ in range(3):
        deployments["a"].health.acquire()
    deployments["b"].health.acquire()
    assert [d.name for d in r.plan(r.alias("m"), BODY)] == ["c", "b", "a"]


async def test_latency_prefers_the_fastest_first_token_and_measures_new_ones() -> None:
    r = await router("latency", [demo("a"), demo("b"), demo("c")])
    deployments = {d.name: d for d in r.deployments()}
    deployments["a"].health.succeeded(400.0)
    deployments["b"].health.succeeded(90.0)
    assert [d.name for d in r.plan(r.alias("m"), BODY)] == ["c", "b", "a"]
    deployments["c"].health.succeeded(200.0)
    deployments["b"].health.succeeded(900.0)  # a moving average: one slow answer moves b
    assert [d.name for d in r.plan(r.alias("m"), BODY)] == ["c", "b", "a"]


async def test_cost_prefers_the_cheapest_for_this_request() -> None:
    r = await router(
        "cost",
        [
            demo("unpriced"),
            demo("cheap-in", input_cost_per_mtok=0.1, output_cost_per_mtok=10),
            demo("cheap-out", input_cost_per_mtok=5, output_cost_per_mtok=1),
        ],
    )
    # 1,000 prompt tokens and up to 1,000 completion tokens: cheap-out wins (6e-3 vs 10.1e-3).
    assert [d.name for d in r.plan(r.alias("m"), BODY)] == ["cheap-out", "cheap-in", "unpriced"]
    long_prompt = {"messages": [{"role": "user", "content": "x" * 400_000}], "max_tokens": 10}
    assert r.plan(r.alias("m"), long_prompt)[0].name == "cheap-in"


async def test_full_and_cooling_deployments_leave_the_plan() -> None:
    r = await router(
        "fallback",
        [demo("a", max_concurrency=1), demo("b")],
        cooldown={"failures": 1, "window_s": 60, "cooldown_s": 60},
    )
    a, b = r.deployments()
    a.health.acquire()
    assert [d.name for d in r.plan(r.alias("m"), BODY)] == ["b"]
    a.health.release()
    b.health.failed("http_500")
    assert [d.name for d in r.plan(r.alias("m"), BODY)] == ["a"]
    a.health.failed("http_500")
    # Nothing available: the one that recovers first is tried rather than failing outright.
    assert [d.name for d in r.plan(r.alias("m"), BODY)] == ["b", "a"]


async def test_unknown_fallback_alias_is_a_config_error() -> None:
    from gateway.config import ConfigError

    with pytest.raises(ConfigError, match="fallback alias 'nope' is not defined"):
        parse_config({"models": [{"name": "m", "fallbacks": ["nope"], "deployments": [demo("a")]}]})
