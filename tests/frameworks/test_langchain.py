"""LangChain's `ChatOpenAI` (langchain-openai) against the gateway, as Chat Completions and as
the Responses API (`use_responses_api=True`): a tool loop written the LangChain way (bind the
tools, run each `tool_call`, append the `ToolMessage`), structured output, and a stream the
client abandons."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, cast

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.tools import BaseTool, tool
from langchain_openai import ChatOpenAI

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks import story
from tests.frameworks.scripts import reply

TOOLS: dict[str, BaseTool] = {name: tool(fn) for name, fn in story.TOOLS.items()}

API = pytest.mark.parametrize("responses", [False, True], ids=["chat", "responses"])


def chat_model(gw: GatewayUnderTest, responses: bool) -> ChatOpenAI:
    return ChatOpenAI(
        model="fake",
        base_url=gw.url + "/v1",
        api_key="test-key",
        max_retries=0,
        timeout=10,
        use_responses_api=responses,
        include_response_headers=True,
    )


async def run_agent(llm: ChatOpenAI, question: str) -> tuple[list[BaseMessage], list[str]]:
    """The tool loop: the messages, and the X-Conversation-Id of each response."""
    model = llm.bind_tools(list(TOOLS.values()))
    messages: list[BaseMessage] = [HumanMessage(question)]
    headers: list[str] = []
    while True:
        answer = await model.ainvoke(messages)
        assert isinstance(answer, AIMessage)
        messages.append(answer)
        headers.append(answer.response_metadata["headers"]["x-conversation-id"])
        if not answer.tool_calls:
            return messages, headers
        for call in answer.tool_calls:
            messages.append(await TOOLS[call["name"]].ainvoke(call))


@API
async def test_tool_loop_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    story.queue_tool_loop(upstream)
    messages, headers = await run_agent(chat_model(gw, responses), story.QUESTION)
    assert messages[-1].text == story.ANSWER
    assert [m.type for m in messages].count("tool") == 4
    story.check_tool_loop_requests(upstream)
    [conversation_id] = await story.check_one_conversation_per_run(gw, [4])
    assert headers == [conversation_id] * 4
    await story.check_tool_loop_recorded(gw, conversation_id)

    # The same agent, asked afresh: a second conversation.
    story.queue_short_run(upstream)
    messages, second = await run_agent(chat_model(gw, responses), story.SECOND_QUESTION)
    assert messages[-1].text == "Still sunny in Paris."
    assert story.tool_messages(upstream.requests[-1]) == {"call_w_paris_2": "Paris: 21 C, sunny"}
    ids = await story.check_one_conversation_per_run(gw, [4, 2])
    assert second == [ids[1]] * 2


@API
async def test_structured_output(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    upstream.push(reply(story.FORECAST.model_dump_json()))
    structured = chat_model(gw, responses).with_structured_output(story.Forecast)
    forecast = await structured.ainvoke("Forecast for Paris?")
    assert forecast == story.FORECAST
    sent = upstream.requests[0]["response_format"]
    assert sent["type"] == "json_schema"
    assert sent["json_schema"]["name"] == "Forecast"
    assert set(sent["json_schema"]["schema"]["properties"]) == {"city", "celsius", "sunny"}
    await story.check_one_conversation_per_run(gw, [1])


@API
async def test_abandoned_stream_is_recorded_in_its_run(
    gw: GatewayUnderTest, upstream: FakeUpstream, responses: bool
) -> None:
    story.queue_cancelled_run(upstream)
    model = chat_model(gw, responses).bind_tools(list(TOOLS.values()))
    messages: list[BaseMessage] = [HumanMessage(story.QUESTION)]
    first: Any = None
    async for part in model.astream(messages):
        first = part if first is None else first + part
    assert isinstance(first, AIMessageChunk)
    assert [c["id"] for c in first.tool_calls] == ["call_w_paris"]
    messages += [first, await TOOLS["get_weather"].ainvoke(first.tool_calls[0])]

    received = ""
    target = "".join(story.CANCEL_PARTS[: story.CANCEL_READ])
    # `astream` is an async generator: closing it closes the HTTP response under it.
    chunks = cast(AsyncGenerator[AIMessageChunk, None], model.astream(messages))
    async with aclosing(chunks) as stream:
        async for part in stream:
            received += part.text
            if len(received) >= len(target):
                break  # the user pressed Stop: aclosing closes the stream
    assert story.tool_messages(upstream.requests[1]) == {"call_w_paris": "Paris: 21 C, sunny"}
    await story.check_cancel_recorded(gw, upstream, received)
