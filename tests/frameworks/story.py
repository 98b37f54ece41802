"""The run every framework test plays, and what the gateway must have made of it.

An agent with two tools answers a question about two cities in three tool rounds (the second
with two parallel calls), then in text. Without `X-Conversation-Id` (no framework sends one),
issue 30 asks that such a run be one conversation of consecutive turns, its tool results
recorded as real `tool/result` events, never a synthetic ABORTED_BEFORE_DISPATCH one; that a
second run is a second conversation; and that a streamed answer the client abandons is
recorded, as delivered, in the conversation of its run.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic import BaseModel

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks.scripts import Call, reply

WEATHER = {"Paris": "21 C, sunny", "London": "14 C, rain"}
TIME = {"Paris": "14:05", "London": "13:05"}
QUESTION = "What is the weather and the time in Paris and London?"
SECOND_QUESTION = "And in Paris alone?"


def get_weather(city: str) -> str:
    """The current weather in a city."""
    return f"{city}: {WEATHER[city]}"


def get_time(city: str) -> str:
    """The local time in a city."""
    return f"{city}: {TIME[city]}"


TOOLS = {"get_weather": get_weather, "get_time": get_time}

ROUNDS = [
    [Call("call_w_paris", "get_weather", {"city": "Paris"})],
    [
        Call("call_w_london", "get_weather", {"city": "London"}),
        Call("call_t_london", "get_time", {"city": "London"}),
    ],
    [Call("call_t_paris", "get_time", {"city": "Paris"})],
]
FINAL = ["Paris: 21 C and sunny at 14:05. ", "London: 14 C ", "and rain at 13:05."]
ANSWER = "".join(FINAL)

# The answer a client abandons: it reads CANCEL_READ of the parts sent, the fake sends
# CANCEL_SENT and then stalls, and CANCEL_FULL is what the model would have said.
CANCEL_PARTS = ["In Paris ", "it is ", "sunny ", "and ", "21 C, ", "so take ", "sunglasses."]
CANCEL_SENT = 5
CANCEL_READ = 3
CANCEL_FULL = "".join(CANCEL_PARTS)


class Forecast(BaseModel):
    """Structured output: what frameworks parse from a json_schema (or tool) answer."""

    city: str
    celsius: int
    sunny: bool


FORECAST = Forecast(city="Paris", celsius=21, sunny=True)


def result(call: Call) -> str:
    return TOOLS[call.name](**call.arguments)


def queue_tool_loop(upstream: FakeUpstream) -> None:
    """The three tool rounds and the final answer, in the order the model gives them."""
    for calls in ROUNDS:
        upstream.push(reply(calls=calls))
    upstream.push(reply(FINAL))


def queue_short_run(upstream: FakeUpstream, suffix: str = "2") -> None:
    """A second run: one tool round, then the answer."""
    upstream.push(reply(calls=[Call(f"call_w_paris_{suffix}", "get_weather", {"city": "Paris"})]))
    upstream.push(reply("Still sunny in Paris."))


def queue_cancelled_run(upstream: FakeUpstream) -> None:
    """A tool round, then an answer that stalls after CANCEL_SENT parts."""
    upstream.push(reply(calls=ROUNDS[0]))
    upstream.stall_after(CANCEL_PARTS[:CANCEL_SENT])


# -- what the upstream was sent ----------------------------------------------------------------


def text_of(content: Any) -> str:
    """A message's text, whether sent as a string or as text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(part.get("text", "") for part in content)


def tool_messages(request: dict[str, Any]) -> dict[str, str]:
    """tool_call_id -> content of the tool results in an upstream chat request."""
    return {
        m["tool_call_id"]: text_of(m["content"]) for m in request["messages"] if m["role"] == "tool"
    }


def check_tool_loop_requests(upstream: FakeUpstream, first: int = 0) -> None:
    """Each tool's output reached the model in the next request, and so did every earlier one;
    the assistant's tool calls went back with the same ids and arguments."""
    requests = upstream.requests[first : first + len(ROUNDS) + 1]
    assert len(requests) == len(ROUNDS) + 1, [r["messages"] for r in requests]
    assert all(r["model"] == "fake-model" for r in requests)
    for k, request in enumerate(requests):
        done = [call for calls in ROUNDS[:k] for call in calls]
        assert tool_messages(request) == {call.id: result(call) for call in done}
        sent_calls = [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"]))
            for m in request["messages"]
            if m["role"] == "assistant"
            for c in m.get("tool_calls") or []
        ]
        assert sent_calls == [(c.id, c.name, c.arguments) for c in done]
        users = [text_of(m["content"]) for m in request["messages"] if m["role"] == "user"]
        assert users == [QUESTION]


