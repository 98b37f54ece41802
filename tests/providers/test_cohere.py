"""Cohere configured as a litellm model (`cohere_chat/...`) and spoken by the gateway's own v2
chat adapter (gateway/providers/cohere_chat.py), against a fake v2 chat API
(tests/providers/cohere.py): a whole (non-streaming) answer. The streamed cases run in the
adapter contract suite (test_adapter_contract.py, `cohere`)."""

from __future__ import annotations

import pytest

from tests.conftest import MakeGateway
from tests.fakes import COMPLETION_TOKENS, PROMPT_TOKENS, MakeServer
from tests.providers.cohere import CHAT_PATH, CohereServer
from tests.providers.test_adapter_contract import LITELLM_SKIP, QUESTION

pytestmark = pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")


async def test_a_whole_answer(make_gateway: MakeGateway, aiohttp_server: MakeServer) -> None:
    """Without `stream`, the client gets Cohere's text and usage, recorded as Cohere's."""
    fake = await CohereServer().start(aiohttp_server)
    gw = await make_gateway(
        models=[{"name": "m", "retry": {"max_attempts": 1}, "deployments": [fake.deployment()]}]
    )
    fake.whole("Paris.")
    response = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION
    )
    completion = response.parse()
    assert completion.choices[0].message.content == "Paris."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        PROMPT_TOKENS,
        COMPLETION_TOKENS,
    )
    assert fake.seen[0].path == CHAT_PATH
    assert fake.requests[0]["model"] == CohereServer.cohere_model
    await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    await gw.flush()
    rows = gw.query("SELECT usage_source, prompt_tokens, completion_tokens FROM usage")
    assert rows == [("provider", PROMPT_TOKENS, COMPLETION_TOKENS)]
