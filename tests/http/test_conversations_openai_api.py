"""The OpenAI Conversations API over the event log, driven by the real openai SDK."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, chunk, frames


async def test_create_retrieve_list_add_delete(gw: GatewayUnderTest) -> None:
    api = gw.client()
    made = await api.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Remember: the code is 42."}],
        metadata={"topic": "codes"},
    )
    assert made.id.startswith("conv_")
    assert made.metadata == {"topic": "codes"}
    assert (await api.conversations.retrieve(made.id)).id == made.id
    items = await api.conversations.items.list(made.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [
        ("message", "user", "Remember: the code is 42.")
    ]
    added = await api.conversations.items.create(
        made.id, items=[{"type": "message", "role": "user", "content": "And the colour is blue."}]
    )
    assert [i.content[0].text for i in added.data] == ["And the colour is blue."]
    # A chat completion joins it by id: its history already holds the items.
    await api.chat.completions.create(
        model="demo",
        messages=[
            {"role": "user", "content": "Remember: the code is 42."},
            {"role": "user", "content": "And the colour is blue."},
            {"role": "user", "content": "What did I say?"},
        ],
        extra_headers={"X-Conversation-Id": made.id},
    )
    items = await api.conversations.items.list(made.id, limit=100)
    assert [(i.type, getattr(i, "role", None)) for i in items.data] == [
        ("message", "user"),
        ("message", "user"),
        ("message", "user"),
        ("message", "assistant"),
    ]
    assert items.data[3].status == "completed"
    deleted = await api.conversations.delete(made.id)
    assert deleted.deleted is True
    with pytest.raises(openai.NotFoundError):
        await api.conversations.retrieve(made.id)


async def test_an_interrupted_answer_is_an_incomplete_item(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(chunk("Partial"), then="stall"))
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "user", "content": "Go"}], stream=True
    )
    stream = response.parse()
    async for _ in stream:
        break
    await stream.close()
    conversation_id = response.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    items = await client.conversations.items.list(conversation_id)
    assistant = items.data[-1]
    assert (assistant.role, assistant.status, assistant.content[0].text) == (
        "assistant",
        "incomplete",
        "Partial",
    )


async def test_bad_items_are_400(gw: GatewayUnderTest) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        await gw.client().conversations.create(
            items=[{"type": "message", "role": "robot", "content": "x"}]
        )  # type: ignore[list-item]
    assert caught.value.body["param"] == "items[0].role"  # type: ignore[index]


async def test_update_replaces_a_conversations_metadata(gw: GatewayUnderTest) -> None:
    api = gw.client()
    answer = await api.chat.completions.with_raw_response.create(
        model="demo", messages=[{"role": "user", "content": "Hi"}]
    )
    conversation_id = answer.headers["X-Conversation-Id"]
    updated = await api.conversations.update(
        conversation_id, metadata={"topic": "greetings", "ticket": "T-7"}
    )
    assert (updated.id, updated.metadata) == (
        conversation_id,
        {"topic": "greetings", "ticket": "T-7"},
    )
    assert (await api.conversations.retrieve(conversation_id)).metadata == updated.metadata
    # The list filters by it at once.
    status, listed = await gw.get("/v1/conversations?metadata.ticket=T-7")
    assert status == 200 and [c["id"] for c in listed["data"]] == [conversation_id]
    # Replaced whole, as OpenAI's API does; a bad value changes nothing.
    await api.conversations.update(conversation_id, metadata={"topic": "other"})
    for bad in ({"n": 5}, {f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}):
        with pytest.raises(openai.BadRequestError):
            await api.conversations.update(conversation_id, metadata=bad)  # type: ignore[arg-type]
    assert (await api.conversations.retrieve(conversation_id)).metadata == {"topic": "other"}
    with pytest.raises(openai.NotFoundError):
        await api.conversations.update("conv_unknown", metadata={"a": "b"})
