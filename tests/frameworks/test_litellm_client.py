"""litellm as a client of the gateway (`litellm.acompletion(model="openai/<alias>",
api_base=<gateway>/v1)`): the tool loop of litellm's docs (append the returned message, then a
`tool` message per call), structured output from a pydantic `response_format`, and a stream
the client leaves (`async with` closes it)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.frameworks import story
from tests.frameworks.scripts import reply

# litellm's stream_chunk_builder builds pydantic schemas of its own TypedDicts, and says so.
pytestmark = pytest.mark.filterwarnings("ignore:Item .* is using the `ReadOnly` qualifier")

TOOL_SCHEMAS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": fn.__doc__,
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
    for name, fn in story.TOOLS.items()
]


@pytest.fixture(scope="module")
def litellm() -> Iterator[ModuleType]:
    # Imported here, so that only these tests pay its seconds of import; its price map is the
    # one in the package (LITELLM_LOCAL_MODEL_COST_MAP, conftest.py).
    import litellm  # noqa: TID251

    litellm.telemetry = False
    yield litellm


def options(gw: GatewayUnderTest) -> dict[str, Any]:
    return {
        "model": "openai/fake",
        "api_base": gw.url + "/v1",
        "api_key": "test-key",
        "max_retries": 0,
        "timeout": 10,
    }


def conversation_header(response: Any) -> str:
    """X-Conversation-Id, as litellm passes the provider's headers on."""
    headers = response._hidden_params["additional_headers"]
    return str(headers["llm_provider-x-conversation-id"])


async def run_agent(
    litellm: ModuleType, gw: GatewayUnderTest, question: str
) -> tuple[list[Any], list[str]]:
    """The tool loop: the messages, and the X-Conversation-Id of each response."""
    messages: list[Any] = [{"role": "user", "content": question}]
    headers: list[str] = []
    while True:
        response = await litellm.acompletion(**options(gw), messages=messages, tools=TOOL_SCHEMAS)
        headers.append(conversation_header(response))
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return messages, headers
        for call in message.tool_calls:
            output = story.TOOLS[call.function.name](**json.loads(call.function.arguments))
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call.id,
                    "name": call.function.name,
                    "content": output,
                }
            )


async def test_tool_loop_is_one_conversation(
    litellm: ModuleType, gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    story.queue_tool_loop(upstream)
    messages, headers = await run_agent(litellm, gw, story.QUESTION)
    assert messages[-1].content == story.ANSWER
    story.check_tool_loop_requests(upstream)
    [conversation_id] = await story.check_one_conversation_per_run(gw, [4])
    assert headers == [conversation_id] * 4
    await story.check_tool_loop_recorded(gw, conversation_id)

    # The same agent, asked afresh: a second conversation.
    story.queue_short_run(upstream)
    messages, second = await run_agent(litellm, gw, story.SECOND_QUESTION)
    assert messages[-1].content == "Still sunny in Paris."
    assert story.tool_messages(upstream.requests[-1]) == {"call_w_paris_2": "Paris: 21 C, sunny"}
    ids = await story.check_one_conversation_per_run(gw, [4, 2])
    assert second == [ids[1]] * 2


async def test_structured_output(
    litellm: ModuleType, gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(reply(story.FORECAST.model_dump_json()))
    response = await litellm.acompletion(
        **options(gw),
        messages=[{"role": "user", "content": "Forecast for Paris?"}],
        response_format=story.Forecast,
    )
    content = response.choices[0].message.content
    assert story.Forecast.model_validate_json(content) == story.FORECAST
    sent = upstream.requests[0]["response_format"]
    assert sent["type"] == "json_schema"
    assert set(sent["json_schema"]["schema"]["properties"]) == {"city", "celsius", "sunny"}
    [conversation_id] = await story.check_one_conversation_per_run(gw, [1])
    assert conversation_header(response) == conversation_id


async def test_abandoned_stream_is_recorded_in_its_run(
    litellm: ModuleType, gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    story.queue_cancelled_run(upstream)
    messages: list[Any] = [{"role": "user", "content": story.QUESTION}]
    async with await litellm.acompletion(
        **options(gw), messages=messages, tools=TOOL_SCHEMAS, stream=True
    ) as stream:
        chunks = [chunk async for chunk in stream]
    message = litellm.stream_chunk_builder(chunks, messages=messages).choices[0].message
    [call] = message.tool_calls
    messages.append(message)
    messages.append(
        {
            "role": "tool",
            "tool_call_id": call.id,
            "content": story.get_weather(**json.loads(call.function.arguments)),
        }
    )

    received = ""
    target = "".join(story.CANCEL_PARTS[: story.CANCEL_READ])
    async with await litellm.acompletion(
        **options(gw), messages=messages, tools=TOOL_SCHEMAS, stream=True
    ) as stream:
        async for chunk in stream:
            received += chunk.choices[0].delta.content or ""
            if len(received) >= len(target):
                break  # the user pressed Stop: leaving `async with` closes the stream
    assert story.tool_messages(upstream.requests[1]) == {"call_w_paris": "Paris: 21 C, sunny"}
    await story.check_cancel_recorded(gw, upstream, received)
