"""Budget notices: each configured threshold of a budget is told once a period, to a local
webhook (signed with the shared secret, retried when it fails) and in the log, whichever
replica notices it, on SQLite and on PostgreSQL with Redis."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.metering.budget_alerts import SIGNATURE_HEADER, BudgetWatch
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream
from tests.metering.budgeted import Held, backend
from tests.metering.test_end_user_limits import COMPLETION, HELLO, answer, team_with

__all__ = ["backend"]  # the fixture, run on each backend

SECRET = "webhook-secret-for-tests-0123"


class Receiver:
    """A webhook: keeps each notice it accepts; answers the first POST 500, to be retried."""

    def __init__(self) -> None:
        self.notices: list[dict[str, Any]] = []
        self.posts = 0
        self.changed = asyncio.Condition()

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        expected = "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert request.headers[SIGNATURE_HEADER] == expected
        self.posts += 1
        if self.posts == 1:
            return web.Response(status=500)
        async with self.changed:
            self.notices.append(json.loads(body))
            self.changed.notify_all()
        return web.Response(status=204)

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(10), self.changed:
            await self.changed.wait_for(lambda: len(self.notices) >= count)


async def _gateway(
    make_gateway: MakeGateway,
    upstream: FakeUpstream,
    url: str,
    backend: dict[str, Any],
    new_team: bool = True,
) -> tuple[GatewayUnderTest, str]:
    limits = {**backend.get("limits", {})}
    limits["budget_alerts"] = {"webhook_url": url, "webhook_secret": SECRET}
    gw, key = await team_with(
        make_gateway,
        upstream,
        team_limits={"budget": {"usd": 0.35, "period": "month"}},
        new_team=new_team,
        store=backend.get("store", {}),
        limits=limits,
    )
    watch = gw.gateway.limiter.watch
    assert isinstance(watch, BudgetWatch)
    watch.backoff_s = 0.01
    return gw, key


async def test_each_threshold_is_told_once(
    make_gateway: MakeGateway,
    upstream: FakeUpstream,
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    backend: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.handle)
    hook = await aiohttp_server(app)
    url = str(hook.make_url("/hook"))
    gw, key = await _gateway(make_gateway, upstream, url, backend)
    api = gw.client(api_key=key)

    async def send() -> None:
        upstream.push(answer(upstream, Held(0)))
        await api.chat.completions.create(model="fake", messages=HELLO, max_tokens=COMPLETION)

    caplog.set_level(logging.WARNING, "gateway.metering.budget_alerts")
    # 0.1 USD each against 0.35: the fourth finds 0.3 spent (86%) and is refused (100%).
    for _ in range(3):
        await send()
    assert receiver.notices == []
    for _ in range(3):
        with pytest.raises(openai.RateLimitError):
            await send()
    await receiver.wait_for(2)
    by_threshold = {n["threshold"]: n for n in receiver.notices}
    assert sorted(by_threshold) == [0.8, 1.0]
    eighty = by_threshold[0.8]
    assert eighty["scope"] == "team" and eighty["team_id"] == "t"
    assert eighty["budget_usd"] == 0.35 and eighty["period"] == "month"
    assert eighty["spent_usd"] == pytest.approx(0.3)
    assert by_threshold[1.0]["refused"] is True
    assert receiver.posts == 3  # the first answered 500, and was sent again
    told = [r.getMessage() for r in caplog.records if "budget notice: the team" in r.getMessage()]
    assert len(told) == 2

    # Another replica (or this one restarted) notices the same thresholds: the store says
    # they were told this period.
    other, other_key = await _gateway(make_gateway, upstream, url, backend, new_team=False)
    with pytest.raises(openai.RateLimitError):
        await other.client(api_key=other_key).chat.completions.create(
            model="fake", messages=HELLO, max_tokens=COMPLETION
        )
    watch = other.gateway.limiter.watch
    assert watch is not None
    await watch.close()  # every notice it started is settled
    await gw.gateway.limiter.watch.close()  # type: ignore[union-attr]
    assert len(receiver.notices) == 2


async def test_without_a_webhook_thresholds_are_logged(
    make_gateway: MakeGateway,
    upstream: FakeUpstream,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gw, key = await team_with(
        make_gateway,
        upstream,
        team_limits={"budget": {"usd": 0.35, "period": "day", "mode": "soft"}},
        limits={"budget_alerts": {"thresholds": [0.5, 1.0]}},
    )
    caplog.set_level(logging.WARNING, "gateway.metering.budget_alerts")
    api = gw.client(api_key=key)
    for _ in range(6):  # soft: every one goes through; spend passes 0.5 and then 1.0
        upstream.push(answer(upstream, Held(0)))
        await api.chat.completions.create(model="fake", messages=HELLO, max_tokens=COMPLETION)
    watch = gw.gateway.limiter.watch
    assert watch is not None
    await watch.close()
    told = [r.getMessage() for r in caplog.records if "budget notice: the team" in r.getMessage()]
    assert len(told) == 2
    assert "reached 50%" in told[0] and "reached 100%" in told[1]


def test_a_webhook_needs_its_secret() -> None:
    from gateway.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="webhook_secret"):
        parse_config(
            {
                "models": [{"name": "demo", "deployments": [{"provider": "demo"}]}],
                "limits": {"budget_alerts": {"webhook_url": "https://hooks.example.com/b"}},
            }
        )
