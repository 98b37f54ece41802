"""/v1/embeddings is admitted like a completion (the key's models, RPM, TPM, concurrency,
budgets) and metered (a usage row with its cost, in /v1/usage and /metrics), but is no
conversation."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from gateway.metering.tokens import count_text
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, status

MASTER = "master-key-for-tests-0123456789"
INPUT_PER_TOKEN = 50e-6  # 50 USD per million input tokens: costs big enough to read
TEXT = "one two three"  # three tokens, as the fake upstream reports for any input
COST = round(3 * INPUT_PER_TOKEN, 10)


async def embedding_gateway(
    make_gateway: MakeGateway,
    upstream: FakeUpstream,
    key: dict[str, Any] | None = None,
    team: dict[str, Any] | None = None,
) -> tuple[GatewayUnderTest, str]:
    deployment = upstream.deployment(
        name="emb-d",
        model="text-embedding-3-small",
        input_cost_per_mtok=INPUT_PER_TOKEN * 1e6,
        output_cost_per_mtok=0.0,
    )
    models = [
        {"name": "emb", "retry": {"max_attempts": 1}, "deployments": [deployment]},
        {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]},
    ]
    gw = await make_gateway(models=models, auth={"master_key": MASTER})
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        body: dict[str, Any] = {"id": "t", "name": "T"}
        if team:
            body["limits"] = team
        async with session.post(gw.url + "/v1/gateway/teams", json=body) as r:
            assert r.status == 201, await r.text()
        body = {"team_id": "t", **(key or {})}
        async with session.post(gw.url + "/v1/gateway/keys", json=body) as r:
            assert r.status == 201, await r.text()
            secret: str = (await r.json())["key"]
    return gw, secret


async def embed(
    gw: GatewayUnderTest, key: str, model: str = "emb", text: str = TEXT
) -> tuple[int, dict[str, Any], dict[str, str]]:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session,
        session.post(gw.url + "/v1/embeddings", json={"model": model, "input": text}) as r,
    ):
        return r.status, await r.json(), dict(r.headers)


async def test_embeddings_are_refused_past_rpm_and_metered(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    assert count_text(TEXT) == 3
    gw, key = await embedding_gateway(
        make_gateway, upstream, key={"limits": {"rpm": 2, "tpm": 1000}}
    )
    for remaining in ("1", "0"):
        code, body, headers = await embed(gw, key)
        assert code == 200, body
        assert body["data"][0]["embedding"] == [0.5, -0.5]
        assert headers["x-ratelimit-remaining-requests"] == remaining
        assert headers["x-ratelimit-limit-tokens"] == "1000"
    code, body, headers = await embed(gw, key)
    assert code == 429 and body["error"]["code"] == "rate_limit_exceeded"
    assert int(headers["Retry-After"]) >= 1
    assert len(upstream.requests) == 2  # the refused one reached no upstream
    await gw.flush()
    rows = gw.query(
        "SELECT team_id, key_id IS NOT NULL, alias, deployment, model, status, prompt_tokens,"
        " completion_tokens, usage_source, cost_usd, conversation_id FROM usage"
    )
    assert (
        rows
        == [
            (
                "t",
                1,
                "emb",
                "emb-d",
                "text-embedding-3-small",
                "completed",
                3,
                0,
                "provider",
                COST,
                "",
            )
        ]
        * 2
    )
    assert gw.query("SELECT count(*) FROM conversations") == [(0,)]  # no conversation
    assert gw.query("SELECT count(*) FROM turns") == [(0,)]
    # /v1/usage counts them as requests, with their cost.
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session,
        session.get(gw.url + "/v1/usage?group_by=model") as r,
    ):
        report = (await r.json())["data"]
    [row] = report
    assert (row["group"], row["requests"], row["prompt_tokens"]) == ("emb", 2, 6)
    assert row["cost_usd"] == pytest.approx(2 * COST)
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/metrics") as r:
        metrics = await r.text()
    [cost] = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith('gateway_cost_usd_total{alias="emb",deployment="emb-d"}')
    ]
    assert cost == pytest.approx(2 * COST)
    assert (
        'gateway_tokens_total{alias="emb",deployment="emb-d",kind="prompt",source="provider"} 6.0'
        in metrics
    )


async def test_embeddings_stop_at_a_hard_team_budget(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    budget = 2.5 * COST
    gw, key = await embedding_gateway(
        make_gateway, upstream, team={"budget": {"usd": budget, "period": "day"}}
    )
    assert (await embed(gw, key))[0] == 200
    assert (await embed(gw, key))[0] == 200
    code, body, _ = await embed(gw, key)
    assert code == 429 and body["error"]["code"] == "budget_exceeded"
    assert len(upstream.requests) == 2
    await gw.flush()
    assert gw.query("SELECT SUM(cost_usd) FROM usage WHERE team_id = 't'")[0][0] == pytest.approx(
        2 * COST
    )
    held = gw.gateway.limiter.held("team", "t")
    assert held.spent == pytest.approx(2 * COST) and held.reserved == 0 and held.in_flight == 0


async def test_embeddings_keep_to_the_keys_models_and_tpm(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw, key = await embedding_gateway(
        make_gateway, upstream, key={"models": ["demo"], "limits": {"tpm": 10}}
    )
    code, body, _ = await embed(gw, key)
    assert code == 404 and body["error"]["code"] == "model_not_found"
    # 16 tokens of input do not fit a TPM of 10.
    code, body, _ = await embed(gw, key, model="demo", text="word " * 16)
    assert code == 429 and "tokens per minute" in body["error"]["message"]
    code, body, _ = await embed(gw, key, model="demo", text="hi")
    assert code == 200
    assert upstream.requests == []


async def test_a_failed_embeddings_request_is_not_billed_and_frees_its_slot(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw, key = await embedding_gateway(
        make_gateway,
        upstream,
        key={"limits": {"max_concurrent": 1, "budget": {"usd": 1, "period": "day"}}},
    )
    upstream.push(status(500, {"error": {"message": "down", "type": "server_error"}}))
    code, _, _ = await embed(gw, key)
    assert code == 500
    held = gw.gateway.limiter.held("key", gw.query("SELECT id FROM keys")[0][0])
    assert held.in_flight == 0 and held.reserved == 0 and held.spent == 0
    assert (await embed(gw, key))[0] == 200
    await gw.flush()
    # The failure is in the request log, at no cost; the success is billed.
    assert gw.query("SELECT status, cost_usd > 0 FROM usage ORDER BY created_at") == [
        ("error", 0),
        ("completed", 1),
    ]
