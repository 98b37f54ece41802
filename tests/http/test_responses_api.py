"""POST /v1/responses with the real openai SDK: stateful responses for any provider."""

from __future__ import annotations

import asyncio
from typing import Any

import openai
import pytest

from gateway.conversations import stored_responses
from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import DONE, USAGE, FakeUpstream, chunk, completion, frames, paused, replay

TEXT = "The capital of the UK is London."


async def test_stream_store_and_retrieve(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(replay("openai-chat-text-usage.sse"))
    api = gw.client()
    stream = await api.responses.create(
        model="fake", input="Capital of the UK?", instructions="Be brief.", stream=True
    )
    kinds, final = [], None
    async for event in stream:
        kinds.append(event.type)
        if event.type == "response.completed":
            final = event.response
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert final is not None and final.output_text == TEXT
    assert upstream.requests[0]["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Capital of the UK?"},
    ]
    stored = await api.responses.retrieve(final.id)
    assert (stored.status, stored.output_text) == ("completed", TEXT)
    assert [i.id for i in stored.output] == [i.id for i in final.output]
    items = await api.responses.input_items.list(final.id)
    assert [i.content[0].text for i in items.data] == ["Capital of the UK?"]


async def test_cancel_then_follow_up_carries_the_prefix(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    parts = ["1. Sleep. ", "2. Wat"]
    upstream.push(frames(*(chunk(p) for p in parts), then="stall"))
    api = gw.client()
    stream = await api.responses.create(model="fake", input="Three tips?", stream=True)
    seen, response_id = "", None
    async for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            seen += event.delta
        if seen == "".join(parts):
            break
    await stream.close()
    await asyncio.wait_for(upstream.disconnected.wait(), 5)
    assert response_id is not None
    async with asyncio.timeout(5):
        while (stored := await api.responses.retrieve(response_id)).status == "in_progress":
            await asyncio.sleep(0.02)
    assert stored.status == "cancelled"
    assert [(i.status, i.content[0].text) for i in stored.output] == [
        ("incomplete", "".join(parts))
    ]
    # The follow-up's upstream request carries the delivered prefix byte for byte.
    upstream.push(completion(TEXT))
    follow = await api.responses.create(
        model="fake", input="Go on.", previous_response_id=response_id
    )
    assert follow.output_text == TEXT
    assert upstream.requests[-1]["messages"] == [
        {"role": "user", "content": "Three tips?"},
        {"role": "assistant", "content": "".join(parts)},
        {"role": "user", "content": "Go on."},
    ]


async def test_explicit_cancel_ends_with_a_cancelled_response(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(chunk("Half "), chunk("way"), then="stall"))
    api = gw.client()
    stream = await api.responses.create(model="fake", input="Go", stream=True)
    events, response_id, text = [], None, ""
    async for event in stream:
        events.append(event)
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            text += event.delta
            if text == "Half way":
                assert response_id is not None
                cancelled = await api.responses.cancel(response_id)
                assert cancelled.status == "cancelled"
    last = events[-1]
    assert last.type == "response.incomplete" and last.response.status == "cancelled"
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert deltas == ["Half ", "way"]  # every delta before the terminal event
    stored = await api.responses.retrieve(response_id)
    assert stored.status == "cancelled"
    assert stored.output[0].content[0].text == "Half way"
    with pytest.raises(openai.ConflictError):
        await api.responses.cancel(response_id)


async def test_responses_join_a_conversation(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    api = gw.client()
    conversation = await api.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}]
    )
    upstream.push(completion(TEXT))
    await api.responses.create(model="fake", input="What is my name?", conversation=conversation.id)
    assert upstream.requests[-1]["messages"] == [
        {"role": "user", "content": "My name is Ada."},
        {"role": "user", "content": "What is my name?"},
    ]
    items = await api.conversations.items.list(conversation.id, limit=100)
    assert [getattr(i, "role", None) for i in items.data] == ["user", "user", "assistant"]


