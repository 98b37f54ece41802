"""Automatic threading: requests that name no conversation continue the one their history
matches (docs/recording.md, "Conversations and branches"), through the real SDKs."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import anthropic
import pytest
from aiohttp import web

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import DONE, FakeUpstream, completion, sse
from tests.http.test_auth import MASTER, admin, new_key

SYSTEM = {"role": "system", "content": "You are a weather agent."}
QUESTION = {"role": "user", "content": "Weather in Paris, Lyon and Nice?"}
TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


async def ask(gw: GatewayUnderTest, messages: list[dict[str, Any]], **extra: Any) -> Any:
    """One non-streaming chat turn with no conversation header: (conversation id, message)."""
    headers = extra.pop("headers", {})
    key = extra.pop("key", "test-key")
    raw = await gw.client(key, default_headers=headers).chat.completions.with_raw_response.create(
        model="fake", messages=messages, tools=[TOOL], **extra
    )
    message = raw.parse().choices[0].message.model_dump(exclude_none=True)
    message.pop("refusal", None)
    return raw.headers["X-Conversation-Id"], message


def path_reads(gw: GatewayUnderTest, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The conversations whose events the store reads back from now on, in order."""
    reads: list[str] = []
    read = gw.gateway.store.events

    async def counted(conversation_id: str, up_to_seq: int | None = None) -> Any:
        reads.append(conversation_id)
        return await read(conversation_id, up_to_seq)

    monkeypatch.setattr(gw.gateway.store, "events", counted)
    return reads


async def tool_loop(
    gw: GatewayUnderTest, upstream: FakeUpstream, question: dict[str, Any], run: str = "a"
) -> tuple[list[str], list[dict[str, Any]]]:
    """Three tool rounds (one with two parallel calls), then an answer, the client sending its
    whole history each time and the tool-call arguments back re-serialised, as LangChain does.
    The conversation id of each of the four requests, and the client's final history."""
    messages = [SYSTEM, question]
    seen = []
    rounds = [
        [(f"call_{run}1", '{"city":"Paris"}')],
        [(f"call_{run}2", '{"city":"Lyon"}'), (f"call_{run}3", '{"city":"Nice"}')],
        [(f"call_{run}4", '{"city":"Paris","days":2}')],
    ]
    for calls in rounds:
        upstream.push(tool_calls_script(upstream, calls))
        conversation_id, message = await ask(gw, messages)
        seen.append(conversation_id)
        for call in message["tool_calls"]:
            arguments = json.loads(call["function"]["arguments"])
            call["function"]["arguments"] = json.dumps(arguments)  # '{"city": "Paris"}'
        messages.append(message)
        for call in message["tool_calls"]:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": "18 C"})
    upstream.push(completion("Sunny everywhere."))
    conversation_id, message = await ask(gw, messages)
    seen.append(conversation_id)
    messages.append(message)
    return seen, messages


def tool_calls_script(upstream: FakeUpstream, calls: list[tuple[str, str]]) -> Any:
    """Parallel tool calls in OpenAI's format (a whole completion, or its stream), finished
    with "tool_calls"."""

    async def script(request: web.Request) -> web.StreamResponse:
        if not (await request.json()).get("stream"):
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": "weather", "arguments": a}}
                    for i, a in calls
                ],
            }
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            return web.json_response(
                {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
                 "model": "fake-model", "choices": [choice]}
            )  # fmt: skip
        response = await upstream.start_sse(request)
        for index, (call_id, arguments) in enumerate(calls):
            head = {"index": index, "id": call_id, "type": "function"}
            head["function"] = {"name": "weather", "arguments": ""}
            await upstream.write(response, sse(upstream.chunk_object({"tool_calls": [head]})))
            part = {"index": index, "function": {"arguments": arguments}}
            await upstream.write(response, sse(upstream.chunk_object({"tool_calls": [part]})))
        await upstream.write(response, sse(upstream.chunk_object({}, "tool_calls")))
        await upstream.write(response, DONE)
        await response.write_eof()
        return response

    return script


async def events(gw: GatewayUnderTest, conversation_id: str) -> list[dict[str, Any]]:
    await gw.flush()
    return [e.to_api() for e in await gw.gateway.store.events(conversation_id)]


