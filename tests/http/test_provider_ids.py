"""The provider's own id for an answer, kept beside the id its client was sent: an OpenAI SDK
client on an Anthropic deployment is sent `chatcmpl-…`, Anthropic's logs say `msg_…`, and the
conversation list finds the conversation by either, exactly; on SQLite and on PostgreSQL."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import Reply, completion, status
from tests.providers.upstreams import AnthropicServer

MASTER = "sk-provider-ids-master-0123456789"
MESSAGE_ID = "msg_01XFDUDYJgAACzvnptvVoYEL"  # Anthropic's shape


class Claude(AnthropicServer):
    """Anthropic Messages with a message id of the real shape, streamed or whole."""

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        frames = super().frames(reply, request, body)
        return [f.replace(b'"msg_fake"', f'"{MESSAGE_ID}"'.encode()) for f in frames]

    def whole(self, text: str) -> None:
        async def script(request: web.Request) -> web.StreamResponse:
            return web.json_response(
                {
                    "id": MESSAGE_ID,
                    "type": "message",
                    "role": "assistant",
                    "model": self.model,
                    "content": [{"type": "text", "text": text}],
                    "stop_reason": "end_turn",
                    "usage": {"input_tokens": 10, "output_tokens": 3},
                }
            )

        self.push(script)


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}


async def listed(gw: GatewayUnderTest, **query: str) -> list[str]:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            gw.url + "/v1/conversations",
            params=query,
            headers={"Authorization": f"Bearer {MASTER}"},
        ) as response:
            body = await response.json()
            assert response.status == 200, body
            return [c["id"] for c in body["data"]]


async def turn_of(gw: GatewayUnderTest, conversation_id: str) -> tuple[dict[str, Any], list[Any]]:
    events = await gw.wait_turn_end(conversation_id)
    async with aiohttp.ClientSession() as session:
        async with session.get(
            f"{gw.url}/v1/conversations/{conversation_id}/events",
            headers={"Authorization": f"Bearer {MASTER}"},
        ) as response:
            body = await response.json()
    [turn] = body["turns"]
    return turn, events


@pytest.mark.parametrize("stream", [True, False])
async def test_a_chat_client_on_anthropic_finds_its_conversation_by_either_id(
    make_gateway: MakeGateway, aiohttp_server: Any, backend: dict[str, Any], stream: bool
) -> None:
    claude = await Claude().start(aiohttp_server)
    gw = await make_gateway(
        models=[{"name": "claude", "deployments": [claude.deployment()]}],
        auth={"master_key": MASTER},
        store=backend,
    )
    if stream:
        claude.text(["Hello", " there."])
    else:
        claude.whole("Hello there.")
    client = gw.client(MASTER)
    raw = await client.chat.completions.with_raw_response.create(
        model="claude", messages=[{"role": "user", "content": "Hi"}], stream=stream
    )
    sent = {chunk.id async for chunk in raw.parse()} if stream else {raw.parse().id}
    [answer_id] = sent
    assert answer_id.startswith("chatcmpl-")  # the client's dialect, not Anthropic's
    conversation_id = raw.headers["X-Conversation-Id"]
    turn, events = await turn_of(gw, conversation_id)
    assert (turn["response_id"], turn["upstream_id"]) == (answer_id, MESSAGE_ID)
    [message] = [e["payload"] for e in events if e["type"] == "assistant/message"]
    assert message["upstream_id"] == MESSAGE_ID
    assert await listed(gw, id=MESSAGE_ID) == [conversation_id]
    assert await listed(gw, id=answer_id) == [conversation_id]
    assert await listed(gw, id=MESSAGE_ID[:-1]) == []  # exactly


async def test_an_anthropic_client_on_openai_finds_its_conversation_by_either_id(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, backend: dict[str, Any]
) -> None:
    openai_like = await make_upstream()
    gw = await make_gateway(
        models=[{"name": "gpt", "deployments": [openai_like.deployment()]}],
        auth={"master_key": MASTER},
        store=backend,
    )
    openai_like.push(completion("Hello there."))
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/messages",
            json={
                "model": "gpt",
                "max_tokens": 100,
                "messages": [{"role": "user", "content": "Hi"}],
            },
            headers={"x-api-key": MASTER, "anthropic-version": "2023-06-01"},
        ) as response:
            body = await response.json()
            assert response.status == 200, body
            conversation_id = response.headers["X-Conversation-Id"]
    assert body["id"].startswith("msg_")
    turn, _ = await turn_of(gw, conversation_id)
    assert (turn["response_id"], turn["upstream_id"]) == (body["id"], "chatcmpl-fake")
    assert await listed(gw, id="chatcmpl-fake") == [conversation_id]
    assert await listed(gw, id=body["id"]) == [conversation_id]


async def test_the_same_dialect_keeps_one_id_and_each_attempt_its_own(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, backend: dict[str, Any]
) -> None:
    """Relayed unchanged, the client's id is the provider's: stored once, in each attempt's
    record too; a failed attempt that never answered has none."""
    a, b = await make_upstream(), await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "deployments": [a.deployment(name="a"), b.deployment(name="b")],
                "retry": {"backoff_s": 0.01},
            }
        ],
        auth={"master_key": MASTER},
        store=backend,
    )
    a.push(status(529, {"error": {"message": "overloaded", "type": "server_error"}}))
    b.push(completion("Whole."))
    answer = await gw.client(MASTER).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Hi"}]
    )
    conversation_id = answer.headers["X-Conversation-Id"]
    turn, events = await turn_of(gw, conversation_id)
    answer_id = answer.parse().id
    assert turn["response_id"] == answer_id and turn["upstream_id"] is None
    [message] = [e["payload"] for e in events if e["type"] == "assistant/message"]
    assert message["upstream_id"] == answer_id
    [failed] = [e["payload"] for e in events if e["type"] == "assistant/attempt"]
    assert "upstream_id" not in failed
    assert await listed(gw, id=answer_id) == [conversation_id]
