"""Limits per end user under a key or team (`end_user`): each end user (the request's `user`,
else the configured header) is a scope of its own, admitted by the same rules as a key or a
team: a hard budget holds against 64 concurrent requests of one end user while another end
user of the same team goes on being served, on SQLite and on PostgreSQL with Redis; rate
limits and soft budgets apply per end user; and what an end user spent is read back from the
usage records, as a restart reads it."""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream
from tests.metering.budgeted import MASTER, Held, backend

__all__ = ["backend"]  # the fixture, run on each backend

HELLO = [{"role": "user", "content": "Hello"}]
# USD per token: a request of `max_tokens=10` reserves and bills 0.1 USD, its prompt free.
OUTPUT = 0.01
COMPLETION = 10


def answer(upstream: FakeUpstream, held: Held) -> Any:
    async def script(request: web.Request) -> web.StreamResponse:
        await held.arrive()
        usage = {"prompt_tokens": 5, "completion_tokens": COMPLETION, "total_tokens": 15}
        message = {"role": "assistant", "content": "ok"}
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": upstream.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
        )

    return script


async def team_with(
    make_gateway: MakeGateway,
    upstream: FakeUpstream | None,
    team_limits: dict[str, Any] | None = None,
    key_limits: dict[str, Any] | None = None,
    new_team: bool = True,
    **sections: Any,
) -> tuple[GatewayUnderTest, str]:
    """A gateway with a priced `fake` alias (or the demo), a team `t` (unless its store has
    it: not `new_team`) and a key of it."""
    models: list[dict[str, Any]] = [
        {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]}
    ]
    if upstream is not None:
        price = {"input_cost_per_mtok": 0.0, "output_cost_per_mtok": OUTPUT * 1e6}
        models.append(
            {
                "name": "fake",
                "retry": {"max_attempts": 1},
                "deployments": [upstream.deployment(**price)],
            }
        )
    gw = await make_gateway(models=models, auth={"master_key": MASTER}, **sections)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        team = {"id": "t", "name": "T", "limits": team_limits}
        if new_team:
            async with session.post(gw.url + "/v1/gateway/teams", json=team) as r:
                assert r.status == 201, await r.text()
        async with session.post(
            gw.url + "/v1/gateway/keys", json={"team_id": "t", "limits": key_limits}
        ) as r:
            assert r.status == 201, await r.text()
            secret: str = (await r.json())["key"]
    return gw, secret


async def test_an_end_users_hard_budget_holds_under_64_concurrent_requests(
    make_gateway: MakeGateway, upstream: FakeUpstream, backend: dict[str, Any]
) -> None:
    budget = 0.35  # three requests' worth
    gw, key = await team_with(
        make_gateway,
        upstream,
        team_limits={"end_user": {"budget": {"usd": budget, "period": "day"}}},
        **backend,
    )
    held = Held()
    script = answer(upstream, held)
    upstream.push(*[script] * 64)
    api = gw.client(api_key=key)

    async def send() -> None:
        await api.chat.completions.create(
            model="fake", messages=HELLO, max_tokens=COMPLETION, user="alice"
        )

    await held.run(send, openai.RateLimitError)
    assert held.arrived == 3
    await gw.flush()
    alice = gw.gateway.usage.spent("team.user", "t:alice", 0.0)
    assert await alice == pytest.approx(0.3)
    # Another end user of the same team has a budget of its own; the team has none.
    upstream.push(answer(upstream, Held(0)))
    await api.chat.completions.create(
        model="fake", messages=HELLO, max_tokens=COMPLETION, user="bob"
    )
    with pytest.raises(openai.RateLimitError) as caught:
        await send()
    assert caught.value.code == "budget_exceeded"
    assert "team.user" in caught.value.message


async def test_an_end_users_spend_is_read_back_from_the_records(
    make_gateway: MakeGateway, upstream: FakeUpstream, backend: dict[str, Any]
) -> None:
    """What a restarted process (or a new period's first request) starts from."""
    gw, key = await team_with(make_gateway, upstream, **backend)
    api = gw.client(api_key=key)
    for user in ("alice", "alice", "bob"):
        upstream.push(answer(upstream, Held(0)))
        await api.chat.completions.create(
            model="fake", messages=HELLO, max_tokens=COMPLETION, user=user
        )
    await gw.flush()
    usage = gw.gateway.usage
    assert await usage.spent("team.user", "t:alice", 0.0) == pytest.approx(0.2)
    assert await usage.spent("team.user", "t:bob", 0.0) == pytest.approx(0.1)
    key_id = (await gw.gateway.keys.keys("t"))[0].id
    assert await usage.spent("key.user", f"{key_id}:alice", 0.0) == pytest.approx(0.2)
    assert await usage.spent("team", "t", 0.0) == pytest.approx(0.3)


async def test_an_end_users_rate_limit_from_the_configured_header(
    make_gateway: MakeGateway,
) -> None:
    gw, key = await team_with(
        make_gateway,
        None,
        key_limits={"end_user": {"rpm": 1}},
        limits={"end_user_header": "X-End-User"},
    )
    api = gw.client(api_key=key)
    alice = {"X-End-User": "alice"}
    await api.chat.completions.create(model="demo", messages=HELLO, extra_headers=alice)
    with pytest.raises(openai.RateLimitError) as caught:
        await api.chat.completions.create(model="demo", messages=HELLO, extra_headers=alice)
    assert caught.value.code == "rate_limit_exceeded"
    assert int(caught.value.response.headers["Retry-After"]) >= 1
    # Another end user, and a request naming none, are not held to alice's minute.
    await api.chat.completions.create(
        model="demo", messages=HELLO, extra_headers={"X-End-User": "bob"}
    )
    await api.chat.completions.create(model="demo", messages=HELLO)
    # The request's own `user` comes before the header.
    await api.chat.completions.create(
        model="demo", messages=HELLO, user="carol", extra_headers=alice
    )
    await gw.flush()
    users = [row[0] for row in gw.query('SELECT "user" FROM usage ORDER BY created_at')]
    assert users == ["alice", "bob", None, "carol"]


async def test_an_end_users_soft_budget_warns(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw, key = await team_with(
        make_gateway,
        upstream,
        key_limits={"end_user": {"budget": {"usd": 0.05, "period": "total", "mode": "soft"}}},
    )
    upstream.push(answer(upstream, Held(0)))
    api = gw.client(api_key=key)
    raw = await api.chat.completions.with_raw_response.create(
        model="fake", messages=HELLO, max_tokens=COMPLETION, user="alice"
    )
    assert "key.user budget" in raw.headers["X-Gateway-Budget-Warning"]


async def test_end_user_limits_are_set_and_checked_by_the_admin_api(
    make_gateway: MakeGateway,
) -> None:
    gw, _ = await team_with(make_gateway, None)
    headers = {"Authorization": f"Bearer {MASTER}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        limits = {"end_user": {"rpm": 5, "budget": {"usd": 2, "period": "week"}}}
        async with session.patch(gw.url + "/v1/gateway/teams/t", json={"limits": limits}) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["limits"]["end_user"]["rpm"] == 5
        nested = {"end_user": {"end_user": {"rpm": 1}}}
        async with session.patch(gw.url + "/v1/gateway/teams/t", json={"limits": nested}) as r:
            assert r.status == 400
            assert "end_user.end_user" in (await r.json())["error"]["message"]
