"""GET /v1/conversations/{id}/turns/{turn_id}/live: a streaming turn's answer as its client has
it, growing while it runs, then how it ended: what an admin watches before pressing Stop."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from gateway.storage.records import TurnStart
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, frames
from tests.http.test_turn_cancel import QUESTION, _call, _gateway

FIRST, MORE = ["One, ", "two, "], ["three, ", "four."]


class Live:
    """The live view's events, read one at a time."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.response = response

    async def next(self) -> tuple[str, Any]:
        name, data = "", b""
        while True:
            line = (await self.response.content.readline()).rstrip(b"\n")
            assert line or name, "the view ended without an event"
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data = line[6:]
            elif not line:
                return name, orjson.loads(data)


def texts(content: list[dict[str, Any]]) -> str:
    return "".join(block.get("text", "") for block in content)


async def test_the_view_grows_with_what_the_client_has_then_ends(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw, keys = await _gateway(make_gateway, upstream)
    upstream.push(frames(*(chunk(p) for p in FIRST), then="stall"))
    raw = await gw.client(api_key=keys["a"]).chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION, stream=True
    )
    conversation_id, turn_id = raw.headers["X-Conversation-Id"], raw.headers["X-Gateway-Turn-Id"]
    path = f"/v1/conversations/{conversation_id}/turns/{turn_id}/live"
    stream, received = raw.parse(), ""
    async for part in stream:
        received += part.choices[0].delta.content or ""
        if received == "".join(FIRST):
            break
    headers = {"Authorization": f"Bearer {keys['a']}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(gw.url + path) as response,
    ):
        assert response.status == 200
        assert response.headers["Content-Type"] == "text/event-stream"
        live = Live(response)
        name, data = await live.next()
        assert (name, texts(data["content"])) == ("answer", "".join(FIRST))
        # Another team's key sees no such conversation.
        async with (
            aiohttp.ClientSession() as other,
            other.get(gw.url + path, headers={"Authorization": f"Bearer {keys['b']}"}) as refused,
        ):
            assert refused.status == 404
        # The Stop button: the view ends with the turn, as its client had it.
        status, body = await _call(gw, keys["a"], path.replace("/live", "/cancel"))
        assert status == 200, body
        events = [await live.next()]
        while events[-1][0] != "end":
            events.append(await live.next())
        assert events[-1] == ("end", {"status": "interrupted"})
        assert all(texts(data["content"]) == received for name, data in events[:-1])
    async for _ in stream:
        pass
    # A turn that has ended answers its end at once.
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(gw.url + path) as response,
    ):
        assert await Live(response).next() == ("end", {"status": "interrupted"})


async def test_a_turn_unknown_is_404_and_one_run_elsewhere_says_so(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw: GatewayUnderTest
    gw, keys = await _gateway(make_gateway, upstream)
    upstream.push(frames(*(chunk(p) for p in MORE), chunk(finish="stop")))
    raw = await gw.client(api_key=keys["a"]).chat.completions.with_raw_response.create(
        model="fake", messages=QUESTION, stream=True
    )
    async for _ in raw.parse():
        pass
    conversation_id = raw.headers["X-Conversation-Id"]
    headers = {"Authorization": f"Bearer {keys['a']}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(f"{gw.url}/v1/conversations/{conversation_id}/turns/turn_nope/live") as r,
    ):
        assert r.status == 404
    # A turn the store has open that no task here runs (another replica's): said at once.
    store = gw.gateway.store
    store.start_turn(TurnStart("turn_elsewhere", conversation_id, 1.0, {"model": "fake"}, "a"))
    await store.flush()
    path = f"/v1/conversations/{conversation_id}/turns/turn_elsewhere/live"
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(gw.url + path) as response,
    ):
        assert response.status == 200
        assert await Live(response).next() == ("elsewhere", {})
