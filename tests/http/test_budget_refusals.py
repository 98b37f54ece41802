"""A request a hard budget refuses tells the client when the budget renews and not to retry:
the OpenAI and Anthropic SDKs, whose rules retry a 429, send it once."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from types import ModuleType
from typing import Any

import anthropic
import httpx
import httpx2
import openai
import pytest

from tests.conftest import MakeGateway
from tests.http.test_limits import HELLO, setup


def _until_tomorrow() -> float:
    now = datetime.now(UTC)
    tomorrow = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    return (tomorrow - now).total_seconds()


class Counted:
    """An HTTP client for an SDK (of `http`, the httpx it is built on) that counts the requests
    it sends."""

    def __init__(self, http: ModuleType = httpx) -> None:
        self.sent = 0

        async def count(request: Any) -> None:
            self.sent += 1

        self.client = http.AsyncClient(event_hooks={"request": [count]})


async def test_the_openai_sdk_sends_a_refused_request_once(make_gateway: MakeGateway) -> None:
    gw, key = await setup(make_gateway, team={"budget": {"usd": 1e-9, "period": "day"}})
    counted = Counted()
    api = openai.AsyncOpenAI(
        base_url=gw.url + "/v1", api_key=key, max_retries=3, http_client=counted.client
    )
    before = _until_tomorrow()
    with pytest.raises(openai.RateLimitError) as caught:
        await api.chat.completions.create(model="demo", messages=HELLO)
    after = _until_tomorrow()
    await api.close()
    assert caught.value.code == "budget_exceeded"
    assert counted.sent == 1
    headers = caught.value.response.headers
    assert headers["x-should-retry"] == "false"
    # Whole seconds until the next UTC midnight, when a daily budget renews.
    assert after - 1 <= int(headers["Retry-After"]) <= before + 1


async def test_the_anthropic_sdk_sends_a_refused_request_once(make_gateway: MakeGateway) -> None:
    gw, key = await setup(make_gateway, key={"budget": {"usd": 1e-9, "period": "month"}})
    counted = Counted(httpx2)
    api = anthropic.AsyncAnthropic(
        base_url=gw.url, api_key=key, max_retries=3, http_client=counted.client
    )
    with pytest.raises(anthropic.RateLimitError) as caught:
        await api.messages.create(model="demo", max_tokens=50, messages=HELLO)  # type: ignore[arg-type]
    await api.close()
    assert counted.sent == 1
    headers = caught.value.response.headers
    assert headers["x-should-retry"] == "false"
    now = datetime.now(UTC)
    first = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    renews = (first + timedelta(days=32)).replace(day=1)
    assert abs(int(headers["Retry-After"]) - (renews.timestamp() - time.time())) <= 2


async def test_a_total_budget_never_renews_so_says_no_time(make_gateway: MakeGateway) -> None:
    gw, key = await setup(make_gateway, key={"budget": {"usd": 1e-9, "period": "total"}})
    counted = Counted()
    api = openai.AsyncOpenAI(
        base_url=gw.url + "/v1", api_key=key, max_retries=2, http_client=counted.client
    )
    with pytest.raises(openai.RateLimitError) as caught:
        await api.chat.completions.create(model="demo", messages=HELLO)
    await api.close()
    assert counted.sent == 1
    headers = caught.value.response.headers
    assert headers["x-should-retry"] == "false"
    assert "Retry-After" not in headers
