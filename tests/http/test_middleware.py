"""The outermost middleware (gateway.http.middleware): errors answered in the client's shape."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from gateway.errors import GatewayError
from gateway.http import middleware
from tests.conftest import GatewayUnderTest, MakeGateway
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
    gc.collect()
    gc.disable()
    try:
        yield made
    finally:
        gc.enable()


async def _all_freed(answered: list[weakref.ref[GatewayError]]) -> None:
    """Until every answered error is freed: at once once its handler has returned, unless a
    cycle holds it (then never, with the collector off), and with it the request's frames."""
    assert answered, "no error was answered"
    try:
        async with asyncio.timeout(5):
            while any(ref() is not None for ref in answered):
                await asyncio.sleep(0.001)
    except TimeoutError:
        raise AssertionError("an answered error outlived its request") from None


async def test_a_refusal_raised_from_a_local_is_freed_once_answered(
    make_gateway: MakeGateway, answered: list[weakref.ref[GatewayError]]
) -> None:
    """A budget's refusal is raised as `error = ...; raise error`: the frame holds the error,
    whose traceback holds the frame."""
    gw, key = await setup(make_gateway, team={"budget": {"usd": 1e-9, "period": "day"}})
    with pytest.raises(openai.RateLimitError) as refused:
        await gw.client(api_key=key).chat.completions.create(model="demo", messages=HELLO)
    assert refused.value.code == "budget_exceeded"
    await _all_freed(answered)


async def test_an_unknown_path_is_answered_without_a_cycle_through_the_request(
    gw: GatewayUnderTest, answered: list[weakref.ref[GatewayError]]
) -> None:
    """aiohttp's router keeps its 404 in the request's match info: through the 404's
    traceback, the middleware's frame (holding the request and the error it answers with)."""
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/v1/nope") as response:
        assert response.status == 404
        assert (await response.json())["error"]["code"] == "not_found"
    await _all_freed(answered)
