"""Each turn records the request headers that say who called and how, never a credential."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import anthropic
import orjson
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "master-key-for-tests-0123456789"
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> GatewayUnderTest:
    return await make_gateway(
        auth={"master_key": MASTER}, conversations={"session_headers": ["X-Session-Id"]}
    )


def _recorded(gw: GatewayUnderTest) -> dict[str, Any]:
    [(request,)] = gw.query("SELECT request FROM turns")
    return orjson.loads(request)  # type: ignore[no-any-return]


async def test_an_openai_sdk_request_records_its_identity_and_no_secret(
    gw: GatewayUnderTest,
) -> None:
    client = gw.client(
        api_key=MASTER,
        default_headers={
            "X-Session-Id": "chat-7",
            "Cookie": "session=abcdef0123456789",
            "X-Api-Key": "sk-also-a-secret-0123456789",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "OpenAI-Beta": "assistants=v2",
        },
    )
    await client.chat.completions.create(model="demo", messages=HELLO)
    await gw.flush()
    headers = _recorded(gw)["headers"]
    assert headers["user-agent"].startswith("AsyncOpenAI/Python ")
    assert headers["x-stainless-lang"] == "python"
    assert headers["x-stainless-package-version"] == headers["user-agent"].split(" ")[1]
    assert headers["x-session-id"] == "chat-7"
    assert headers["openai-beta"] == "assistants=v2"
    assert headers["traceparent"].startswith("00-0af7651916cd43dd")
    # Never the key, nor the cookie, nor another credential header.
    assert not {"authorization", "cookie", "x-api-key"} & set(headers)
    [(row,)] = gw.query("SELECT request FROM turns")
    for secret in (MASTER, "abcdef0123456789", "sk-also-a-secret"):
        assert secret not in row


async def test_an_anthropic_sdk_request_records_its_api_version(gw: GatewayUnderTest) -> None:
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key=MASTER, max_retries=0)
    try:
        await client.messages.create(
            model="demo",
            max_tokens=50,
            messages=[{"role": "user", "content": "Hello"}],
            extra_headers={"anthropic-beta": "output-128k-2025-02-19"},
        )
    finally:
        await client.close()
    await gw.flush()
    headers = _recorded(gw)["headers"]
    assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", headers["anthropic-version"])
    assert headers["anthropic-beta"] == "output-128k-2025-02-19"
    assert headers["user-agent"].startswith("AsyncAnthropic/Python ")
    assert "x-api-key" not in headers
    assert MASTER not in gw.query("SELECT request FROM turns")[0][0]


async def test_a_session_header_named_like_a_credential_is_not_recorded(
    make_gateway: MakeGateway,
) -> None:
    gw = await make_gateway(conversations={"session_headers": ["X-Session-Token"]})
    client = gw.client(default_headers={"X-Session-Token": "chat-8"})
    await client.chat.completions.create(model="demo", messages=HELLO)
    await gw.flush()
    assert "x-session-token" not in _recorded(gw)["headers"]
    assert "chat-8" not in gw.query("SELECT request FROM turns")[0][0]


async def test_the_event_log_carries_each_turns_recorded_request(gw: GatewayUnderTest) -> None:
    """What the admin UI's request panel shows: the request each listed turn recorded."""
    client = gw.client(api_key=MASTER)
    first = await client.chat.completions.with_raw_response.create(
        model="demo",
        messages=[{"role": "system", "content": "Be brief."}, *HELLO],
        temperature=0.5,
    )
    conversation = first.headers["X-Conversation-Id"]
    answer = first.parse().choices[0].message.content
    second = await client.chat.completions.with_raw_response.create(
        model="demo",
        messages=[
            *HELLO,
            {"role": "assistant", "content": answer},
            {"role": "user", "content": "More"},
        ],
        extra_headers={"X-Conversation-Id": conversation},
    )
    await gw.flush()
    headers = {"Authorization": f"Bearer {MASTER}"}
    url = f"{gw.url}/v1/conversations/{conversation}/events"
    async with aiohttp.ClientSession(headers=headers) as session, session.get(url) as response:
        assert response.status == 200, await response.text()
        body = await response.json()
    turns = body["turns"]
    assert [t["id"] for t in turns] == [
        first.headers["X-Gateway-Turn-Id"],
        second.headers["X-Gateway-Turn-Id"],
    ]
    assert turns[0]["request"]["instructions"] == [{"role": "system", "content": "Be brief."}]
    assert turns[0]["request"]["params"]["temperature"] == 0.5
    assert turns[0]["request"]["request_id"] == first.headers["X-Request-Id"]
    assert MASTER not in orjson.dumps(turns).decode()
