"""Mistral configured as a litellm model (`mistral/...`) and read by the gateway itself, against
a fake Mistral API (tests/providers/mistral.py): a whole
(non-streaming) Magistral answer. The streamed cases run in the adapter contract suite
(test_adapter_contract.py, `mistral`)."""

from __future__ import annotations

import pytest

from tests.conftest import MakeGateway
from tests.fakes import COMPLETION_TOKENS, PROMPT_TOKENS, MakeServer
from tests.providers.mistral import MistralServer
from tests.providers.test_adapter_contract import LITELLM_SKIP, QUESTION

pytestmark = pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")


async def test_a_whole_answer_with_its_thinking(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    """Without `stream`, Magistral's content parts come apart: the text is the message's
    content, the thinking its `reasoning_content`, as the record keeps them."""
    fake = await MistralServer().start(aiohttp_server)
    gw = await make_gateway(
        models=[{"name": "m", "retry": {"max_attempts": 1}, "deployments": [fake.deployment()]}]
    )
    fake.whole("The user asks about France.", "Paris.")
    response = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION
    )
    completion = response.parse()
    message = completion.choices[0].message
    assert message.content == "Paris."
    assert (message.model_extra or {}).get("reasoning_content") == "The user asks about France."
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (
        PROMPT_TOKENS,
        COMPLETION_TOKENS,
    )
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    assert events[1]["payload"]["content"] == [
        {"type": "reasoning", "text": "The user asks about France."},
        {"type": "text", "text": "Paris."},
    ]
