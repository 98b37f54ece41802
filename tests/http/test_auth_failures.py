"""Guessing the master key is slowed, logged and counted: past `auth.max_failures` wrong keys
from one address in `auth.failure_window_s`, its wrong keys and the master key itself get 429
with Retry-After (so a guess cannot tell right from wrong), while virtual keys still work."""

from __future__ import annotations

import logging
from typing import Any

import aiohttp
import pytest

from gateway import metrics
from gateway.http.auth_failures import FailedKeys
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "failures-master-key-0123456789abcdef"
GUESSES = [f"guess-{i:04d}-of-the-master-key-xyz" for i in range(6)]


def counted() -> dict[str, float]:
    return {o: metrics.AUTH_FAILURES.labels(o).value for o in ("refused", "rate_limited")}


async def get(gw: GatewayUnderTest, path: str, key: str) -> tuple[int, Any, dict[str, str]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(gw.url + path, headers={"Authorization": f"Bearer {key}"}) as response,
    ):
        return response.status, await response.json(), dict(response.headers)


async def test_wrong_master_keys_are_limited_logged_and_counted(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    gw = await make_gateway(auth={"master_key": MASTER, "max_failures": 3})
    status, _, _ = await get(gw, "/v1/models", MASTER)
    assert status == 200
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session,
        session.post(gw.url + "/v1/gateway/teams", json={"id": "t", "name": "T"}),
        session.post(gw.url + "/v1/gateway/keys", json={"team_id": "t"}) as response,
    ):
        team_key = (await response.json())["key"]
    before = counted()
    caplog.set_level(logging.WARNING, "gateway.http.auth_failures")

    for guess in GUESSES[:3]:  # within the limit: the usual 401
        status, body, _ = await get(gw, "/v1/conversations", guess)
        assert status == 401 and body["error"]["code"] == "invalid_api_key"
    for guess in GUESSES[3:]:  # past it: 429, and the key is not even looked at
        status, body, headers = await get(gw, "/v1/conversations", guess)
        assert status == 429, body
        assert body["error"]["code"] == "too_many_failed_keys"
        assert 1 <= int(headers["Retry-After"]) <= 60
    # The right key gets the same answer meanwhile: no guess learns it was right.
    status, body, headers = await get(gw, "/v1/conversations", MASTER)
    assert status == 429 and body["error"]["code"] == "too_many_failed_keys"
    assert "Retry-After" in headers
    # A virtual key cannot be guessed: it still works from the same address.
    status, _, _ = await get(gw, "/v1/models", team_key)
    assert status == 200
    # /openapi.json says which aliases a key may use: it counts and refuses the same way.
    status, doc, _ = await get(gw, "/openapi.json", MASTER)
    assert status == 200
    assert (
        "examples"
        not in doc["components"]["schemas"]["ChatCompletionRequest"]["properties"]["model"]
    )

    after = counted()
    assert after["refused"] - before["refused"] == 3
    assert after["rate_limited"] - before["rate_limited"] == 3
    records = [r for r in caplog.records if r.name == "gateway.http.auth_failures"]
    assert all(r.levelno == logging.WARNING for r in records)
    messages = [r.getMessage() for r in records]
    assert [m for m in messages if m.startswith("wrong API key from 127.0.0.1")] == [
        f"wrong API key from 127.0.0.1 ({i} of 3 allowed in 60 s)" for i in (1, 2, 3)
    ]
    assert [m for m in messages if "refused with 429" in m] == [
        "key attempts from 127.0.0.1 are refused with 429 for 60 s"
    ]
    assert len(messages) == 4  # the refusals during the block are counted, not logged
    logged = caplog.text
    assert not any(guess in logged for guess in GUESSES) and MASTER not in logged


def test_an_address_may_try_again_once_its_window_ends() -> None:
    failed = FailedKeys(max_failures=2, window_s=60)
    assert failed.failed("10.0.0.1", now=100) == 0
    assert failed.failed("10.0.0.1", now=110) == 0
    assert failed.blocked_for("10.0.0.1", now=110) == 50
    assert failed.failed("10.0.0.1", now=120) == 40  # blocked until its window's end
    assert failed.blocked_for("10.0.0.2", now=120) == 0  # per address
    assert failed.blocked_for("10.0.0.1", now=160) == 0
    assert failed.failed("10.0.0.1", now=161) == 0  # a new window
