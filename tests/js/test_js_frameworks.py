"""JavaScript agent frameworks that reshape the history they send back, driven against the
gateway as test_js_clients.py drives the SDKs: each run is still one conversation."""

from __future__ import annotations

import json

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.js.test_js_clients import call, chat_json, node, of_type, only_conversation, pytestmark

__all__ = ["pytestmark"]


async def test_mastra_agent_with_merged_tool_steps_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(
        chat_json(tool_calls=[call("call_p", "weather", {"city": "Paris"})]),
        chat_json(tool_calls=[call("call_l", "weather", {"city": "London"})]),
        chat_json("18C in Paris, 12C in London."),
        chat_json(tool_calls=[call("call_r", "weather", {"city": "Rome"})]),
        chat_json("12C in Rome."),
    )
    result = await node("mastra_agent.mjs", gw)
    assert result["texts"] == ["18C in Paris, 12C in London.", "12C in Rome."]
    assert result["steps"] == [3, 2]

    # The second run sent the first one's two steps as one assistant message.
    sent = upstream.requests[3]["messages"]
    assert [m["role"] for m in sent] == [
        *["system", "user", "assistant", "tool", "tool", "assistant", "user"]
    ]
    assert [c["id"] for c in sent[2]["tool_calls"]] == ["call_p", "call_l"]

    events = await only_conversation(gw, turns=5)
    assert [e["type"] for e in events] == [
        "user/message",
        *["assistant/message", "turn/end", "tool/result"] * 2,
        *["assistant/message", "turn/end", "user/message"],
        *["assistant/message", "turn/end", "tool/result"],
        *["assistant/message", "turn/end"],
    ]
    results = of_type(events, "tool/result")
    assert [r["tool_call_id"] for r in results] == ["call_p", "call_l", "call_r"]


async def test_vercel_previous_response_id_tool_loop_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """`providerOptions.openai.previousResponseId` with tools and `stopWhen`: the AI SDK sends
    the previous turn's response id with every step of the next turn, each step's input the
    question, the calls so far and their outputs. Each step continues the conversation; the
    previous response is not forked."""
    upstream.push(
        chat_json(tool_calls=[call("call_w1", "weather", {"city": "Paris"})]),
        chat_json("It is 18C in Paris."),
        chat_json(tool_calls=[call("call_w2", "weather", {"city": "London"})]),
        chat_json("It is 12C in London."),
    )
    result = await node("vercel_previous_response.mjs", gw)
    assert result["texts"] == ["It is 18C in Paris.", "It is 12C in London."]
    assert result["steps"] == [2, 2]
    previous = [p for p, _ in result["sent"]]
    assert previous == [None, None, result["responseIds"][0], result["responseIds"][0]]

    # The upstream got one history each time: nothing repeated, nothing synthetic.
    last = upstream.requests[3]["messages"]
    assert [m["role"] for m in last] == [
        *["user", "assistant", "tool", "assistant"],
        *["user", "assistant", "tool"],
    ]
    assert "ABORTED_BEFORE_DISPATCH" not in json.dumps(last)

    events = await only_conversation(gw, turns=4)
    assert [e["type"] for e in events] == [
        "user/message",
        *["assistant/message", "turn/end", "tool/result"],
        *["assistant/message", "turn/end", "user/message"],
        *["assistant/message", "turn/end", "tool/result"],
        *["assistant/message", "turn/end"],
    ]
    results = of_type(events, "tool/result")
    assert [r["tool_call_id"] for r in results] == ["call_w1", "call_w2"]
