"""POST /v1/conversations/{id}/turns/{turn_id}/cancel: a Stop button that names the turn."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, completion, frames, hang_before_headers

MASTER = "master-key-for-tests-0123456789"
QUESTION = [{"role": "user", "content": "Count slowly."}]
SENT = ["One, ", "two, ", "three, "]


async def _gateway(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> tuple[GatewayUnderTest, dict[str, str]]:
    """A gateway with a master key and two teams, `a` and `b`, with a key each."""
    gw = await make_gateway(upstream=upstream, auth={"master_key": MASTER})
    keys = {}
    for team in ("a", "b"):
        await _call(gw, MASTER, "/v1/gateway/teams", {"id": team, "name": team}, expect=201)
        _, made = await _call(gw, MASTER, "/v1/gateway/keys", {"team_id": team}, expect=201)
        keys[team] = made["key"]
    return gw, keys


async def _call(
    gw: GatewayUnderTest, key: str, path: str, body: Any = None, *, expect: int | None = None
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.post(gw.url + path, json=body) as response,
    ):
        answer = await response.json()
        if expect is not None:
            assert response.status == expect, answer
        return response.status, answer


async def test_cancel_by_ids_mid_stream(make_gateway: MakeGateway, upstream: FakeUpstream) -> None:
    gw, keys = await _gateway(make_gateway, upstream)
    upstream.push(frames(*(chunk(p) for p in SENT), then="stall"))
    client = gw.client(api_key=keys["a"])
    raw = await client.chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION, stream=True
    )
    conversation_id = raw.headers["X-Conversation-Id"]
    turn_id = raw.headers["X-Gateway-Turn-Id"]
    path = f"/v1/conversations/{conversation_id}/turns/{turn_id}/cancel"
    received = ""
    finishes = []
    cancelled: tuple[int, Any] | None = None
    async for part in raw.parse():
        received += part.choices[0].delta.content or ""
        finishes.append(part.choices[0].finish_reason)
        if received == "".join(SENT) and cancelled is None:
            # Another team sees no such conversation, and its try leaves the turn running.
            status, body = await _call(gw, keys["b"], path)
            assert (status, body["error"]["code"]) == (404, "not_found")
            assert turn_id in gw.gateway.cancels.by_turn
            cancelled = await _call(gw, keys["a"], path)
    # The client's stream ended cleanly after what it had, with the cancelled finish.
    assert received == "".join(SENT)
    assert finishes[-1] == "cancelled"
    assert cancelled is not None
    status, body = cancelled
    assert status == 200, body
    assert body == {
        "object": "conversation.turn.cancellation",
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "status": "interrupted",
    }
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    # Recorded as a client's cancel records it: interrupted, with exactly what was received.
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    assert events[1]["payload"]["interrupted"] is True
    assert events[1]["payload"]["content"] == [{"type": "text", "text": received}]
    assert (events[2]["payload"]["status"], events[2]["payload"]["reason"]) == (
        "aborted",
        "client_cancel",
    )
    # It has ended: a second cancel is a conflict, not a second recording.
    status, body = await _call(gw, keys["a"], path)
    assert (status, body["error"]["code"]) == (409, "turn_ended")
    # Another team's key still sees nothing, ended or not.
    status, _ = await _call(gw, keys["b"], path)
    assert status == 404
    await gw.flush()
    assert gw.query("SELECT count(*) FROM events WHERE type = 'turn/end'") == [(1,)]


async def test_unknown_turn_is_404(make_gateway: MakeGateway, upstream: FakeUpstream) -> None:
    gw, keys = await _gateway(make_gateway, upstream)
    upstream.push(completion("Hi"))
    raw = await gw.client(api_key=keys["a"]).chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION
    )
    conversation_id = raw.headers["X-Conversation-Id"]
    status, body = await _call(
        gw, keys["a"], f"/v1/conversations/{conversation_id}/turns/turn_nope/cancel"
    )
    assert (status, body["error"]["code"]) == (404, "turn_not_in_flight")
    # The turn that answered has ended: a conflict.
    turn_id = raw.headers["X-Gateway-Turn-Id"]
    status, body = await _call(
        gw, keys["a"], f"/v1/conversations/{conversation_id}/turns/{turn_id}/cancel"
    )
    assert (status, body["error"]["code"]) == (409, "turn_ended")
    # An unknown conversation is the same 404 as another team's.
    status, body = await _call(gw, keys["a"], "/v1/conversations/nope/turns/turn_nope/cancel")
    assert (status, body["error"]["code"]) == (404, "not_found")


async def test_master_key_cancels_any_team_s_turn(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw, keys = await _gateway(make_gateway, upstream)
    upstream.push(hang_before_headers())
    client = gw.client(api_key=keys["b"])
    task = asyncio.create_task(
        client.chat.completions.with_raw_response.create(
            model="fake", messages=QUESTION, stream=True
        )
    )
    await asyncio.wait_for(upstream.stalled.wait(), 5)
    await gw.flush()
    [(conversation_id, turn_id)] = gw.query("SELECT conversation_id, id FROM turns")
    status, body = await _call(
        gw, MASTER, f"/v1/conversations/{conversation_id}/turns/{turn_id}/cancel"
    )
    assert (status, body["turn_id"]) == (200, turn_id)
    raw = await task
    parts = [p async for p in raw.parse()]
    assert [p.choices[0].finish_reason for p in parts] == ["cancelled"]
    events = await gw.wait_turn_end(conversation_id)
    assert events[-1]["payload"]["reason"] == "client_cancel"
