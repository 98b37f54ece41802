"""A Responses request on a previous response whose conversation has moved on since: the next
tool step of the turn that moved it (the Vercel AI SDK sends one `previous_response_id` with
every step of a tool loop) continues the conversation; anything else forks it, as OpenAI's
response chains do (gateway.conversations.history.resends)."""

from __future__ import annotations

from typing import Any

from gateway.conversations.stored_responses import ResponseStore
from gateway.metering.keys import OPEN
from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks.scripts import Call, reply

WEATHER = {
    "type": "function",
    "name": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
LONDON = Call("call_w2", "weather", {"city": "London"})


def step(*messages: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "And London?"}, *messages]


CALLED = {
    "role": "assistant",
    "content": None,
    "tool_calls": [
        {
            "id": LONDON.id,
            "type": "function",
            "function": {"name": "weather", "arguments": LONDON.json},
        }
    ],
}


async def test_the_next_step_on_a_previous_response_continues_and_others_fork(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    client = gw.client()
    upstream.push(
        reply(calls=[Call("call_w1", "weather", {"city": "Paris"})]),
        reply("18C in Paris."),
        reply(calls=[LONDON]),
    )
    first = await client.responses.create(model="fake", input="Paris?", tools=[WEATHER])
    output = {"type": "function_call_output", "call_id": "call_w1", "output": "18C"}
    answered = await client.responses.create(
        model="fake", input=[output], previous_response_id=first.id, tools=[WEATHER]
    )
    # The next turn's first step, on the answered response: the conversation moves on.
    await client.responses.create(
        model="fake", input="And London?", previous_response_id=answered.id, tools=[WEATHER]
    )
    await gw.flush()
    [(conversation_id,)] = gw.query("SELECT id FROM conversations")
    store = ResponseStore(gw.gateway.store, gw.gateway.conversations)

    result = {"role": "tool", "tool_call_id": LONDON.id, "content": "12C"}
    for resent in (step(CALLED, result), step(result)):  # the call resent, or left out
        joined, history = await store.history(OPEN, answered.id, None, new_messages=resent)
        assert (joined.conversation_id, joined.create) == (conversation_id, None)
        assert [m["role"] for m in history][-2:] == ["user", "assistant"]

    other = {**result, "tool_call_id": "call_other"}
    for fork in (
        step(),  # the step asked again: a regenerate
        step(CALLED, other),  # a result for a call this conversation never made
        [{"role": "user", "content": "And Rome?"}, CALLED, result],  # another question
        None,  # the input not known
    ):
        joined, history = await store.history(OPEN, answered.id, None, new_messages=fork)
        assert joined.create is not None and joined.create.parent_id == conversation_id
        assert [m["role"] for m in history][-1] == "assistant"
        assert history[-1]["content"] == "18C in Paris."