async def test_an_agent_loop_without_a_header_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    seen, history = await tool_loop(gw, upstream, QUESTION)
    assert len(set(seen)) == 1
    conversation_id = seen[0]
    recorded = await events(gw, conversation_id)
    kinds = [e["type"] for e in recorded if e["type"] != "turn/end"]
    assert kinds == [
        "user/message",
        "assistant/message",
        "tool/result",
        "assistant/message",
        "tool/result",
        "tool/result",
        "assistant/message",
        "tool/result",
        "assistant/message",
    ]
    assert all(e["payload"]["synthetic"] is False for e in recorded if e["type"] == "tool/result")
    assert [e["payload"]["status"] for e in recorded if e["type"] == "turn/end"] == [
        "completed"
    ] * 4
    # The model history is the client's, with no synthetic result anywhere.
    derived = await gw.messages(conversation_id)
    assert "ABORTED_BEFORE_DISPATCH" not in json.dumps(derived)
    assert [m["role"] for m in derived] == [m["role"] for m in history[1:]]
    # The upstream got exactly what the client sent, every time.
    assert upstream.requests[-1]["messages"][-1] == history[-2]


async def test_a_second_run_with_a_fresh_first_message_is_a_second_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    first, _ = await tool_loop(gw, upstream, QUESTION)
    # The same agent again, the same answers from the model, even the same call ids: only
    # the first message differs.
    fresh = {"role": "user", "content": "And tomorrow?"}
    second, _ = await tool_loop(gw, upstream, fresh)
    assert len(set(second)) == 1 and second[0] != first[0]
    # The same question once more: a first message always starts a conversation, and the run
    # follows its own conversation (the newest with that history), not the first run's.
    third, _ = await tool_loop(gw, upstream, QUESTION)
    await gw.flush()
    assert len(set(third)) == 1 and third[0] not in (first[0], second[0])
    rows = gw.query("SELECT conversation_id, COUNT(*) FROM turns GROUP BY conversation_id")
    assert sorted(n for _, n in rows) == [4, 4, 4]


async def one_round(gw: GatewayUnderTest, upstream: FakeUpstream) -> tuple[str, dict[str, Any]]:
    upstream.push(tool_calls_script(upstream, [("call_1", '{"city":"Paris"}')]))
    return await ask(gw, [SYSTEM, QUESTION])


@pytest.mark.parametrize(
    "resend",
    [
        pytest.param(lambda m: m, id="as received"),
        pytest.param(
            lambda m: {**m, "tool_calls": [reargue(m["tool_calls"][0], '{ "city" : "Paris" }')]},
            id="re-serialised arguments",
        ),
        pytest.param(
            lambda m: {**m, "content": [], "name": "agent", "refusal": None},
            id="empty parts content and extra fields",
        ),
    ],
)
async def test_equal_histories_join(
    gw: GatewayUnderTest, upstream: FakeUpstream, resend: Any
) -> None:
    conversation_id, message = await one_round(gw, upstream)
    upstream.push(completion("18 C."))
    tool = {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "18 C"}]}
    question = {"role": "user", "content": [{"type": "text", "text": QUESTION["content"]}]}
    system = {"role": "developer", "content": SYSTEM["content"]}  # as providers treat it
    again, _ = await ask(gw, [system, question, resend(message), tool])
    assert again == conversation_id


def reargue(call: dict[str, Any], arguments: str) -> dict[str, Any]:
    return {**call, "function": {**call["function"], "arguments": arguments}}


