"""LlamaIndex (`llama-index-core`, its `LiteLLM` model on the gateway's Chat Completions)
against the gateway: a `ReActAgent`, which has the model write its tool calls as text
("Thought: ...\\nAction: ...\\nAction Input: {...}") and sends each back with the input
re-written as a Python dict, the tool's output as a user message "Observation: ...". The
gateway compares such an action by the input it holds (docs/recording.md, "Equal
histories"), so a run is one conversation."""

from __future__ import annotations

from llama_index.core.agent.workflow import ReActAgent
from llama_index.llms.litellm import LiteLLM

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks import story
from tests.frameworks.scripts import reply

STEPS = [
    ("I need the weather in Paris.", "get_weather", '{"city": "Paris"}'),
    ("Now the time there.", "get_time", '{"city":"Paris"}'),
]
ANSWER = "Paris: 21 C and sunny at 14:05."


def queue_run(upstream: FakeUpstream, steps: list[tuple[str, str, str]], answer: str) -> None:
    for thought, tool, arguments in steps:
        upstream.push(reply(f"Thought: {thought}\nAction: {tool}\nAction Input: {arguments}"))
    upstream.push(reply(f"Thought: I can answer without using any more tools.\nAnswer: {answer}"))


async def test_react_agent_run_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    llm = LiteLLM(model="openai/fake", api_base=gw.url + "/v1", api_key="test-key")
    agent = ReActAgent(tools=list(story.TOOLS.values()), llm=llm)
    queue_run(upstream, STEPS, ANSWER)
    assert str(await agent.run(user_msg="Weather and time in Paris?")) == ANSWER

    # The model's action came back with its input as a Python dict, then the observation.
    sent = upstream.requests[1]["messages"]
    assert [m["role"] for m in sent] == ["system", "user", "assistant", "user"]
    assert story.text_of(sent[2]["content"]).endswith("Action Input: {'city': 'Paris'}")
    assert story.text_of(sent[3]["content"]) == "Observation: Paris: 21 C, sunny"

    [conversation_id] = await story.check_one_conversation_per_run(gw, [3])
    events = await gw.wait_turn_end(conversation_id, count=3)
    assert [e["type"] for e in events] == [
        "user/message",
        *["assistant/message", "turn/end", "user/message"] * 2,
        *["assistant/message", "turn/end"],
    ]
    answers = [
        e["payload"]["content"][0]["text"] for e in events if e["type"] == "assistant/message"
    ]
    assert answers[-1].endswith(f"Answer: {ANSWER}")
    assert all(e["payload"]["status"] == "completed" for e in events if e["type"] == "turn/end")

    # The same agent, asked afresh: a second conversation.
    queue_run(upstream, STEPS[:1], "Sunny.")
    assert str(await agent.run(user_msg="Weather in Paris?")) == "Sunny."
    await story.check_one_conversation_per_run(gw, [3, 2])
