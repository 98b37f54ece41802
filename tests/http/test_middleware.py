"""The outermost middleware (gateway.http.middleware): errors answered in the client's shape."""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from gateway.errors import GatewayError
from gateway.http import middleware
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.freed import all_freed, collector_off
from tests.http.test_limits import HELLO, setup


@pytest.fixture
def answered(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[weakref.ref[GatewayError]]]:
    """Every error answered meanwhile, weakly; the cyclic collector off, so that only
    reference counting frees them."""
    made: list[weakref.ref[GatewayError]] = []
    error_response = middleware.error_response

    def recording(error: GatewayError, *args: Any, **kwargs: Any) -> Any:
        made.append(weakref.ref(error))
        return error_response(error, *args, **kwargs)

    monkeypatch.setattr(middleware, "error_response", recording)
    with collector_off():
        yield made


async def test_a_refusal_raised_from_a_local_is_freed_once_answered(
    make_gateway: MakeGateway, answered: list[weakref.ref[GatewayError]]
) -> None:
    """A budget's refusal is raised as `error = ...; raise error`: the frame holds the error,
    whose traceback holds the frame."""
    gw, key = await setup(make_gateway, team={"budget": {"usd": 1e-9, "period": "day"}})
    with pytest.raises(openai.RateLimitError) as refused:
        await gw.client(api_key=key).chat.completions.create(model="demo", messages=HELLO)
    assert refused.value.code == "budget_exceeded"
    await all_freed(answered)


async def test_an_unknown_path_is_answered_without_a_cycle_through_the_request(
    gw: GatewayUnderTest, answered: list[weakref.ref[GatewayError]]
) -> None:
    """aiohttp's router keeps its 404 in the request's match info: through the 404's
    traceback, the middleware's frame (holding the request and the error it answers with)."""
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/v1/nope") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "not_found"
    await all_freed(answered)
