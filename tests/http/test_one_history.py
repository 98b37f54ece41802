"""One request, one history: a Responses client on a conversation the gateway keeps (the
Vercel AI SDK with `providerOptions.openai.conversation`) that sends the round's question
again with its tool results gets it recorded once, and its upstream a valid history."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, completion
from tests.http.test_threading import tool_calls_script

TOOLS = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
QUESTION = {"role": "user", "content": "Weather in Paris?"}
CALL = {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{}"}
RESULT = {"type": "function_call_output", "call_id": "call_1", "output": "18 C"}


@pytest.mark.parametrize(
    "second_input",
    [
        pytest.param([QUESTION, RESULT], id="question and result"),
        pytest.param([QUESTION, CALL, RESULT], id="question, call and result"),
        pytest.param([RESULT], id="result only"),
    ],
)
async def test_a_resent_question_is_recorded_once_and_its_result_answers_the_call(
    gw: GatewayUnderTest, upstream: FakeUpstream, second_input: list[dict[str, Any]]
) -> None:
    api = gw.client()
    conversation = await api.conversations.create()
    upstream.push(tool_calls_script(upstream, [("call_1", "{}")]))
    await api.responses.create(
        model="fake", input=[QUESTION], tools=TOOLS, conversation=conversation.id
    )
    upstream.push(completion("18 C in Paris."))
    answer = await api.responses.create(
        model="fake", input=second_input, tools=TOOLS, conversation=conversation.id
    )
    assert answer.output_text == "18 C in Paris."
    sent = upstream.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool"]
    assert sent[2] == {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
    await gw.flush()
    events = await gw.gateway.store.events(conversation.id)
    kinds = [e.type for e in events if e.type != "turn/end"]
    assert kinds == ["user/message", "assistant/message", "tool/result", "assistant/message"]


async def test_a_question_asked_again_after_an_answer_is_new(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    api = gw.client()
    conversation = await api.conversations.create()
    for _ in range(2):
        upstream.push(completion("Sunny."))
        await api.responses.create(model="fake", input=[QUESTION], conversation=conversation.id)
    await gw.flush()
    events = await gw.gateway.store.events(conversation.id)
    assert [e.type for e in events if e.type == "user/message"] == ["user/message"] * 2