async def test_reordered_json_keys_join_and_a_changed_value_branches(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(tool_calls_script(upstream, [("call_1", '{"city":"Paris","days":2}')]))
    conversation_id, message = await ask(gw, [SYSTEM, QUESTION])
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
    upstream.push(completion("18 C."))
    reordered = {
        **message,
        "tool_calls": [reargue(message["tool_calls"][0], '{"days":2,"city":"Paris"}')],
    }
    joined, _ = await ask(gw, [SYSTEM, QUESTION, reordered, tool])
    assert joined == conversation_id
    upstream.push(completion("18 C."))
    changed = {
        **message,
        "tool_calls": [reargue(message["tool_calls"][0], '{"city":"Paris","days":3}')],
    }
    other, _ = await ask(gw, [SYSTEM, QUESTION, changed, tool])
    assert other != conversation_id
    # Nothing stored matched: the whole history is recorded in a conversation of its own.
    kinds = [e["type"] for e in await events(gw, other) if e["type"] != "turn/end"]
    assert kinds == ["user/message", "assistant/message", "tool/result", "assistant/message"]


async def test_a_regenerate_and_an_edit_branch_at_their_turn(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    first = {"role": "user", "content": "Hi"}
    upstream.push(completion("Hello!"))
    conversation_id, hello = await ask(gw, [first])
    second = {"role": "user", "content": "Tell me a joke"}
    upstream.push(completion("A joke."))
    same, joke = await ask(gw, [first, hello, second])
    assert same == conversation_id
    path = await events(gw, conversation_id)
    at_second = next(e["seq"] for e in path if e["payload"].get("content") == "Tell me a joke")
    at_hello = next(e["seq"] for e in path if e["type"] == "assistant/message")

    # Regenerate: the same history without the last answer.
    upstream.push(completion("Another joke."))
    regenerated, _ = await ask(gw, [first, hello, second])
    assert regenerated != conversation_id
    branch = await gw.gateway.store.get_conversation(regenerated)
    assert branch is not None and (branch.parent_id, branch.parent_seq) == (
        conversation_id,
        at_second,
    )
    assert [m["content"] for m in await gw.messages(regenerated)] == [
        "Hi", "Hello!", "Tell me a joke", "Another joke."
    ]  # fmt: skip

    # An edited earlier message: a branch where it was.
    upstream.push(completion("A pun."))
    edited, _ = await ask(gw, [first, hello, {"role": "user", "content": "Tell me a pun"}])
    branch = await gw.gateway.store.get_conversation(edited)
    assert branch is not None and (branch.parent_id, branch.parent_seq) == (
        conversation_id,
        at_hello,
    )

    # The regenerated branch goes on as a conversation of its own; the original too.
    upstream.push(completion("Ha."))
    onward, _ = await ask(
        gw, [first, hello, second, {"role": "assistant", "content": "Another joke."}, first]
    )
    assert onward == regenerated
    upstream.push(completion("Ha."))
    original, _ = await ask(gw, [first, hello, second, joke, first])
    assert original == conversation_id


async def test_a_regenerate_reads_only_what_follows_its_turn(
    gw: GatewayUnderTest, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    history: list[dict[str, Any]] = []
    for n in range(4):
        history.append({"role": "user", "content": f"Question {n}"})
        upstream.push(completion(f"Answer {n}."))
        conversation_id, answer = await ask(gw, history)
        history.append(answer)
    path = await events(gw, conversation_id)
    at_question = next(e["seq"] for e in path if e["payload"].get("content") == "Question 2")
    reads = path_reads(gw, monkeypatch)

    # The second question asked again: its history is the conversation as the second turn
    # ended it, which its fingerprint finds; the branch is made without reading the path.
    upstream.push(completion("Another answer."))
    regenerated, _ = await ask(gw, history[:5])
    assert reads == []
    branch = await gw.gateway.store.get_conversation(regenerated)
    assert branch is not None
    assert (branch.parent_id, branch.parent_seq) == (conversation_id, at_question)
    assert [m["content"] for m in await gw.messages(regenerated)] == [
        "Question 0", "Answer 0.", "Question 1", "Answer 1.", "Question 2", "Another answer."
    ]  # fmt: skip

    # A continuation of the branch, and of the original, still join each.
    upstream.push(completion("Onward."))
    onward, _ = await ask(
        gw, [*history[:5], {"role": "assistant", "content": "Another answer."}, history[0]]
    )
    assert onward == regenerated
    upstream.push(completion("Onward."))
    original, _ = await ask(gw, [*history, {"role": "user", "content": "Question 4"}])
    assert original == conversation_id


@pytest.fixture
async def secured(make_gateway: MakeGateway, upstream: FakeUpstream) -> GatewayUnderTest:
    gw = await make_gateway(upstream=upstream, auth={"master_key": MASTER})
    status, _ = await admin(gw, "POST", "/v1/gateway/teams", {"id": "red", "name": "Red"})
    assert status == 201
    return gw


async def test_two_keys_and_two_users_never_join_each_other(
    secured: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    one, two = (await new_key(secured, "red"))["key"], (await new_key(secured, "red"))["key"]
    hi = {"role": "user", "content": "Hi"}
    hello = {"role": "assistant", "content": "Hello!"}
    history = [hi, hello, {"role": "user", "content": "Again"}]

    async def run(key: str, user: str | None = None) -> str:
        upstream.push(completion("Hello!"))
        extra = {"user": user} if user else {}
        first, _ = await ask(secured, [hi], key=key, **extra)
        upstream.push(completion("Once more."))
        follow, _ = await ask(secured, history, key=key, **extra)
        assert follow == first  # each one's own follow-up joins its own conversation
        return first

    made = [await run(one), await run(two), await run(one, "alice"), await run(one, "bob")]
    assert len(set(made)) == 4


async def test_cancel_records_the_delivered_prefix_in_the_same_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id, message = await one_round(gw, upstream)
    tool = {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}
    parts = [f"word{i} " for i in range(200)]
    upstream.stall_after(parts)
    history = [SYSTEM, QUESTION, message, tool]
    received = ""
    async with aiohttp.ClientSession() as session:
        body = {"model": "fake", "messages": history, "stream": True}
        async with session.post(gw.url + "/v1/chat/completions", json=body) as response:
            assert response.headers["X-Conversation-Id"] == conversation_id
            turn_id = response.headers["X-Gateway-Turn-Id"]
            async for line in response.content:
                if line.startswith(b"data: {"):
                    delta = json.loads(line[6:])["choices"][0]["delta"]
                    received += delta.get("content") or ""
                if received.count("word") >= 5:
                    break
    recorded = await gw.wait_turn_end(conversation_id, count=2)
    interrupted = [
        e for e in recorded if e["turn_id"] == turn_id and e["type"] == "assistant/message"
    ]
    assert len(interrupted) == 1 and interrupted[0]["payload"]["interrupted"] is True
    text = interrupted[0]["payload"]["content"][0]["text"]
    assert text.startswith(received) and "".join(parts).startswith(text)
    # A follow-up that carries what the client showed continues the same conversation.
    upstream.push(completion("Anything else?"))
    again, _ = await ask(
        gw,
        [*history, {"role": "assistant", "content": text}, {"role": "user", "content": "Thanks"}],
    )
    assert again == conversation_id


async def test_a_stateless_responses_loop_is_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """The Agents SDK's way: the whole input every time, no previous_response_id."""
    client = gw.client()
    tools = [{"type": "function", "name": "weather", "parameters": TOOL["function"]["parameters"]}]
    items: list[Any] = [{"role": "user", "content": "Weather in Paris?"}]
    upstream.push(tool_calls_script(upstream, [("call_1", '{"city":"Paris"}')]))
    first = await client.responses.with_raw_response.create(
        model="fake", input=items, tools=tools, store=False
    )
    conversation_id = first.headers["X-Conversation-Id"]
    output = first.parse().output
    items += [o.model_dump(exclude_none=True) for o in output]
    items.append({"type": "function_call_output", "call_id": "call_1", "output": "18 C"})
    upstream.push(completion("Sunny."))
    second = await client.responses.with_raw_response.create(
        model="fake", input=items, tools=tools, store=False
    )
    assert second.headers["X-Conversation-Id"] == conversation_id
    kinds = [e["type"] for e in await events(gw, conversation_id) if e["type"] != "turn/end"]
    assert kinds == ["user/message", "assistant/message", "tool/result", "assistant/message"]


async def test_anthropic_messages_thread_too(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key", max_retries=0)
    upstream.push(completion("Hello!"))
    first = await client.messages.with_raw_response.create(
        model="fake",
        max_tokens=50,
        system="Be brief.",
        messages=[{"role": "user", "content": "Hi"}],
    )
    reply = await first.parse()
    upstream.push(completion("Fine."))
    second = await client.messages.with_raw_response.create(
        model="fake",
        max_tokens=50,
        system=[{"type": "text", "text": "Be brief."}],
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
            {"role": "user", "content": "How are you?"},
        ],
    )
    assert second.headers["X-Conversation-Id"] == first.headers["X-Conversation-Id"]
    await client.close()


async def test_threading_header_and_off(make_gateway: MakeGateway, upstream: FakeUpstream) -> None:
    hi = {"role": "user", "content": "Hi"}
    for mode in ("header", "off"):
        gw = await make_gateway(upstream=upstream, conversations={"threading": mode})
        upstream.push(completion("Hello!"))
        first, hello = await ask(gw, [hi])
        upstream.push(completion("Again."))
        second, _ = await ask(gw, [hi, hello, hi])
        assert second != first
    # Off: a request that names a conversation is refused, and nothing is recorded.
    status, body = await post(gw, {"model": "fake", "messages": [hi]}, {"X-Conversation-Id": "c1"})
    assert status == 400 and "conversations.threading" in body["error"]["message"]
    assert gw.query("SELECT COUNT(*) FROM conversations WHERE id = 'c1'") == [(0,)]


async def post(
    gw: GatewayUnderTest, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/chat/completions", json=body, headers=headers or {}
        ) as response:
            return response.status, await response.json()


async def test_metadata_and_session_headers_name_the_conversation(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(upstream=upstream, conversations={"session_headers": ["X-Session-Id"]})
    hi = {"role": "user", "content": "Hi"}
    upstream.push(completion("Hello!"))
    status, _ = await post(
        gw, {"model": "fake", "messages": [hi], "metadata": {"conversation_id": "s1", "app": "x"}}
    )
    assert status == 200
    # The gateway's key never goes upstream; the client's own metadata does.
    assert upstream.requests[-1]["metadata"] == {"app": "x"}
    hello = {"role": "assistant", "content": "Hello!"}
    upstream.push(completion("Fine."))
    history = [hi, hello, {"role": "user", "content": "How are you?"}]
    status, _ = await post(
        gw, {"model": "fake", "messages": history, "metadata": {"conversation_id": "s1"}}
    )
    assert status == 200 and "metadata" not in upstream.requests[-1]
    upstream.push(completion("Bye."))
    history += [{"role": "assistant", "content": "Fine."}, {"role": "user", "content": "Bye"}]
    status, _ = await post(gw, {"model": "fake", "messages": history}, {"x-session-id": "s1"})
    assert status == 200
    await gw.flush()
    turns = gw.query("SELECT COUNT(*) FROM turns WHERE conversation_id = 's1'")
    assert turns == [(3,)]

    # Two names for two conversations: 400 naming both, nothing recorded.
    before = gw.query("SELECT COUNT(*) FROM turns")
    status, body = await post(
        gw,
        {"model": "fake", "messages": [hi], "metadata": {"conversation_id": "s2"}},
        {"X-Conversation-Id": "s1"},
    )
    assert status == 400
    assert "X-Conversation-Id 's1'" in body["error"]["message"]
    assert "metadata.conversation_id 's2'" in body["error"]["message"]
    status, body = await post(
        gw, {"model": "fake", "messages": [hi], "metadata": {"conversation_id": 7}}
    )
    assert status == 400 and body["error"]["param"] == "metadata.conversation_id"
    assert gw.query("SELECT COUNT(*) FROM turns") == before


async def test_a_deleted_conversation_is_not_continued(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    hi = {"role": "user", "content": "Hi"}
    upstream.push(completion("Hello!"))
    first, hello = await ask(gw, [hi])
    async with aiohttp.ClientSession() as session:
        async with session.delete(f"{gw.url}/v1/conversations/{first}") as response:
            assert response.status == 200
    upstream.push(completion("Again."))
    second, _ = await ask(gw, [hi, hello, hi])
    assert second != first


async def test_threading_survives_a_restart_on_both_backends(
    make_gateway: MakeGateway, upstream: FakeUpstream, pg_url: str
) -> None:
    """The lookup is the store's index, not this process's memory."""
    hi = {"role": "user", "content": "Hi"}
    for store in ({}, {"url": pg_url}):
        before = await make_gateway(upstream=upstream, store=store)
        upstream.push(completion("Hello!"))
        first, hello = await ask(before, [hi], user="restart")
        await before.flush()
        after = await make_gateway(upstream=upstream, store=store)
        upstream.push(completion("Again."))
        second, _ = await ask(after, [hi, hello, hi], user="restart")
        assert second == first


async def test_a_history_once_unknown_is_found_once_a_turn_ends_with_it(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """A miss is remembered (the store has no other writer), and forgotten when a turn ends
    with that very history."""
    hi, hello = {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}
    upstream.push(completion("Yes."))
    unknown, _ = await ask(gw, [hi, hello, {"role": "user", "content": "Really?"}])
    upstream.push(completion("Hello!"))
    first, _ = await ask(gw, [hi])
    assert first != unknown
    upstream.push(completion("Fine."))
    again, _ = await ask(gw, [hi, hello, {"role": "user", "content": "How are you?"}])
    assert again == first


async def test_a_follow_up_carrying_the_truncated_text_continues_the_conversation(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    """After a truncate, what the client continues with is the text it showed: the turn's
    fingerprint follows the truncate, also in the database (a restart keeps it)."""
    from tests.fakes import chunk, frames

    gw = await make_gateway(upstream=upstream)
    parts = ["Once upon ", "a time, ", "in a land ", "far away"]
    upstream.push(frames(*(chunk(p) for p in parts), then="stall"))
    client = gw.client(default_headers={"X-Request-Id": "req-story"})
    question = {"role": "user", "content": "A story?"}
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[question], stream=True
    )
    conversation_id = response.headers["X-Conversation-Id"]
    seen, cancelled = "", False
    async for part in response.parse():
        seen += part.choices[0].delta.content or ""
        if seen == "".join(parts) and not cancelled:
            cancelled = True
            status, answer = await gw.post(
                "/v1/chat/completions/req-story/cancel", {"content_chars": 9}
            )
            assert status == 200, answer
    shown = {"role": "assistant", "content": "Once upon"}
    upstream.push(completion("...a time."))
    onward, _ = await ask(gw, [question, shown, {"role": "user", "content": "Go on"}])
    assert onward == conversation_id
    await gw.flush()
    later = await make_gateway(upstream=upstream)  # the same store, nothing in memory
    upstream.push(completion("...a time."))
    again, _ = await ask(later, [question, shown, {"role": "user", "content": "Go on!"}])
    branch = await later.gateway.store.get_conversation(again)
    # The stored history is the shown text: a second follow-up after the same answer is a
    # sibling of the first (a branch at the truncated answer), not a new conversation.
    assert branch is not None and branch.parent_id == conversation_id


async def test_a_history_that_is_the_conversation_as_it_ended_is_not_read_back(
    gw: GatewayUnderTest, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Continuing a conversation costs the same whatever its length: a history whose
    fingerprint is the conversation's last turn's end is that conversation, with nothing
    after it, so its messages after that history are new without the stored history read
    back and compared. A conversation that moved on since branches where the request
    departs from what followed that turn, which is all that is read."""
    seen, history = await tool_loop(gw, upstream, QUESTION)
    reads = path_reads(gw, monkeypatch)
    thanks = {"role": "user", "content": "Thanks!"}
    upstream.push(completion("Anything else?"))
    continued, _ = await ask(gw, [*history, thanks])
    assert continued == seen[0] and reads == []
    # The same question again (a regenerate): the conversation has that answer since.
    upstream.push(completion("Something else?"))
    regenerated, _ = await ask(gw, [*history, thanks])
    assert regenerated != seen[0] and reads == []

    monkeypatch.undo()
    recorded = await events(gw, seen[0])
    kinds = [e["type"] for e in recorded if e["type"] != "turn/end"]
    assert kinds[-2:] == ["user/message", "assistant/message"]  # only the new question
    assert [e["payload"]["content"] for e in recorded if e["type"] == "user/message"] == [
        QUESTION["content"],
        "Thanks!",
    ]
    branch = await gw.gateway.store.get_conversation(regenerated)
    assert branch is not None and branch.parent_id == seen[0]


async def test_a_stateless_responses_history_is_not_read_back_either(
    gw: GatewayUnderTest, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Agents SDK and Codex send the whole input every turn, with no id: a history that is
    the conversation as it ended continues it without reading it back, as for chat."""
    api = gw.client()
    upstream.push(completion("Paris."), completion("About 2.1 million."))
    first = await api.responses.with_raw_response.create(model="fake", input="Capital of France?")
    reads = path_reads(gw, monkeypatch)
    second = await api.responses.with_raw_response.create(
        model="fake",
        input=[
            {"role": "user", "content": "Capital of France?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "Population?"},
        ],
    )
    conversation_id = first.headers["X-Conversation-Id"]
    assert second.headers["X-Conversation-Id"] == conversation_id
    assert reads == []
    monkeypatch.undo()
    recorded = await events(gw, conversation_id)
    assert [e["payload"]["content"] for e in recorded if e["type"] == "user/message"] == [
        "Capital of France?",
        "Population?",
    ]