# -- what the gateway recorded -----------------------------------------------------------------


async def wait_turns_ended(gw: GatewayUnderTest, count: int, timeout: float = 10) -> None:
    """Until `count` turns have their turn/end event in the store."""
    async with asyncio.timeout(timeout):
        while True:
            await gw.flush()
            [(ended,)] = gw.query("SELECT COUNT(*) FROM events WHERE type = 'turn/end'")
            if ended >= count:
                return
            await asyncio.sleep(0.01)


def conversations(gw: GatewayUnderTest) -> list[tuple[str, int]]:
    """(conversation id, number of turns) of every conversation, the oldest first."""
    rows = gw.query(
        "SELECT conversation_id, COUNT(*) FROM turns GROUP BY conversation_id"
        " ORDER BY MIN(started_at)"
    )
    return [(str(cid), int(n)) for cid, n in rows]


TOOL_LOOP_EVENTS = [
    "user/message",
    *["assistant/message", "turn/end", "tool/result"],
    *["assistant/message", "turn/end", "tool/result", "tool/result"],
    *["assistant/message", "turn/end", "tool/result"],
    *["assistant/message", "turn/end"],
]


async def check_tool_loop_recorded(gw: GatewayUnderTest, conversation_id: str) -> None:
    """The run's four turns, in order, in one conversation; real tool results; no synthetic
    one in its model history."""
    events = await gw.wait_turn_end(conversation_id, count=len(ROUNDS) + 1)
    assert [e["type"] for e in events] == TOOL_LOOP_EVENTS
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    results = [e["payload"] for e in events if e["type"] == "tool/result"]
    calls = [call for calls in ROUNDS for call in calls]
    assert [(r["tool_call_id"], text_of(r["content"]), r["synthetic"]) for r in results] == [
        (call.id, result(call), False) for call in calls
    ]
    ends = [e["payload"]["status"] for e in events if e["type"] == "turn/end"]
    assert ends == ["completed"] * (len(ROUNDS) + 1)
    answers = [e["payload"] for e in events if e["type"] == "assistant/message"]
    assert [a["finish_reason"] for a in answers] == ["tool_calls"] * len(ROUNDS) + ["stop"]
    assert answers[-1]["content"] == [{"type": "text", "text": ANSWER}]
    messages = await gw.messages(conversation_id)
    assert "ABORTED_BEFORE_DISPATCH" not in json.dumps(messages)
    assert [m["role"] for m in messages] == [
        "user",
        *["assistant", "tool", "assistant", "tool", "tool", "assistant", "tool"],
        "assistant",
    ]
    assert messages[-1]["content"] == ANSWER


async def check_one_conversation_per_run(gw: GatewayUnderTest, turns: list[int]) -> list[str]:
    """Every run (of turns[i] turns, in order) is a conversation of its own; their ids."""
    await wait_turns_ended(gw, sum(turns))
    found = conversations(gw)
    assert [n for _, n in found] == turns, found
    return [cid for cid, _ in found]


async def check_cancel_recorded(gw: GatewayUnderTest, upstream: FakeUpstream, received: str) -> str:
    """The abandoned answer: in its run's conversation, after the tool round, an interrupted
    assistant/message holding a prefix of the answer at least as long as what the client
    read. The conversation id."""
    assert received == "".join(CANCEL_PARTS[:CANCEL_READ])
    await asyncio.wait_for(upstream.disconnected.wait(), 10)
    [conversation_id] = await check_one_conversation_per_run(gw, [2])
    events = await gw.wait_turn_end(conversation_id, count=2)
    assert [e["type"] for e in events] == [
        *["user/message", "assistant/message", "turn/end", "tool/result"],
        *["assistant/message", "turn/end"],
    ]
    assert events[3]["payload"]["synthetic"] is False
    message, end = events[4]["payload"], events[5]["payload"]
    assert message["interrupted"] is True
    assert end["status"] == "aborted" and end["reason"] == "client_disconnect"
    [block] = message["content"]
    recorded = block["text"]
    assert recorded.startswith(received), (recorded, received)
    assert CANCEL_FULL.startswith(recorded), (recorded, CANCEL_FULL)
    messages = await gw.messages(conversation_id)
    assert messages[-1] == {"role": "assistant", "content": recorded}
    assert "ABORTED_BEFORE_DISPATCH" not in json.dumps(messages)
    return conversation_id
