"""Groq configured as a litellm model (`groq/...`) and read by the gateway itself
(gateway/providers/native_routes.py), against a fake Groq API (tests/providers/groq.py): a
stream captured from api.groq.com replayed byte for byte, and a whole (non-streaming) answer.
The format-neutral cases run in the adapter contract suite (test_adapter_contract.py, `groq`)."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import MakeGateway
from tests.fakes import (
    COMPLETION_TOKENS,
    FAILED_TURN,
    PROMPT_TOKENS,
    MakeServer,
    expected,
    replay,
)
from tests.providers.groq import GroqServer
from tests.providers.test_adapter_contract import LITELLM_SKIP, QUESTION, stream_chat

pytestmark = pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")

CAPTURED = "groq-chat-reasoning-error-event.sse"


async def test_a_captured_stream_reaches_the_client_as_groq_sent_it(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    """gpt-oss reasoning (`delta.reasoning`), one piece of text, then Groq's `event: error`
    (its `code` a string): the client assembles exactly the reasoning and text of the capture,
    then its stream raises with Groq's message; the record is a failed attempt that keeps it."""
    fake = await GroqServer().start(aiohttp_server)
    gw = await make_gateway(
        models=[{"name": "m", "retry": {"max_attempts": 1}, "deployments": [fake.deployment()]}]
    )
    fake.push(replay(CAPTURED))
    view = await stream_chat(gw)
    want = expected(CAPTURED)
    assert view.reasoning == want["reasoning"]["value"]
    assert view.text == want["content"]["value"]
    assert isinstance(view.error, openai.APIError)
    said = "Tool choice is required, but model did not call a tool"
    assert said in view.error.message

    events = await gw.wait_turn_end(view.conversation_id)
    assert [e["type"] for e in events] == FAILED_TURN
    assert events[1]["payload"]["reason"] == "provider_error"
    assert said in str(events[2]["payload"])


async def test_a_whole_answer(make_gateway: MakeGateway, aiohttp_server: MakeServer) -> None:
    """Without `stream`, the client gets Groq's answer and Groq's usage, recorded as Groq's."""
    fake = await GroqServer().start(aiohttp_server)
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
    assert fake.seen[0].path == "/openai/v1/chat/completions"
    assert fake.requests[0]["model"] == GroqServer.groq_model
    await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    await gw.flush()
    rows = gw.query("SELECT usage_source, prompt_tokens, completion_tokens FROM usage")
    assert rows == [("provider", PROMPT_TOKENS, COMPLETION_TOKENS)]
