"""pydantic-ai (`pydantic-ai-slim[openai]`) against the gateway: an `Agent` with function tools
on `OpenAIChatModel` (Chat Completions) and `OpenAIResponsesModel`, typed output both ways
pydantic-ai offers it (its `final_result` tool, and `NativeOutput`'s json_schema), and a
streamed run whose task the client cancels."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from aiohttp import web
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.messages import ToolReturnPart
from pydantic_ai.models import Model
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks import story
from tests.frameworks.scripts import Call, reply

API = pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])


def model(gw: GatewayUnderTest, responses: bool) -> Model:
    provider = OpenAIProvider(openai_client=gw.client())
    if responses:
        return OpenAIResponsesModel("fake", provider=provider)
    return OpenAIChatModel("fake", provider=provider)


def agent(gw: GatewayUnderTest, responses: bool, **kwargs: Any) -> Agent[None, Any]:
    return Agent(
        model(gw, responses),
        instructions="Answer about the weather.",
        tools=list(story.TOOLS.values()),
        **kwargs,
    )


@API
async def test_tool_loop_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    weather = agent(gw, responses)
    story.queue_tool_loop(upstream)
    result = await weather.run(story.QUESTION)
    assert result.output == story.ANSWER
    returns = [
        (part.tool_call_id, part.content)
        for message in result.all_messages()
        for part in message.parts
        if isinstance(part, ToolReturnPart)
    ]
    calls = [call for calls in story.ROUNDS for call in calls]
    assert returns == [(call.id, story.result(call)) for call in calls]
    story.check_tool_loop_requests(upstream)
    assert upstream.requests[0]["messages"][0] == {
        "role": "system",
        "content": "Answer about the weather.",
    }
    [conversation_id] = await story.check_one_conversation_per_run(gw, [4])
    await story.check_tool_loop_recorded(gw, conversation_id)

    # The same agent, asked afresh: a second conversation.
    story.queue_short_run(upstream)
    second = await weather.run(story.SECOND_QUESTION)
    assert second.output == "Still sunny in Paris."
    assert story.tool_messages(upstream.requests[-1]) == {"call_w_paris_2": "Paris: 21 C, sunny"}
    await story.check_one_conversation_per_run(gw, [4, 2])


async def test_concurrent_runs_of_one_question_are_two_conversations(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """Two users ask the same agent the same thing at once: the runs' first requests are
    identical and in flight together, and each run is still a conversation of its own."""
    call_ids = iter(["call_a", "call_b"])
    both_asked = asyncio.Event()
    asked = 0

    async def answer(request: web.Request) -> web.StreamResponse:
        nonlocal asked
        body = await request.json()
        if any(m["role"] == "tool" for m in body["messages"]):
            return await reply("Paris: 21 C and sunny.")(request)
        asked += 1
        if asked == 2:
            both_asked.set()
        await both_asked.wait()
        call = Call(next(call_ids), "get_weather", {"city": "Paris"})
        return await reply(calls=[call])(request)

    upstream.push(*[answer] * 4)
    weather = agent(gw, False)
    runs = await asyncio.gather(weather.run("Paris?"), weather.run("Paris?"))
    assert [r.output for r in runs] == ["Paris: 21 C and sunny."] * 2
    found = await story.check_one_conversation_per_run(gw, [2, 2])
    results = []
    for conversation_id in found:
        events = await gw.wait_turn_end(conversation_id, count=2)
        types = [e["type"] for e in events]
        assert types == [
            *["user/message", "assistant/message", "turn/end"],
            *["tool/result", "assistant/message", "turn/end"],
        ]
        results.append(events[3]["payload"]["tool_call_id"])
    assert sorted(results) == ["call_a", "call_b"]


@API
async def test_structured_output_by_its_tool(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    """pydantic-ai's default: the model calls a `final_result` tool whose arguments are the
    output; the run ends there, that call left for the next request to answer."""
    forecaster = agent(gw, responses, output_type=story.Forecast)
    upstream.push(reply(calls=story.ROUNDS[0]))
    upstream.push(reply(calls=[Call("call_out", "final_result", story.FORECAST.model_dump())]))
    result = await forecaster.run("Forecast for Paris?")
    assert result.output == story.FORECAST
    tools = [t["function"]["name"] for t in upstream.requests[0]["tools"]]
    assert sorted(tools) == ["final_result", "get_time", "get_weather"]
    assert story.tool_messages(upstream.requests[1]) == {"call_w_paris": "Paris: 21 C, sunny"}
    [conversation_id] = await story.check_one_conversation_per_run(gw, [2])
    events = await gw.wait_turn_end(conversation_id, count=2)
    assert events[-2]["payload"]["content"][0]["name"] == "final_result"


@API
async def test_structured_output_native(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    forecaster = agent(gw, responses, output_type=NativeOutput(story.Forecast))
    upstream.push(reply(story.FORECAST.model_dump_json()))
    result = await forecaster.run("Forecast for Paris?")
    assert result.output == story.FORECAST
    sent = upstream.requests[0]["response_format"]
    assert sent["type"] == "json_schema"
    assert set(sent["json_schema"]["schema"]["properties"]) == {"city", "celsius", "sunny"}
    await story.check_one_conversation_per_run(gw, [1])


@API
async def test_cancelled_stream_is_recorded_in_its_run(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    weather = agent(gw, responses)
    story.queue_cancelled_run(upstream)
    received = ""
    target = "".join(story.CANCEL_PARTS[: story.CANCEL_READ])
    enough = asyncio.Event()

    async def chat() -> None:
        nonlocal received
        async with weather.run_stream(story.QUESTION) as result:
            async for delta in result.stream_text(delta=True, debounce_by=None):
                received += delta
                if len(received) >= len(target):
                    enough.set()

    task = asyncio.create_task(chat())
    await asyncio.wait_for(enough.wait(), 10)
    task.cancel()  # the user pressed Stop: the app cancels the run's task
    with pytest.raises(asyncio.CancelledError):
        await task
    assert story.tool_messages(upstream.requests[1]) == {"call_w_paris": "Paris: 21 C, sunny"}
    await story.check_cancel_recorded(gw, upstream, received)
