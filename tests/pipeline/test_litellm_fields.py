"""What a client written for LiteLLM's proxy sends beside a request: `litellm_session_id` names
the conversation, as `X-Conversation-Id` does; `tags` and `metadata.tags` are recorded with the
turn; none of it reaches the provider, which may refuse it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, completion

QUESTION = {"role": "user", "content": "Plan a trip."}


async def ask(gw: GatewayUnderTest, upstream: FakeUpstream, **extra: Any) -> Any:
    upstream.push(completion("Sure."))
    return await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=extra.pop("messages", [QUESTION]), extra_body=extra
    )


async def test_a_litellm_session_id_names_the_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    first = await ask(gw, upstream, litellm_session_id="trip-42")
    conversation_id = first.headers["X-Conversation-Id"]
    assert conversation_id.startswith("trip-42")
    history = [QUESTION, {"role": "assistant", "content": "Sure."}]
    second = await ask(
        gw,
        upstream,
        messages=[*history, {"role": "user", "content": "Where to?"}],
        litellm_session_id="trip-42",
    )
    assert second.headers["X-Conversation-Id"] == conversation_id
    events = await gw.wait_turn_end(conversation_id, count=2)
    assert [e["type"] for e in events].count("turn/end") == 2


async def test_litellm_fields_never_reach_the_provider_and_tags_are_recorded(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    raw = await ask(
        gw,
        upstream,
        litellm_session_id="s-1",
        litellm_trace_id="t-1",
        tags=["prod"],
        metadata={"tags": ["team-a", "beta"], "app": "planner"},
    )
    sent = upstream.requests[-1]
    assert not {"litellm_session_id", "litellm_trace_id", "tags"} & set(sent)
    assert sent["metadata"] == {"app": "planner"}  # the client's own keys still go
    await gw.flush()
    [(request,)] = gw.query(
        "SELECT request FROM turns WHERE conversation_id = ?", raw.headers["X-Conversation-Id"]
    )
    params = json.loads(request)["params"]
    assert params["tags"] == ["prod"] and params["metadata"]["tags"] == ["team-a", "beta"]


@pytest.mark.parametrize("value", ["", 7], ids=["empty", "number"])
async def test_a_bad_or_conflicting_session_id_is_a_400(
    gw: GatewayUnderTest, upstream: FakeUpstream, value: Any
) -> None:
    status, body = await gw.post(
        "/v1/chat/completions",
        {"model": "fake", "messages": [QUESTION], "litellm_session_id": value},
    )
    assert (status, body["error"]["param"]) == (400, "litellm_session_id")
    status, body = await gw.post(
        "/v1/chat/completions",
        {
            "model": "fake",
            "messages": [QUESTION],
            "litellm_session_id": "a",
            "metadata": {"conversation_id": "b"},
        },
    )
    assert status == 400 and "different conversations" in body["error"]["message"]
    assert upstream.requests == []  # nothing was sent
