"""Amazon Bedrock through litellm, against a fake runtime that frames and signs as AWS does
(tests/providers/bedrock.py): deployments in two regions under one alias, each request signed
for its own; a whole Converse answer; the fake's framing as AWS's own decoder reads it. The
streamed cases run in the adapter contract suite (test_adapter_contract.py, `bedrock`)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import MakeGateway
from tests.fakes import COMPLETION_TOKENS, PROMPT_TOKENS, Block, MakeServer, Reply
from tests.providers.bedrock import (
    REGION,
    BedrockServer,
    BedrockServerElsewhere,
    event,
    exception,
)
from tests.providers.test_adapter_contract import ANSWER, LITELLM_SKIP, QUESTION, stream_chat

pytestmark = pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")

OTHER_REGION = BedrockServerElsewhere.region


async def test_two_regions_under_one_alias_each_signed_for_its_own(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    """An alias whose first deployment is in one region and its fallback in another: the first
    fails, the answer comes from the second, and each request was signed (SigV4) for the region
    of the deployment it went to, in one process."""
    first = await BedrockServer().start(aiohttp_server)
    second = await BedrockServerElsewhere().start(aiohttp_server)
    assert REGION != OTHER_REGION
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "retry": {"max_attempts": 2, "backoff_s": 0},
                "deployments": [first.deployment(), second.deployment()],
            }
        ]
    )
    first.http_error(503, "the region is busy")
    second.text(ANSWER)
    view = await stream_chat(gw)
    assert view.error is None
    assert view.text == "".join(ANSWER)
    assert first.regions == [REGION]
    assert second.regions == [OTHER_REGION]

    events = await gw.wait_turn_end(view.conversation_id)
    attempts = [e for e in events if e["type"] in ("assistant/attempt", "assistant/message")]
    routes = [e["payload"]["route"]["deployment"] for e in attempts]
    assert routes == ["m/0-litellm", "m/1-litellm"]


async def test_a_whole_converse_answer(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    """Without `stream`, litellm calls Converse (`/converse`, signed too); the client gets the
    text and the provider's usage, recorded as the provider's."""
    fake = await BedrockServer().start(aiohttp_server)
    gw = await make_gateway(
        models=[{"name": "m", "retry": {"max_attempts": 1}, "deployments": [fake.deployment()]}]
    )
    fake.whole("Paris.")
    response = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION
    )
    completion = response.parse()
    assert completion.choices[0].message.content == "Paris."
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        PROMPT_TOKENS,
        COMPLETION_TOKENS,
    )
    assert fake.regions == [REGION]
    assert fake.seen[0].match_info["action"] == "converse"
    await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    await gw.flush()
    rows = gw.query("SELECT usage_source, prompt_tokens, completion_tokens FROM usage")
    assert rows == [("provider", PROMPT_TOKENS, COMPLETION_TOKENS)]


def test_the_fake_frames_as_aws_decodes() -> None:
    """The fake's event-stream messages, read back by botocore's own decoder: prelude and
    message CRCs, typed headers, the JSON payload."""
    from botocore.eventstream import EventStreamBuffer

    buffer = EventStreamBuffer()
    buffer.add_data(event("contentBlockDelta", {"contentBlockIndex": 0, "delta": {"text": "hi"}}))
    buffer.add_data(exception("throttlingException", "slow down"))
    messages = list(buffer)
    assert [m.headers[":message-type"] for m in messages] == ["event", "exception"]
    assert messages[0].headers[":event-type"] == "contentBlockDelta"
    assert json.loads(messages[0].payload) == {"contentBlockIndex": 0, "delta": {"text": "hi"}}
    assert messages[1].headers[":exception-type"] == "throttlingException"


async def test_claudes_signed_thinking_goes_back_with_its_tool_call(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    """A Responses turn whose answer is Claude's signed thinking and a tool call, then the
    follow-up with the tool's output by `previous_response_id`: the history the gateway rebuilds
    for Bedrock carries the thinking with the signature it was signed with, which Claude needs
    to go on (the record kept it from litellm's `thinking_blocks`)."""
    fake = await BedrockServer().start(aiohttp_server)
    gw = await make_gateway(
        models=[{"name": "m", "retry": {"max_attempts": 1}, "deployments": [fake.deployment()]}]
    )
    thought = Block("reasoning", ["France's capital", " is well known."])
    call = Block("tool_call", ['{"country": "France"}'], "tooluse_1", "lookup_capital")
    fake.push(fake.answer(Reply([thought, call], finish="tool_calls")))
    client = gw.client()
    tools: Any = [{"type": "function", "name": "lookup_capital", "parameters": {"type": "object"}}]
    async with client.responses.stream(
        model="m", input="Capital of France?", tools=tools, reasoning={"effort": "low"}
    ) as stream:
        first = await stream.get_final_response()
    assert first.output[-1].type == "function_call"

    fake.text(ANSWER)
    output = {"type": "function_call_output", "call_id": "tooluse_1", "output": "Paris"}
    async with client.responses.stream(
        model="m",
        input=[output],
        previous_response_id=first.id,
        tools=tools,
        reasoning={"effort": "low"},
    ) as stream:
        await stream.get_final_response()
    assistant = [m for m in fake.requests[1]["messages"] if m["role"] == "assistant"]
    [reasoning] = [
        part["reasoningContent"] for part in assistant[0]["content"] if "reasoningContent" in part
    ]
    assert reasoning["reasoningText"] == {
        "text": "France's capital is well known.",
        "signature": BedrockServer.signature,
    }
