"""Rate limits and budgets per key and team: refused before any upstream call, with headers."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, frames

MASTER = "master-key-for-tests-0123456789"
HELLO = [{"role": "user", "content": "Hello"}]
# demo: about 200 completion tokens an answer; priced so that one answer costs ~1e-3 USD.
PRICED_DEMO = {
    "name": "demo",
    "deployments": [
        {
            "provider": "demo",
            "chunk_delay_ms": 0,
            "input_cost_per_mtok": 1.0,
            "output_cost_per_mtok": 5.0,
        }
    ],
}


async def setup(
    make_gateway: MakeGateway, upstream: FakeUpstream | None = None, **limits: Any
) -> tuple[GatewayUnderTest, str]:
    models: list[dict[str, Any]] = [PRICED_DEMO]
    if upstream is not None:
        models.append(
            {"name": "fake", "deployments": [{"provider": "openai", "api_base": upstream.url}]}
        )
    gw = await make_gateway(models=models, auth={"master_key": MASTER})
    headers = {"Authorization": f"Bearer {MASTER}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        team = {"id": "t", "name": "T", **({"limits": limits["team"]} if "team" in limits else {})}
        async with session.post(gw.url + "/v1/gateway/teams", json=team) as r:
            assert r.status == 201, await r.text()
        key = {"team_id": "t", **({"limits": limits["key"]} if "key" in limits else {})}
        async with session.post(gw.url + "/v1/gateway/keys", json=key) as r:
            assert r.status == 201, await r.text()
            secret: str = (await r.json())["key"]
    return gw, secret


async def test_requests_per_minute(make_gateway: MakeGateway) -> None:
    gw, key = await setup(make_gateway, key={"rpm": 2})
    api = gw.client(api_key=key)
    first = await api.chat.completions.with_raw_response.create(model="demo", messages=HELLO)
    assert first.headers["x-ratelimit-limit-requests"] == "2"
    assert first.headers["x-ratelimit-remaining-requests"] == "1"
    await api.chat.completions.create(model="demo", messages=HELLO)
    with pytest.raises(openai.RateLimitError) as caught:
        await api.chat.completions.create(model="demo", messages=HELLO)
    error = caught.value
    assert error.code == "rate_limit_exceeded"
    assert int(error.response.headers["Retry-After"]) >= 1
    assert error.response.headers["x-ratelimit-remaining-requests"] == "0"
    await gw.flush()
    assert gw.query("SELECT count(*) FROM turns") == [(2,)]  # the refused one changed nothing


async def test_tokens_per_minute(make_gateway: MakeGateway) -> None:
    gw, key = await setup(make_gateway, key={"tpm": 600})
    api = gw.client(api_key=key)
    # Admission reserves prompt + max_tokens; the end corrects it to the real count (~200).
    answer = await api.chat.completions.with_raw_response.create(
        model="demo", messages=HELLO, max_tokens=300
    )
    assert answer.headers["x-ratelimit-limit-tokens"] == "600"
    await api.chat.completions.create(model="demo", messages=HELLO, max_tokens=300)
    with pytest.raises(openai.RateLimitError) as caught:
        await api.chat.completions.create(model="demo", messages=HELLO, max_tokens=300)
    assert caught.value.code == "rate_limit_exceeded"
    assert "tokens per minute" in caught.value.message
    assert caught.value.response.headers["x-ratelimit-remaining-tokens"] == "0"


async def test_concurrent_requests(make_gateway: MakeGateway, upstream: FakeUpstream) -> None:
    gw, key = await setup(make_gateway, upstream, key={"max_concurrent": 1})
    upstream.push(frames(chunk("Still going"), then="stall"))
    api = gw.client(api_key=key)
    stream = await api.chat.completions.create(model="fake", messages=HELLO, stream=True)
    async for _ in stream:
        break
    with pytest.raises(openai.RateLimitError):
        await api.chat.completions.create(model="demo", messages=HELLO)
    await stream.close()
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    async with asyncio.timeout(5):  # the slot frees when the cancelled turn is recorded
        while True:
            try:
                await api.chat.completions.create(model="demo", messages=HELLO)
                break
            except openai.RateLimitError:
                await asyncio.sleep(0.02)


async def test_hard_team_budget_holds_under_50_concurrent_requests(
    make_gateway: MakeGateway,
) -> None:
    budget = 0.01
    gw, key = await setup(make_gateway, team={"budget": {"usd": budget, "period": "day"}})
    api = gw.client(api_key=key)

    async def one() -> str:
        try:
            await api.chat.completions.create(model="demo", messages=HELLO, max_tokens=300)
            return "ok"
        except openai.RateLimitError as error:
            assert error.code == "budget_exceeded"
            return "refused"

    outcomes = await asyncio.gather(*(one() for _ in range(50)))
    await gw.flush()
    spent = gw.query("SELECT SUM(cost_usd) FROM usage WHERE team_id = 't'")[0][0]
    assert outcomes.count("ok") >= 1 and outcomes.count("refused") >= 1
    # Each request reserved at least its real cost, so the reservations kept spend in bounds.
    assert spent <= budget
    assert gw.query("SELECT count(*) FROM turns")[0][0] == outcomes.count("ok")
    # One after another, requests go on being let in while the budget has room for what each
    # reserves (how much the burst left depends on how its reservations overlapped), then
    # are refused up front, and the spend stays within the budget.
    with pytest.raises(openai.RateLimitError) as caught:
        for _ in range(50):
            await api.chat.completions.create(model="demo", messages=HELLO, max_tokens=300)
    assert caught.value.code == "budget_exceeded"
    await gw.flush()
    assert gw.query("SELECT SUM(cost_usd) FROM usage WHERE team_id = 't'")[0][0] <= budget


async def test_soft_budget_warns_and_lets_through(make_gateway: MakeGateway) -> None:
    gw, key = await setup(
        make_gateway, key={"budget": {"usd": 0.0001, "period": "total", "mode": "soft"}}
    )
    api = gw.client(api_key=key)
    await api.chat.completions.create(model="demo", messages=HELLO)
    response = await api.chat.completions.with_raw_response.create(model="demo", messages=HELLO)
    assert response.parse().choices[0].message.content
    assert "budget" in response.headers["X-Gateway-Budget-Warning"]


async def test_limits_can_be_changed_by_the_admin(make_gateway: MakeGateway) -> None:
    gw, key = await setup(make_gateway, team={"rpm": 1})
    api = gw.client(api_key=key)
    await api.chat.completions.create(model="demo", messages=HELLO)
    with pytest.raises(openai.RateLimitError):
        await api.chat.completions.create(model="demo", messages=HELLO)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        async with session.patch(gw.url + "/v1/gateway/teams/t", json={"limits": {"rpm": 10}}) as r:
            assert r.status == 200 and (await r.json())["limits"] == {"rpm": 10}
    await api.chat.completions.create(model="demo", messages=HELLO)


async def test_bad_limits_are_400(make_gateway: MakeGateway) -> None:
    gw, _ = await setup(make_gateway)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        for limits in ({"rpm": 0}, {"budget": {"usd": 1, "period": "year"}}, {"rps": 3}):
            async with session.post(
                gw.url + "/v1/gateway/keys", json={"team_id": "t", "limits": limits}
            ) as r:
                assert r.status == 400, limits
                assert (await r.json())["error"]["param"].startswith("limits")
