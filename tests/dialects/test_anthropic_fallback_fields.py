"""Anthropic request fields the gateway does not offer, answered in the shape Anthropic's SDKs
recover from by themselves: `thread` (message threads) is refused with
`error.details.error_code: "thread_unsupported_request"`, on which `toolRunner()` and message
threads send the turn again with the whole history and no `thread`.
(`@anthropic-ai/sdk`'s own `toolRunner()`: tests/js/test_js_clients.py.)"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import anthropic
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, Script, status
from tests.providers.upstreams import AnthropicServer

QUESTION = {"role": "user", "content": "What is the weather in Paris?"}


def chat_json(content: str | None = None, call: dict[str, Any] | None = None) -> Script:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if call is not None:
        message["tool_calls"] = [call]
    return status(
        200,
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1,
            "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if call else "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        },
    )


async def post_messages(gw: GatewayUnderTest, body: dict[str, Any]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/messages", json=body) as response,
    ):
        return response.status, await response.json()


async def test_thread_is_refused_in_the_shape_the_sdks_fall_back_from(
    make_gateway: MakeGateway,
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    upstream: FakeUpstream,
) -> None:
    """For every deployment, an Anthropic one too: the gateway keeps the conversation, so a
    thread held by one upstream account is never what a turn relies on. Nothing is sent
    upstream and nothing is recorded."""
    claude = await AnthropicServer().start(aiohttp_server)
    gw = await make_gateway(
        models=[
            {"name": "fake", "deployments": [upstream.deployment()]},
            {"name": "claude", "deployments": [claude.deployment()]},
        ]
    )
    for model in ("fake", "claude"):
        body = {
            "model": model,
            "max_tokens": 100,
            "messages": [QUESTION],
            "thread": {"type": "create"},
        }
        code, answer = await post_messages(gw, body)
        assert code == 400, answer
        assert answer == {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "'thread' is not supported: this gateway keeps the conversation"
                " itself; send the whole history without 'thread'.",
                "details": {"error_code": "thread_unsupported_request", "unsupported": []},
            },
        }
    assert upstream.requests == [] and claude.requests == []
    await gw.flush()
    assert gw.query("SELECT count(*) FROM turns") == [(0,)]


async def test_a_null_thread_is_no_thread(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(chat_json("Sunny."))
    body = {"model": "fake", "max_tokens": 100, "messages": [QUESTION], "thread": None}
    code, answer = await post_messages(gw, body)
    assert code == 200, answer
    assert "thread" not in upstream.requests[0]


async def test_the_python_sdk_tool_runner_completes_in_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """`client.beta.messages.tool_runner()` threads by default: refused once, it runs the loop
    on whole histories, which the gateway records as one conversation of two turns."""
    call = {
        "id": "call_w1",
        "type": "function",
        "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})},
    }
    upstream.push(chat_json(call=call), chat_json("It is 18C in Paris."))
    executed: list[str] = []

    @anthropic.beta_async_tool
    async def weather(city: str) -> str:
        """The weather in a city."""
        executed.append(city)
        return json.dumps({"city": city, "celsius": 18})

    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="unused", max_retries=0)
    async with client:
        runner = client.beta.messages.tool_runner(
            model="fake", max_tokens=100, messages=[QUESTION], tools=[weather]
        )
        final = await runner.until_done()
    assert [b.text for b in final.content if b.type == "text"] == ["It is 18C in Paris."]
    assert executed == ["Paris"]
    assert all("thread" not in r for r in upstream.requests)
    assert [m["role"] for m in upstream.requests[1]["messages"]] == ["user", "assistant", "tool"]
    await gw.flush()
    (conversation,) = gw.query("SELECT id FROM conversations")
    events = await gw.wait_turn_end(conversation[0], 2)
    assert [e["type"] for e in events if e["type"] != "turn/end"] == [
        "user/message",
        "assistant/message",
        "tool/result",
        "assistant/message",
    ]
