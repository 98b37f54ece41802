"""DSPy against the gateway: a `dspy.ReAct` module on `dspy.LM("openai/...")` (through
litellm, Chat Completions). DSPy asks each step with a fresh prompt: one user message holding
the question and the trajectory so far (each step's thought, tool, arguments and
observation), answered in its `[[ ## field ## ]]` format, and ends the run with an extraction
prompt holding the whole trajectory. The gateway reads such a prompt as the history it holds
(gateway/conversations/reshaped.py), so a run is one conversation."""

from __future__ import annotations

import dspy

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks import story
from tests.frameworks.scripts import reply


def fields(**values: str) -> str:
    """An answer in DSPy's ChatAdapter format."""
    parts = [f"[[ ## {name} ## ]]\n{value}" for name, value in values.items()]
    return "\n\n".join([*parts, "[[ ## completed ## ]]"])


def queue_run(upstream: FakeUpstream, cities: list[str], answer: str) -> None:
    """A ReAct step per city (get_weather), the step that finishes, then the extraction."""
    for city in cities:
        step = fields(
            next_thought=f"I need the weather in {city}.",
            next_tool_name="get_weather",
            next_tool_args=f'{{"city":"{city}"}}',
        )
        upstream.push(reply(step))
    upstream.push(
        reply(fields(next_thought="I know.", next_tool_name="finish", next_tool_args="{}"))
    )
    upstream.push(reply(fields(reasoning="From the observations.", answer=answer)))


async def test_react_run_is_one_conversation(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    lm = dspy.LM(
        "openai/fake", api_base=gw.url + "/v1", api_key="test-key", cache=False, num_retries=0
    )
    react = dspy.ReAct("question -> answer", tools=[story.get_weather])
    queue_run(upstream, ["Paris", "London"], "Sunny in Paris, rain in London.")
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        result = await react.acall(question=story.QUESTION)
    assert result.answer == "Sunny in Paris, rain in London."
    assert result.trajectory["observation_1"] == "London: 14 C, rain"

    # Every request was a fresh prompt: a system message and one user message.
    assert [[m["role"] for m in r["messages"]] for r in upstream.requests] == [
        ["system", "user"]
    ] * 4
    assert (
        "[[ ## observation_1 ## ]]\nLondon: 14 C, rain"
        in upstream.requests[2]["messages"][1]["content"]
    )

    [conversation_id] = await story.check_one_conversation_per_run(gw, [4])
    events = await gw.wait_turn_end(conversation_id, count=4)
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"] * 4
    prompts = [e["payload"]["content"] for e in events if e["type"] == "user/message"]
    assert prompts == [r["messages"][1]["content"] for r in upstream.requests]

    # The same module, asked afresh: a second conversation.
    queue_run(upstream, ["Paris"], "Sunny.")
    with dspy.context(lm=lm, adapter=dspy.ChatAdapter()):
        assert (await react.acall(question=story.SECOND_QUESTION)).answer == "Sunny."
    await story.check_one_conversation_per_run(gw, [4, 3])