async def test_a_follow_up_whose_history_went_stale_while_read_forks(
    gw: GatewayUnderTest, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst case of two follow-ups on one response: the second reads the conversation's
    history, and the first starts and ends whole before the second goes on. What the second
    read misses the first's turn, so it forks rather than continue after it unseen."""
    api = gw.client()
    upstream.push(completion("Hello."))
    first = await api.responses.create(model="fake", input="Hi.")
    upstream.push(completion("One."), completion("Two."))
    read_path = stored_responses.history_path
    other: list[str] = []

    async def read_then_let_the_other_run(*args: Any, **kwargs: Any) -> Any:
        path = await read_path(*args, **kwargs)
        if not other:  # the second request's read: the first runs whole meanwhile
            other.append("running")
            made = await api.responses.with_raw_response.create(
                model="fake", input="First follow-up.", previous_response_id=first.id
            )
            other[0] = made.headers["X-Conversation-Id"]
        return path

    monkeypatch.setattr(stored_responses, "history_path", read_then_let_the_other_run)
    second = await api.responses.with_raw_response.create(
        model="fake", input="Second follow-up.", previous_response_id=first.id
    )
    assert other[0] != second.headers["X-Conversation-Id"]
    for conversation in (other[0], second.headers["X-Conversation-Id"]):
        messages = await gw.messages(conversation)
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]


async def test_a_conversation_with_a_response_running_refuses_another(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """As OpenAI answers it: a second response on a conversation whose first is still running
    is refused (`conversation_locked`), never recorded beside it; once the first has ended,
    the next continues after it."""
    api = gw.client()
    conversation = await api.conversations.create()
    upstream.push(paused([chunk("Tea, ")], [chunk("then toast."), chunk(finish="stop"), DONE]))

    async def breakfast() -> str:
        stream = await api.responses.create(
            model="fake", input="Breakfast?", conversation=conversation.id, stream=True
        )
        return "".join([e.delta async for e in stream if e.type == "response.output_text.delta"])

    first = asyncio.create_task(breakfast())
    await asyncio.wait_for(upstream.stalled.wait(), 5)
    with pytest.raises(openai.BadRequestError) as refused:
        await api.responses.create(model="fake", input="Lunch?", conversation=conversation.id)
    assert refused.value.code == "conversation_locked"
    assert refused.value.param == "conversation"
    assert len(upstream.requests) == 1  # nothing of it went upstream
    upstream.release.set()
    assert await first == "Tea, then toast."
    upstream.push(completion("Soup."))
    await api.responses.create(model="fake", input="Lunch?", conversation=conversation.id)
    assert upstream.requests[-1]["messages"] == [
        {"role": "user", "content": "Breakfast?"},
        {"role": "assistant", "content": "Tea, then toast."},
        {"role": "user", "content": "Lunch?"},
    ]
    items = await api.conversations.items.list(conversation.id, limit=100, order="asc")
    assert [getattr(i, "role", None) for i in items.data] == ["user", "assistant"] * 2


async def test_a_follow_up_waits_for_the_stopped_turn_of_its_conversation(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    """A client that stops a stream and asks again at once, on the same conversation, can be
    ahead of the stopped turn's end (here it drains the upstream for its usage): the follow-up
    waits for that end, then carries what was delivered, rather than being refused."""
    fake = await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "on_client_disconnect": "drain",
                "deployments": [{"provider": "openai", "api_base": fake.url}],
            }
        ]
    )
    api = gw.client()
    conversation = await api.conversations.create()
    fake.push(
        paused(
            [chunk("1. Sleep. "), chunk("2. Wat")],
            [chunk("er."), chunk(finish="stop"), chunk(usage=USAGE, no_choices=True), DONE],
        )
    )
    stream = await api.responses.create(
        model="m", input="Three tips?", stream=True, conversation=conversation.id
    )
    seen = ""
    async for event in stream:
        if event.type == "response.output_text.delta":
            seen += event.delta
        if seen == "1. Sleep. 2. Wat":
            break
    await stream.close()
    fake.push(completion(TEXT))
    follow = asyncio.create_task(
        api.responses.create(model="m", input="Go on.", conversation=conversation.id)
    )
    # The stopped turn drains until the upstream goes on: the follow-up waits meanwhile.
    done, _ = await asyncio.wait({follow}, timeout=0.3)
    assert not done
    fake.release.set()
    assert (await follow).output_text == TEXT
    assert fake.requests[-1]["messages"] == [
        {"role": "user", "content": "Three tips?"},
        {"role": "assistant", "content": "1. Sleep. 2. Wat"},
        {"role": "user", "content": "Go on."},
    ]


