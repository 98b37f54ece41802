"""smolagents against the gateway: a `ToolCallingAgent` on `OpenAIServerModel` (Chat
Completions). smolagents asks for native tool calls but sends each step back as text: the
calls as an assistant message "Calling tools:\\n[...]" (their Python repr), the results as a
user message "Observation:\\n...". The gateway reads such a message as the calls it holds
(docs/recording.md, "Equal histories"), so a run is one conversation."""

from __future__ import annotations

import asyncio

from smolagents import CodeAgent, OpenAIServerModel, ToolCallingAgent, tool

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks import story
from tests.frameworks.scripts import Call, reply


@tool
def get_weather(city: str) -> str:
    """The current weather in a city.

    Args:
        city: The city's name.
    """
    return story.get_weather(city)


@tool
def get_time(city: str) -> str:
    """The local time in a city.

    Args:
        city: The city's name.
    """
    return story.get_time(city)


def queue_run(upstream: FakeUpstream, rounds: list[list[Call]], answer: str, final: str) -> None:
    """The tool rounds (the model says something with the first), then smolagents' own way
    to end a run: a `final_answer` call."""
    for n, calls in enumerate(rounds):
        upstream.push(reply("" if n else "Let me look.", calls=calls))
    upstream.push(reply(calls=[Call(final, "final_answer", {"answer": answer})]))


async def test_tool_loop_is_one_conversation(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    model = OpenAIServerModel(model_id="fake", api_base=gw.url + "/v1", api_key="test-key")
    agent = ToolCallingAgent(tools=[get_weather, get_time], model=model, verbosity_level=0)
    queue_run(upstream, story.ROUNDS, story.ANSWER, "call_final")
    # smolagents is synchronous: it runs on a thread, beside the gateway's event loop.
    assert await asyncio.to_thread(agent.run, story.QUESTION) == story.ANSWER

    # Each step sent the earlier calls back as text, their results as "Observation:" messages.
    last = upstream.requests[len(story.ROUNDS)]["messages"]
    assert [m["role"] for m in last] == ["system", "user", *["assistant", "user"] * 3]
    said = "Let me look.\nCalling tools:\n[{'id': 'call_w_paris'"
    assert story.text_of(last[2]["content"]).startswith(said)
    assert story.text_of(last[3]["content"]) == "Observation:\nParis: 21 C, sunny"

    [conversation_id] = await story.check_one_conversation_per_run(gw, [4])
    events = await gw.wait_turn_end(conversation_id, count=4)
    assert [e["type"] for e in events] == [
        "user/message",
        *["assistant/message", "turn/end", "user/message"] * 3,
        *["assistant/message", "turn/end"],
    ]
    answers = [e["payload"] for e in events if e["type"] == "assistant/message"]
    calls = [[(b["id"], b["name"]) for b in a["content"] if "id" in b] for a in answers]
    assert calls == [[(c.id, c.name) for c in r] for r in story.ROUNDS] + [
        [("call_final", "final_answer")]
    ]
    observations = [e["payload"]["content"] for e in events if e["type"] == "user/message"][1:]
    # (A round's parallel calls run concurrently: their results are listed as they finished.)
    assert [sorted(story.text_of(o).splitlines()) for o in observations] == [
        sorted(["Observation:", *map(story.result, calls)]) for calls in story.ROUNDS
    ]

    # The same agent, asked afresh: a second conversation.
    again = [[Call("call_w_paris_2", "get_weather", {"city": "Paris"})]]
    queue_run(upstream, again, "Sunny.", "call_final_2")
    assert await asyncio.to_thread(agent.run, story.SECOND_QUESTION) == "Sunny."
    await story.check_one_conversation_per_run(gw, [4, 2])


async def test_code_agent_run_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """smolagents' default agent writes code, not calls: it stops the model at the closing
    tag (a stop sequence, so the answer comes without it), adds the tag back, and sends the
    code again followed by a "python_interpreter" call of its own making."""
    model = OpenAIServerModel(model_id="fake", api_base=gw.url + "/v1", api_key="test-key")
    agent = CodeAgent(tools=[get_weather], model=model, verbosity_level=0)
    upstream.push(
        reply('Thought: Look it up.\n<code>\nprint(get_weather(city="Paris"))\n'),
        reply('Thought: I have it.\n<code>\nfinal_answer("Sunny in Paris.")\n'),
    )
    assert await asyncio.to_thread(agent.run, "Weather in Paris?") == "Sunny in Paris."
    assert "</code>" in upstream.requests[0]["stop"]
    sent = story.text_of(upstream.requests[1]["messages"][2]["content"])
    assert sent.startswith(
        'Thought: Look it up.\n<code>\nprint(get_weather(city="Paris"))\n</code>'
    )
    assert "\nCalling tools:\n[{'id': 'call_1', 'type': 'function'" in sent
    assert "'name': 'python_interpreter'" in sent

    [conversation_id] = await story.check_one_conversation_per_run(gw, [2])
    events = await gw.wait_turn_end(conversation_id, count=2)
    assert [e["type"] for e in events] == [*["user/message", "assistant/message", "turn/end"] * 2]
