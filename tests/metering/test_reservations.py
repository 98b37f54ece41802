"""Reservations that hold: every output bound and `n` checked before anything is reserved or
recorded, `n` times the bound reserved (else the model's maximum output from the price map),
so concurrent requests cannot spend past a hard budget whatever they ask for."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.metering.prices import resolve
from gateway.metering.tokens import count_messages
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import DONE, FakeUpstream, Script, chunk, completion, sse

MASTER = "master-key-for-tests-0123456789"
HELLO = [{"role": "user", "content": "Hello"}]
# USD per token of the priced fake deployment below: 1 and 5 USD per million.
INPUT, OUTPUT = 1e-6, 5e-6


async def gateway_with_team(
    make_gateway: MakeGateway, models: list[dict[str, Any]], team_limits: dict[str, Any]
) -> tuple[GatewayUnderTest, str]:
    gw = await make_gateway(models=models, auth={"master_key": MASTER})
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        team = {"id": "t", "name": "T", "limits": team_limits}
        async with session.post(gw.url + "/v1/gateway/teams", json=team) as r:
            assert r.status == 201, await r.text()
        async with session.post(gw.url + "/v1/gateway/keys", json={"team_id": "t"}) as r:
            assert r.status == 201, await r.text()
            secret: str = (await r.json())["key"]
    return gw, secret


async def post(
    gw: GatewayUnderTest, path: str, key: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + path, json=body, headers=headers) as response,
    ):
        if response.content_type == "text/event-stream":
            await response.read()
            return response.status, {}
        return response.status, await response.json()


def priced(upstream: FakeUpstream, **extra: Any) -> dict[str, Any]:
    deployment = upstream.deployment(
        input_cost_per_mtok=INPUT * 1e6, output_cost_per_mtok=OUTPUT * 1e6, **extra
    )
    return {"name": "fake", "retry": {"max_attempts": 1}, "deployments": [deployment]}


CHAT = "/v1/chat/completions"
BAD: list[tuple[str, dict[str, Any], str]] = [
    (CHAT, {"max_tokens": -1_000_000_000_000}, "max_tokens"),
    (CHAT, {"max_tokens": 0}, "max_tokens"),
    (CHAT, {"max_tokens": -1}, "max_tokens"),
    (CHAT, {"max_tokens": 2**31}, "max_tokens"),
    (CHAT, {"max_tokens": 10**30}, "max_tokens"),  # past 64 bits: a float once parsed
    (CHAT, {"max_tokens": 1.5}, "max_tokens"),
    (CHAT, {"max_tokens": "100"}, "max_tokens"),
    (CHAT, {"max_tokens": True}, "max_tokens"),
    (CHAT, {"max_completion_tokens": 0}, "max_completion_tokens"),
    (CHAT, {"max_completion_tokens": -5, "max_tokens": 10}, "max_completion_tokens"),
    (CHAT, {"n": 0}, "n"),
    (CHAT, {"n": 129}, "n"),
    (CHAT, {"n": -8}, "n"),
    (CHAT, {"n": 2.0}, "n"),
    ("/v1/messages", {"max_tokens": 0}, "max_tokens"),
    ("/v1/messages", {"max_tokens": -1_000_000_000_000}, "max_tokens"),
    ("/v1/messages", {"max_tokens": 2**31}, "max_tokens"),
    ("/v1/responses", {"max_output_tokens": 0}, "max_output_tokens"),
    ("/v1/responses", {"max_output_tokens": -1}, "max_output_tokens"),
    ("/v1/responses", {"max_output_tokens": 2**31}, "max_output_tokens"),
]


def request_body(path: str, extra: dict[str, Any]) -> dict[str, Any]:
    if path == "/v1/responses":
        return {"model": "fake", "input": "Hello", **extra}
    if path == "/v1/messages":
        return {"model": "fake", "messages": HELLO, **extra}
    return {"model": "fake", "messages": HELLO, **extra}


async def test_bad_output_bounds_and_n_are_400_and_change_nothing(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    limits = {"rpm": 1000, "tpm": 10_000_000, "budget": {"usd": 500, "period": "day"}}
    gw, key = await gateway_with_team(make_gateway, [priced(upstream)], limits)
    # One good request first, so the store and the limiter hold something to compare.
    upstream.push(completion("Hi"))
    status, _ = await post(gw, CHAT, key, request_body(CHAT, {"max_tokens": 50}))
    assert status == 200
    await gw.flush()
    tables = ("turns", "events", "usage", "conversations")

    def store() -> list[Any]:
        return [gw.query(f"SELECT count(*) FROM {table}")[0][0] for table in tables]

    limiter = gw.gateway.limiter
    before_store, before_limits = store(), limiter.held("team", "t")
    asked = len(upstream.requests)
    for path, extra, param in BAD:
        status, body = await post(gw, path, key, request_body(path, extra))
        assert status == 400, (path, extra, body)
        error = body["error"]
        assert error.get("param", param) == param, (extra, body)  # Anthropic's shape has none
        assert f"'{param}'" in error["message"], (extra, body)
    await gw.flush()
    assert store() == before_store
    assert limiter.held("team", "t") == before_limits
    assert len(upstream.requests) == asked


async def test_n_times_the_bound_is_reserved_and_refused_past_a_hard_budget(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    prompt = count_messages(HELLO)
    one = prompt * INPUT + 1000 * OUTPUT  # n: 1, max_tokens: 1000
    eight = prompt * INPUT + 8 * 1000 * OUTPUT
    budget = (one + eight) / 2
    gw, key = await gateway_with_team(
        make_gateway, [priced(upstream)], {"budget": {"usd": budget, "period": "day"}}
    )
    status, body = await post(gw, CHAT, key, request_body(CHAT, {"max_tokens": 1000, "n": 8}))
    assert status == 429 and body["error"]["code"] == "budget_exceeded"
    assert f"this request reserves {eight:.6f} USD" in body["error"]["message"]
    upstream.push(completion("Hi"))
    status, _ = await post(gw, CHAT, key, request_body(CHAT, {"max_tokens": 1000}))
    assert status == 200


async def test_without_a_bound_the_models_maximum_output_is_reserved(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    # gpt-4o-mini: litellm's map says 16,384 output tokens at most.
    deployment = upstream.deployment(model="gpt-4o-mini")
    models = [{"name": "fake", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    gw, key = await gateway_with_team(make_gateway, models, {"budget": {"usd": 1, "period": "day"}})
    price = resolve("gpt-4o-mini", "openai").price
    assert price is not None
    upstream.push(held_answer(upstream, completion_tokens=3))
    task = asyncio.create_task(post(gw, CHAT, key, request_body(CHAT, {"stream": True})))
    await asyncio.wait_for(upstream.stalled.wait(), 10)
    reserved = gw.gateway.limiter.held("team", "t").reserved
    assert reserved == pytest.approx(price.cost(count_messages(HELLO), 16_384))
    upstream.release.set()
    status, _ = await task
    assert status == 200
    await gw.flush()
    spent = gw.query("SELECT SUM(cost_usd) FROM usage")[0][0]
    held = gw.gateway.limiter.held("team", "t")
    assert held.reserved == 0 and held.in_flight == 0
    assert held.spent == pytest.approx(spent)  # settled to the real cost


def held_answer(
    upstream: FakeUpstream, *, completion_tokens: int, prompt_tokens: int = 5
) -> Script:
    """A streamed answer that waits for `release` after its first chunk, then reports usage."""

    async def script(request: web.Request) -> web.StreamResponse:
        response = await upstream.start_sse(request)
        await upstream.write(response, chunk("Hello"))
        upstream.stalled.set()
        await upstream.release.wait()
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        await upstream.write(response, chunk(finish="stop"))
        await upstream.write(
            response, sse({**upstream.chunk_object({}), "choices": [], "usage": usage})
        )
        await upstream.write(response, DONE)
        await response.write_eof()
        return response

    return script


async def test_twenty_concurrent_n8_requests_stay_within_a_hard_budget(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    """All admitted requests are in flight together, and each then really produces all it may
    (8 choices of 100 tokens): the worst case, and spend still stays within the budget."""
    prompt = count_messages(HELLO)
    reservation = prompt * INPUT + 8 * 100 * OUTPUT
    budget = 5.5 * reservation
    gw, key = await gateway_with_team(
        make_gateway, [priced(upstream)], {"budget": {"usd": budget, "period": "day"}}
    )
    decided = asyncio.Event()
    outcomes: list[int] = []
    arrived = 0

    def check() -> None:
        if arrived + sum(s == 429 for s in outcomes) == 20:
            decided.set()

    async def answer(request: web.Request) -> web.StreamResponse:
        nonlocal arrived
        arrived += 1
        check()
        return await held_answer(upstream, completion_tokens=800, prompt_tokens=prompt)(request)

    for _ in range(20):
        upstream.push(answer)

    async def one() -> None:
        extra = {"max_tokens": 100, "n": 8, "stream": True}
        status, body = await post(gw, CHAT, key, request_body(CHAT, extra))
        if status == 429:
            assert body["error"]["code"] == "budget_exceeded"
        outcomes.append(status)
        check()

    tasks = [asyncio.create_task(one()) for _ in range(20)]
    await asyncio.wait_for(decided.wait(), 30)
    # Every request is decided and the admitted ones are all in flight: their reservations
    # are what the budget holds.
    held = gw.gateway.limiter.held("team", "t")
    assert held.in_flight == arrived == 5
    assert held.spent + held.reserved <= budget
    upstream.release.set()
    await asyncio.gather(*tasks)
    assert sorted(outcomes) == [200] * 5 + [429] * 15
    await gw.flush()
    spent = gw.query("SELECT SUM(cost_usd) FROM usage WHERE team_id = 't'")[0][0]
    assert spent == pytest.approx(5 * reservation)
    assert spent <= budget
    assert gw.query("SELECT count(*) FROM turns")[0][0] == 5
