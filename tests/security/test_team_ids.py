"""Ids a client chooses live in its team's namespace: two teams using one conversation id or
request id never meet, and neither can tell whether the other uses it (docs/recording.md,
"Conversations and branches")."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, frames

MASTER = "team-ids-master-key-0123456789"


async def call(
    gw: GatewayUnderTest,
    method: str,
    path: str,
    key: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.request(
            method,
            gw.url + path,
            json=body,
            headers={"Authorization": f"Bearer {key}", **(headers or {})},
        ) as response:
            return response.status, await response.json()


async def setup_teams(gw: GatewayUnderTest) -> tuple[str, str]:
    keys = []
    for team in ("red", "blue"):
        status, _ = await call(gw, "POST", "/v1/gateway/teams", MASTER, {"id": team, "name": team})
        assert status == 201
        status, made = await call(gw, "POST", "/v1/gateway/keys", MASTER, {"team_id": team})
        assert status == 201
        keys.append(made["key"])
    return keys[0], keys[1]


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(request: pytest.FixtureRequest, make_gateway: MakeGateway) -> GatewayUnderTest:
    store = {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    return await make_gateway(auth={"master_key": MASTER}, store=store)


def say(text: str) -> dict[str, Any]:
    return {"model": "demo", "messages": [{"role": "user", "content": text}]}


async def test_two_teams_claiming_one_id_at_once_never_share_it(gw: GatewayUnderTest) -> None:
    red, blue = await setup_teams(gw)
    trials = 1000 if gw.gateway.store.dialect == "sqlite" else 300

    async def trial(n: int) -> None:
        chosen = {"X-Conversation-Id": f"shared-{n}"}
        (status_r, _), (status_b, _) = await asyncio.gather(
            call(gw, "POST", "/v1/chat/completions", red, say(f"red {n}"), chosen),
            call(gw, "POST", "/v1/chat/completions", blue, say(f"blue {n}"), chosen),
        )
        assert (status_r, status_b) == (200, 200)

    for start in range(0, trials, 50):
        await asyncio.gather(*(trial(n) for n in range(start, min(start + 50, trials))))
    for n in range(0, trials, 97):  # a sample read back through the API, each team its own
        for key, team in ((red, "red"), (blue, "blue")):
            status, body = await call(gw, "GET", f"/v1/conversations/shared-{n}/messages", key)
            assert status == 200
            assert [m["content"] for m in body["data"] if m["role"] == "user"] == [f"{team} {n}"]
    # Every turn is in a conversation of its own team, in that team's namespace.
    await gw.flush()
    rows = await gw.gateway.store.run(
        lambda db: db.fetch(
            "SELECT c.id, c.team_id, t.team_id FROM turns t"
            " JOIN conversations c ON c.id = t.conversation_id"
        )
    )
    assert len(rows) == 2 * trials
    assert all(
        conv_team == turn_team and cid.endswith(f"~{turn_team}")
        for cid, conv_team, turn_team in rows
    )


async def test_another_teams_ids_are_not_observable(gw: GatewayUnderTest) -> None:
    red, blue = await setup_teams(gw)
    status, _ = await call(
        gw, "POST", "/v1/chat/completions", red, say("secret"), {"X-Conversation-Id": "plan"}
    )
    assert status == 200
    status, made = await call(gw, "POST", "/v1/conversations", red, {"items": []})
    generated = made["id"]
    # Blue asking for red's ids gets what it gets for ids nobody uses.
    for path in ("/v1/conversations/plan/messages", f"/v1/conversations/{generated}",
                 "/v1/conversations/plan~red/events", f"/v1/conversations/{generated}/messages",
                 "/v1/conversations/nobody-uses-this/messages"):  # fmt: skip
        status, body = await call(gw, "GET", path, blue)
        assert status == 404, (path, body)
    # Blue may use "plan" for itself: a conversation of its own, not red's.
    status, _ = await call(
        gw, "POST", "/v1/chat/completions", blue, say("mine"), {"X-Conversation-Id": "plan"}
    )
    assert status == 200
    status, body = await call(gw, "GET", "/v1/conversations/plan/messages", blue)
    assert [m["content"] for m in body["data"] if m["role"] == "user"] == ["mine"]
    # A listing cursor naming red's conversations gives blue what an unknown one does.
    pages = [
        (await call(gw, "GET", f"/v1/conversations?after={cursor}", blue))[1]["data"]
        for cursor in (generated, "plan~red", "nobody-uses-this")
    ]
    assert pages == [[], [], []]
    # Red still sees its own, by either form of the id; the master key by the stored one.
    for path, key in (("/v1/conversations/plan/messages", red),
                      ("/v1/conversations/plan~red/messages", red),
                      ("/v1/conversations/plan~red/messages", MASTER)):  # fmt: skip
        status, body = await call(gw, "GET", path, key)
        assert status == 200 and body["data"][0]["content"] == "secret"


async def test_a_request_id_is_each_teams_own(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(upstream=upstream, auth={"master_key": MASTER})
    red, blue = await setup_teams(gw)

    async def stream(key: str, received: asyncio.Event) -> bytes:
        async with aiohttp.ClientSession() as session:
            async with session.post(
                gw.url + "/v1/chat/completions",
                json={**say("hi"), "model": "fake", "stream": True},
                headers={"Authorization": f"Bearer {key}", "X-Request-Id": "stop-1"},
            ) as response:
                assert response.status == 200
                body = b""
                async for piece in response.content.iter_any():
                    body += piece
                    if b"Hello" in body:
                        received.set()
                return body

    for _ in range(2):
        upstream.push(frames(chunk("Hello"), then="stall"))
    red_seen, blue_seen = asyncio.Event(), asyncio.Event()
    red_task = asyncio.create_task(stream(red, red_seen))
    blue_task = asyncio.create_task(stream(blue, blue_seen))
    await red_seen.wait()
    await blue_seen.wait()
    status, _ = await call(gw, "POST", "/v1/chat/completions/stop-1/cancel", red, {})
    assert status == 200
    red_body = await red_task
    assert b'"finish_reason": "cancelled"' in red_body or b'"finish_reason":"cancelled"' in red_body
    assert not blue_task.done()
    status, _ = await call(gw, "POST", "/v1/chat/completions/stop-1/cancel", blue, {})
    assert status == 200
    await blue_task