async def test_non_streaming_delete_and_errors(gw: GatewayUnderTest) -> None:
    api = gw.client()
    made = await api.responses.create(model="demo", input="Hello")
    assert made.status == "completed" and "demo provider" in made.output_text
    deleted = await api.responses.delete(made.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await api.responses.create(model="demo", input="x", previous_response_id="resp_nope")
    with pytest.raises(openai.BadRequestError) as caught:
        await api.responses.create(model="demo", input=[{"type": "mystery"}])  # type: ignore[list-item]
    assert caught.value.body["param"].startswith("input")  # type: ignore[index]


async def test_a_tool_call_without_a_result_gets_the_synthetic_one(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(replay("openai-chat-tool-call-usage.sse"))
    api = gw.client()
    stream = await api.responses.create(model="fake", input="Capital of the UK?", stream=True)
    first = [e.response async for e in stream if e.type == "response.completed"].pop()
    assert [i.type for i in first.output] == ["function_call"]
    # The client never ran the tool and just asks something else.
    upstream.push(completion(TEXT))
    await api.responses.create(model="fake", input="Never mind.", previous_response_id=first.id)
    sent = upstream.requests[-1]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "user"]
    assert sent[2]["tool_call_id"] == "call_ZR5UUuTt3pf61kjwAJIYdVMj"
    assert "ABORTED_BEFORE_DISPATCH" in sent[2]["content"]
    # With a real result instead, that result is what the upstream gets and what is recorded.
    upstream.push(completion(TEXT))
    await api.responses.create(
        model="fake",
        input=[
            {
                "type": "function_call_output",
                "call_id": "call_ZR5UUuTt3pf61kjwAJIYdVMj",
                "output": "London",
            }
        ],
        previous_response_id=first.id,
    )
    sent = upstream.requests[-1]["messages"]
    assert sent[2] == {
        "role": "tool",
        "tool_call_id": "call_ZR5UUuTt3pf61kjwAJIYdVMj",
        "content": "London",
    }


async def test_store_false_is_not_retrievable(gw: GatewayUnderTest) -> None:
    api = gw.client()
    made = await api.responses.create(model="demo", input="Hello", store=False)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        await api.responses.retrieve(made.id)


async def test_x_conversation_id_threads_responses_as_it_does_chat(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """An Agents SDK user who sets the header, as for chat, gets one conversation of two turns,
    the second sent upstream with the first's history."""
    api = gw.client(default_headers={"X-Conversation-Id": "agent-run-7"})
    upstream.push(completion("Paris."), completion("About 2.1 million."))
    first = await api.responses.with_raw_response.create(model="fake", input="Capital of France?")
    second = await api.responses.with_raw_response.create(model="fake", input="Population?")
    assert first.headers["X-Conversation-Id"] == second.headers["X-Conversation-Id"]
    assert first.headers["X-Conversation-Id"] == "agent-run-7"
    assert upstream.requests[-1]["messages"] == [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Population?"},
    ]
    events = await gw.wait_turn_end("agent-run-7", count=2)
    assert [e["type"] for e in events].count("user/message") == 2


async def test_x_conversation_id_that_contradicts_the_body_is_refused(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(completion("Paris."))
    api = gw.client()
    first = await api.responses.create(model="fake", input="Capital of France?")
    headers = {"X-Conversation-Id": "somewhere-else"}
    with pytest.raises(openai.BadRequestError) as refused:
        await api.responses.create(
            model="fake", input="And?", previous_response_id=first.id, extra_headers=headers
        )
    assert "previous_response_id" in str(refused.value) and "somewhere-else" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:
        await api.responses.create(
            model="fake", input="And?", conversation="conv_other", extra_headers=headers
        )
    assert "conv_other" in str(refused.value) and "somewhere-else" in str(refused.value)
    assert len(upstream.requests) == 1  # nothing reached the upstream


async def test_two_requests_continuing_one_response_at_once_do_not_share_it(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """Two follow-ups sent at the same moment on the same `previous_response_id`: one continues
    its conversation, the other forks it there, so neither history holds the other's turn."""
    api = gw.client()
    upstream.push(completion("Hello."))
    first = await api.responses.create(model="fake", input="Hi.")
    upstream.push(completion("One."), completion("Two."))
    a, b = await asyncio.gather(
        api.responses.with_raw_response.create(
            model="fake", input="First follow-up.", previous_response_id=first.id
        ),
        api.responses.with_raw_response.create(
            model="fake", input="Second follow-up.", previous_response_id=first.id
        ),
    )
    conversations = {a.headers["X-Conversation-Id"], b.headers["X-Conversation-Id"]}
    assert len(conversations) == 2
    for conversation in conversations:
        messages = await gw.messages(conversation)
        # Each: the first exchange, then its own follow-up and answer, no more.
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        assert messages[:2] == [
            {"role": "user", "content": "Hi."},
            {"role": "assistant", "content": "Hello."},
        ]
