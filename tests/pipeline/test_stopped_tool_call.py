"""A stream stopped once a tool call's arguments were whole (docs/recording.md, "The assembled
stream"): the client has the call and may run it, so the interrupted answer keeps it, and the
next request, carrying the call and its result, continues the conversation."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, chunk, completion, frames

QUESTION = {"role": "user", "content": "What is the weather in Paris?"}
HEAD = {"index": 0, "id": "call_w1", "type": "function", "function": {"name": "weather"}}
TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def argument(part: str) -> dict[str, Any]:
    return {"index": 0, "function": {"arguments": part}}


async def stop_after_whole_arguments(gw: GatewayUnderTest) -> tuple[str, dict[str, Any]]:
    """Stream the question; close the stream as soon as the call's arguments parse (the
    upstream has sent no finish yet). The conversation id, and the call as the client has it."""
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], tools=[TOOL], stream=True
    )
    conversation_id = raw.headers["X-Conversation-Id"]
    stream = raw.parse()
    name, arguments = "", ""
    async for event in stream:
        for call in event.choices[0].delta.tool_calls or ():
            name += (call.function and call.function.name) or ""
            arguments += (call.function and call.function.arguments) or ""
        try:
            json.loads(arguments)
        except json.JSONDecodeError:
            continue
        break
    await stream.close()
    call = {"id": "call_w1", "type": "function", "function": {"name": name, "arguments": arguments}}
    return conversation_id, call


async def test_a_call_stopped_with_whole_arguments_continues_with_its_result(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(
        frames(
            chunk(tool={**HEAD, "function": {"name": "weather", "arguments": ""}}),
            chunk(tool=argument('{"city":')),
            chunk(tool=argument(' "Paris"}')),
            then="stall",
        )
    )
    conversation_id, call = await stop_after_whole_arguments(gw)
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
    recorded = await gw.wait_turn_end(conversation_id)
    answer = next(e for e in recorded if e["type"] == "assistant/message")
    assert answer["payload"]["interrupted"] is True
    assert answer["payload"]["content"] == [
        {"type": "tool_call", "id": "call_w1", "name": "weather", "arguments": '{"city": "Paris"}'}
    ]

    # The client ran the tool anyway and sends the call (re-serialised) and its result.
    call["function"]["arguments"] = json.dumps({"city": "Paris"}, separators=(",", ":"))
    result = {"role": "tool", "tool_call_id": "call_w1", "content": "18 C"}
    upstream.push(completion("It is 18 C in Paris."))
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake",
        messages=[QUESTION, {"role": "assistant", "content": None, "tool_calls": [call]}, result],
        tools=[TOOL],
    )
    assert raw.headers["X-Conversation-Id"] == conversation_id
    recorded = await gw.wait_turn_end(conversation_id, count=2)
    second = [e for e in recorded if e["turn_id"] == raw.headers["X-Gateway-Turn-Id"]]
    assert [e["type"] for e in second] == ["tool/result", "assistant/message", "turn/end"]
    history = await gw.messages(conversation_id)
    assert [m["role"] for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1]["tool_calls"][0]["id"] == "call_w1"
    assert history[2] == result  # the client's own result, not a synthetic one


async def test_a_call_stopped_inside_its_arguments_is_still_left_out(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(
        frames(
            chunk("Let me check. "),
            chunk(tool={**HEAD, "function": {"name": "weather", "arguments": ""}}),
            chunk(tool=argument('{"city": "Par')),
            then="stall",
        )
    )
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], tools=[TOOL], stream=True
    )
    stream = raw.parse()
    async for event in stream:
        if any(
            c.function and c.function.arguments for c in event.choices[0].delta.tool_calls or ()
        ):
            break
    await stream.close()
    recorded = await gw.wait_turn_end(raw.headers["X-Conversation-Id"])
    answer = next(e for e in recorded if e["type"] == "assistant/message")
    assert answer["payload"]["content"] == [{"type": "text", "text": "Let me check. "}]
