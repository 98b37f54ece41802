"""Keys and teams: who may call, what they may use, and that a key sees only its team's data."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, frames

MASTER = "master-key-for-tests-0123456789"
HELLO = [{"role": "user", "content": "Hello"}]


async def admin(gw: GatewayUnderTest, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {MASTER}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gw.url + path, json=body, headers=headers) as response,
    ):
        return response.status, await response.json()


async def as_key(gw: GatewayUnderTest, key: str, path: str) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(gw.url + path, headers={"Authorization": f"Bearer {key}"}) as response,
    ):
        return response.status, await response.json()


async def new_key(gw: GatewayUnderTest, team: str, **extra: Any) -> dict[str, Any]:
    status, body = await admin(gw, "POST", "/v1/gateway/keys", {"team_id": team, **extra})
    assert status == 201, body
    return body  # type: ignore[no-any-return]


@pytest.fixture
async def secured(make_gateway: MakeGateway, upstream: FakeUpstream) -> GatewayUnderTest:
    gw = await make_gateway(upstream=upstream, auth={"master_key": MASTER})
    for team in ("red", "blue"):
        status, _ = await admin(gw, "POST", "/v1/gateway/teams", {"id": team, "name": team.title()})
        assert status == 201
    return gw


def client(gw: GatewayUnderTest, key: str, **kwargs: Any) -> openai.AsyncOpenAI:
    made = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0, **kwargs)
    gw.clients.append(made)
    return made


async def test_requests_need_a_valid_key(secured: GatewayUnderTest) -> None:
    for key in ("sk-not-ours", "gw-made-up-key"):
        with pytest.raises(openai.AuthenticationError) as caught:
            await client(secured, key).chat.completions.create(model="demo", messages=HELLO)
        assert caught.value.status_code == 401
    async with aiohttp.ClientSession() as session:
        async with session.get(secured.url + "/v1/models") as response:
            assert response.status == 401
            assert (await response.json())["error"]["code"] == "missing_api_key"
        async with session.get(secured.url + "/health/ready") as response:
            assert response.status == 200  # probes need no key
    answer = await client(secured, MASTER).chat.completions.create(model="demo", messages=HELLO)
    assert answer.choices[0].message.content


async def test_a_virtual_key_works_and_is_stored_only_hashed(
    secured: GatewayUnderTest, caplog: pytest.LogCaptureFixture
) -> None:
    created = await new_key(secured, "red", name="ci")
    secret = created["key"]
    assert secret.startswith("gw-")
    assert created["key_prefix"] == secret[:7]
    caplog.set_level(logging.DEBUG)
    answer = await client(secured, secret).chat.completions.create(model="demo", messages=HELLO)
    assert answer.choices[0].message.content
    assert secret not in caplog.text
    # Listed without the secret; the file holds only its hash.
    _, listed = await admin(secured, "GET", "/v1/gateway/keys?team_id=red")
    assert [k["id"] for k in listed["data"]] == [created["id"]]
    assert "key" not in listed["data"][0]
    await secured.flush()
    assert secured.query("SELECT hash FROM keys") == [
        (hashlib.sha256(secret.encode()).hexdigest(),)
    ]
    raw = b"".join(p.read_bytes() for p in secured.db_path.parent.glob("gateway.db*"))
    assert secret.encode() not in raw


async def test_revoked_and_expired_keys_get_401(secured: GatewayUnderTest) -> None:
    live = await new_key(secured, "red")
    api = client(secured, live["key"])
    await api.models.list()  # cached as valid
    status, revoked = await admin(secured, "DELETE", f"/v1/gateway/keys/{live['id']}")
    assert status == 200 and revoked["revoked_at"] is not None
    with pytest.raises(openai.AuthenticationError) as caught:
        await api.models.list()
    assert caught.value.code == "api_key_revoked"
    expired = await new_key(secured, "red", expires_at=time.time() - 1)
    with pytest.raises(openai.AuthenticationError) as caught:
        await client(secured, expired["key"]).models.list()
    assert caught.value.code == "api_key_expired"


async def test_a_key_uses_only_its_allowed_models(secured: GatewayUnderTest) -> None:
    limited = await new_key(secured, "red", models=["demo"])
    api = client(secured, limited["key"])
    assert [m.id for m in (await api.models.list()).data] == ["demo"]
    with pytest.raises(openai.NotFoundError) as caught:
        await api.chat.completions.create(model="fake", messages=HELLO)
    assert caught.value.code == "model_not_found"
    status, body = await admin(
        secured, "PATCH", f"/v1/gateway/keys/{limited['id']}", {"models": None}
    )
    assert status == 200 and body["models"] is None
    assert [m.id for m in (await api.models.list()).data] == ["demo", "fake"]


async def test_admin_endpoints_need_the_master_key(secured: GatewayUnderTest) -> None:
    key = (await new_key(secured, "red"))["key"]
    for path in ("/v1/gateway/keys", "/v1/gateway/teams", "/v1/gateway/deployments"):
        status, body = await as_key(secured, key, path)
        assert status == 403
        assert body["error"]["type"] == "permission_error"


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/v1/gateway/keys", {"team_id": "nope"}, 400, "team_id"),
        ("/v1/gateway/keys", {"team_id": "red", "colour": "x"}, 400, "colour"),
        ("/v1/gateway/keys", {"team_id": "red", "models": ["gpt-9"]}, 400, "models"),
        ("/v1/gateway/teams", {"id": "red", "name": "Again"}, 409, None),
        ("/v1/gateway/teams", {"name": ""}, 400, "name"),
    ],
)
async def test_bad_admin_requests(
    secured: GatewayUnderTest, path: str, body: dict[str, Any], status: int, param: str | None
) -> None:
    got, answer = await admin(secured, "POST", path, body)
    assert got == status
    assert answer["error"]["param"] == param


async def test_a_key_sees_only_its_teams_conversations(
    secured: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    red = (await new_key(secured, "red"))["key"]
    blue = (await new_key(secured, "blue"))["key"]
    response = await client(secured, red).chat.completions.with_raw_response.create(
        model="demo", messages=HELLO
    )
    conversation_id = response.headers["X-Conversation-Id"]
    await secured.wait_turn_end(conversation_id)
    for path in ("events", "messages"):
        assert (await as_key(secured, red, f"/v1/conversations/{conversation_id}/{path}"))[0] == 200
        status, body = await as_key(secured, blue, f"/v1/conversations/{conversation_id}/{path}")
        assert status == 404
        assert conversation_id in body["error"]["message"]  # as for an id that does not exist
        status, _ = await admin(secured, "GET", f"/v1/conversations/{conversation_id}/{path}")
        assert status == 200  # the admin sees all
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{secured.url}/v1/conversations/{conversation_id}/branches",
            json={"at_seq": 1},
            headers={"Authorization": f"Bearer {blue}"},
        ) as r:
            assert r.status == 404
    # Nor can blue write into it by naming it: the id names a conversation of blue's own.
    before = await secured.gateway.store.events(conversation_id)
    named = await client(
        secured, blue, default_headers={"X-Conversation-Id": conversation_id}
    ).chat.completions.with_raw_response.create(model="demo", messages=HELLO)
    assert named.headers["X-Conversation-Id"] == f"{conversation_id}~blue"
    await secured.flush()
    assert await secured.gateway.store.events(conversation_id) == before
    # Nor stop red's stream.
    upstream.push(frames(chunk("Hi"), then="stall"))
    stream_response = await client(
        secured, red, default_headers={"X-Request-Id": "red-req-1"}
    ).chat.completions.with_raw_response.create(model="fake", messages=HELLO, stream=True)
    stream = stream_response.parse()
    async for _ in stream:
        break
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{secured.url}/v1/chat/completions/red-req-1/cancel",
            headers={"Authorization": f"Bearer {blue}"},
        ) as r:
            assert r.status == 404
        async with session.post(
            f"{secured.url}/v1/chat/completions/red-req-1/cancel",
            headers={"Authorization": f"Bearer {red}"},
        ) as r:
            assert r.status == 200
    await stream.close()


async def test_turns_are_attributed_to_the_key_and_team(secured: GatewayUnderTest) -> None:
    created = await new_key(secured, "blue")
    response = await client(secured, created["key"]).chat.completions.with_raw_response.create(
        model="demo", messages=HELLO
    )
    conversation_id = response.headers["X-Conversation-Id"]
    await secured.wait_turn_end(conversation_id)
    assert secured.query("SELECT team_id, key_id FROM turns") == [("blue", created["id"])]
    assert secured.query("SELECT team_id FROM conversations") == [("blue",)]


async def test_keys_made_with_the_cli_work(secured: GatewayUnderTest, tmp_path: Path) -> None:
    config = tmp_path / "cli.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{secured.db_path}'}}\n"
        "models: [{name: demo, deployments: [{provider: demo}]}]\n"
    )
    result = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "gateway",
            "keys",
            "create",
            "--team",
            "red",
            "--config",
            str(config),
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    secret = result.stdout.split("secret (shown once, store it now): ")[1].strip()
    answer = await client(secured, secret).chat.completions.create(model="demo", messages=HELLO)
    assert answer.choices[0].message.content


async def test_the_key_may_come_as_x_api_key(secured: GatewayUnderTest) -> None:
    secret = (await new_key(secured, "red"))["key"]
    async with aiohttp.ClientSession() as session:
        async with session.get(secured.url + "/v1/models", headers={"x-api-key": secret}) as r:
            assert r.status == 200
        async with session.get(secured.url + "/v1/models", headers={"x-api-key": "gw-nope"}) as r:
            assert r.status == 401


async def test_a_key_sees_only_its_teams_responses(secured: GatewayUnderTest) -> None:
    red = (await new_key(secured, "red"))["key"]
    blue = (await new_key(secured, "blue"))["key"]
    made = await client(secured, red).responses.create(model="demo", input="Hello")
    assert (await client(secured, red).responses.retrieve(made.id)).id == made.id
    for call in (
        client(secured, blue).responses.retrieve(made.id),
        client(secured, blue).responses.input_items.list(made.id),
        client(secured, blue).responses.create(
            model="demo", input="More", previous_response_id=made.id
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            await call
    assert (await client(secured, MASTER).responses.retrieve(made.id)).id == made.id
