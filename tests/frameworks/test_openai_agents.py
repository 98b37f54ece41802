"""The OpenAI Agents SDK (`openai-agents`) against the gateway: an `Agent` with function tools
on `OpenAIResponsesModel` (the SDK's default API) and `OpenAIChatCompletionsModel`, typed
output (`output_type`), and a streamed run the client cancels (`RunResultStreaming.cancel`)."""

from __future__ import annotations

from typing import Any

import pytest
from agents import (
    Agent,
    Model,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks import story
from tests.frameworks.scripts import reply

set_tracing_disabled(True)  # and OPENAI_AGENTS_DISABLE_TRACING (conftest.py): no trace export

API = pytest.mark.parametrize("responses", [True, False], ids=["responses", "chat"])


def model(gw: GatewayUnderTest, responses: bool) -> Model:
    if responses:
        return OpenAIResponsesModel("fake", openai_client=gw.client())
    return OpenAIChatCompletionsModel("fake", openai_client=gw.client())


def agent(gw: GatewayUnderTest, responses: bool, **kwargs: Any) -> Agent[Any]:
    return Agent(
        name="weather",
        instructions="Answer about the weather.",
        model=model(gw, responses),
        tools=[function_tool(fn) for fn in story.TOOLS.values()],
        **kwargs,
    )


@API
async def test_tool_loop_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    weather = agent(gw, responses)
    story.queue_tool_loop(upstream)
    result = await Runner.run(weather, story.QUESTION)
    assert result.final_output == story.ANSWER
    outputs = [
        (dict(item.raw_item)["call_id"], item.output)
        for item in result.new_items
        if item.type == "tool_call_output_item" and isinstance(item.raw_item, dict)
    ]
    calls = [call for calls in story.ROUNDS for call in calls]
    assert outputs == [(call.id, story.result(call)) for call in calls]
    story.check_tool_loop_requests(upstream)
    assert upstream.requests[0]["messages"][0] == {
        "role": "system",
        "content": "Answer about the weather.",
    }
    [conversation_id] = await story.check_one_conversation_per_run(gw, [4])
    await story.check_tool_loop_recorded(gw, conversation_id)

    # The same agent, asked afresh: a second conversation.
    story.queue_short_run(upstream)
    second = await Runner.run(weather, story.SECOND_QUESTION)
    assert second.final_output == "Still sunny in Paris."
    assert story.tool_messages(upstream.requests[-1]) == {"call_w_paris_2": "Paris: 21 C, sunny"}
    await story.check_one_conversation_per_run(gw, [4, 2])


@API
async def test_structured_output(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    forecaster = agent(gw, responses, output_type=story.Forecast)
    upstream.push(reply(calls=story.ROUNDS[0]))
    upstream.push(reply(story.FORECAST.model_dump_json()))
    result = await Runner.run(forecaster, "Forecast for Paris?")
    assert result.final_output == story.FORECAST
    sent = upstream.requests[1]["response_format"]
    assert sent["type"] == "json_schema"
    assert set(sent["json_schema"]["schema"]["properties"]) == {"city", "celsius", "sunny"}
    assert story.tool_messages(upstream.requests[1]) == {"call_w_paris": "Paris: 21 C, sunny"}
    await story.check_one_conversation_per_run(gw, [2])


@API
async def test_cancelled_stream_is_recorded_in_its_run(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    story.queue_cancelled_run(upstream)
    run = Runner.run_streamed(agent(gw, responses), story.QUESTION)
    received = ""
    target = "".join(story.CANCEL_PARTS[: story.CANCEL_READ])
    async for event in run.stream_events():
        if event.type == "raw_response_event" and event.data.type == "response.output_text.delta":
            received += event.data.delta
            if len(received) >= len(target):
                run.cancel()  # the user pressed Stop
    assert story.tool_messages(upstream.requests[1]) == {"call_w_paris": "Paris: 21 C, sunny"}
    await story.check_cancel_recorded(gw, upstream, received)
