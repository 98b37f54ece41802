"""GET /v1/me shows a virtual key its own limits and spend, and its team's, and nothing else."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.http.test_limits import HELLO, MASTER, PRICED_DEMO

A_TEAM = {"rpm": 100, "budget": {"usd": 5.0, "period": "month", "mode": "hard"}}
A_KEY = {"tpm": 100_000, "budget": {"usd": 1.0, "period": "day", "mode": "soft"}}
B_TEAM = {"budget": {"usd": 2.0, "period": "total", "mode": "hard"}}


async def _call(
    gw: GatewayUnderTest, key: str, method: str, path: str, body: Any = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session,
        session.request(method, gw.url + path, json=body) as response,
    ):
        return response.status, await response.json()


async def _key(gw: GatewayUnderTest, team: str, limits: dict[str, Any] | None) -> tuple[str, str]:
    status, made = await _call(
        gw, MASTER, "POST", "/v1/gateway/keys", {"team_id": team, "limits": limits}
    )
    assert status == 201, made
    return made["key"], made["id"]


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> GatewayUnderTest:
    gw = await make_gateway(models=[PRICED_DEMO], auth={"master_key": MASTER})
    for team, limits in (("a", A_TEAM), ("b", B_TEAM)):
        body = {"id": team, "name": team, "limits": limits}
        status, made = await _call(gw, MASTER, "POST", "/v1/gateway/teams", body)
        assert status == 201, made
    return gw


async def _me(gw: GatewayUnderTest, key: str) -> dict[str, Any]:
    status, body = await _call(gw, key, "GET", "/v1/me")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


async def test_a_key_sees_its_own_and_its_team_s_budget_and_spend(gw: GatewayUnderTest) -> None:
    key, key_id = await _key(gw, "a", A_KEY)
    before = (await _me(gw, key))["budget"]
    assert before["key"] == {
        "rpm": None,
        "tpm": 100_000,
        "max_concurrent": None,
        "budget": {"usd": 1.0, "period": "day", "mode": "soft"},
        "end_user": None,
        "spent_usd": 0.0,
        "period_start": before["key"]["period_start"],
    }
    assert before["team"]["rpm"] == 100
    assert before["team"]["budget"] == {"usd": 5.0, "period": "month", "mode": "hard"}
    assert before["team"]["spent_usd"] == 0.0
    # The day's start and the month's, as the limiter counts them.
    assert before["key"]["period_start"] % 86400 == 0
    assert before["team"]["period_start"] <= before["key"]["period_start"]

    api = gw.client(api_key=key)
    for _ in range(2):
        await api.chat.completions.create(model="demo", messages=HELLO)
    after = (await _me(gw, key))["budget"]
    # What the limiter holds against each budget, after the turns it settled.
    held_key = gw.gateway.limiter.held("key", key_id).spent
    held_team = gw.gateway.limiter.held("team", "a").spent
    assert held_key > 0
    assert after["key"]["spent_usd"] == pytest.approx(held_key)
    assert after["team"]["spent_usd"] == pytest.approx(held_team)


async def test_a_team_s_spend_counts_every_key_and_no_other_team(gw: GatewayUnderTest) -> None:
    first, first_id = await _key(gw, "a", A_KEY)
    second, _ = await _key(gw, "a", None)
    other, other_id = await _key(gw, "b", {"rpm": 10})
    await gw.client(api_key=first).chat.completions.create(model="demo", messages=HELLO)
    await gw.client(api_key=second).chat.completions.create(model="demo", messages=HELLO)
    await gw.client(api_key=other).chat.completions.create(model="demo", messages=HELLO)
    await gw.flush()
    costs = dict(gw.query("SELECT key_id, cost_usd FROM usage"))
    assert len(costs) == 3 and all(c > 0 for c in costs.values())

    # A key with no limits of its own: every field null, its team's figures in full.
    mine = (await _me(gw, second))["budget"]
    assert mine["key"] == {
        "rpm": None,
        "tpm": None,
        "max_concurrent": None,
        "budget": None,
        "end_user": None,
        "spent_usd": None,
        "period_start": None,
    }
    assert mine["team"]["spent_usd"] == pytest.approx(sum(costs.values()) - costs[other_id])
    assert mine["team"]["spent_usd"] == pytest.approx(gw.gateway.limiter.held("team", "a").spent)
    assert (await _me(gw, first))["budget"]["key"]["spent_usd"] == pytest.approx(costs[first_id])

    # Team b's key: its own limits and its team's spend, none of team a's.
    theirs = await _me(gw, other)
    assert (theirs["team_id"], theirs["key_id"]) == ("b", other_id)
    assert theirs["budget"]["key"]["rpm"] == 10
    assert theirs["budget"]["key"]["spent_usd"] is None  # no budget of its own
    assert theirs["budget"]["team"]["budget"] == {"usd": 2.0, "period": "total", "mode": "hard"}
    assert theirs["budget"]["team"]["period_start"] == 0
    assert theirs["budget"]["team"]["spent_usd"] == pytest.approx(costs[other_id])


async def test_the_master_key_has_no_budget(gw: GatewayUnderTest) -> None:
    me = await _me(gw, MASTER)
    assert (me["kind"], me["budget"]) == ("admin", None)
