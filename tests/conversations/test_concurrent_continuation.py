"""Concurrent requests never corrupt a history (docs/recording.md, "Choices at the edges"): two
requests that continue the same turn at once (LangGraph's `agent.batch([x, x])`, deterministic
tool-call ids with identical results) each get a place of their own: one continues the
conversation, the other branches where it would have continued. Every stored history stays a
valid alternation a provider accepts: no duplicated tool result, no two answers in a row, no
synthetic result."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_openai import ChatOpenAI

from gateway.conversations import service
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, Script, completion

Json = dict[str, Any]
QUESTION = {"role": "user", "content": "Weather in Paris?"}
CALL = {
    "id": "call_0",  # deterministic, as some frameworks and models make them
    "type": "function",
    "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})},
}
TOOL = {
    "type": "function",
    "function": {
        "name": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}
RESULT = {"role": "tool", "tool_call_id": "call_0", "content": "18 C"}


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(
    request: pytest.FixtureRequest, make_gateway: MakeGateway, upstream: FakeUpstream
) -> GatewayUnderTest:
    store = {} if request.param == "sqlite" else {"url": request.getfixturevalue("pg_url")}
    return await make_gateway(upstream=upstream, store=store)


def tool_call() -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        message = {"role": "assistant", "content": None, "tool_calls": [CALL]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        return web.json_response(
            {"id": "chatcmpl-fake", "object": "chat.completion", "created": 1,
             "model": "fake-model", "choices": [choice]}
        )  # fmt: skip

    return script


class Gate:
    """Upstream answers held until `count` requests have reached the upstream: by then each of
    them has joined its conversation and begun its turn."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.arrived = 0
        self.all_in = asyncio.Event()

    def held(self, answer: Script) -> Script:
        async def script(request: web.Request) -> web.StreamResponse:
            self.arrived += 1
            if self.arrived == self.count:
                self.all_in.set()
            await self.all_in.wait()
            return await answer(request)

        return script


async def ask(gw: GatewayUnderTest, messages: list[Json]) -> tuple[str, str]:
    """A chat turn naming no conversation: its conversation id and the answer's text."""
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=messages, tools=[TOOL]
    )
    return raw.headers["X-Conversation-Id"], raw.parse().choices[0].message.content or ""


def check_alternation(messages: list[Json]) -> None:
    """A history every provider accepts: user first, never two answers in a row, each tool
    result once, right after the answer that called it, and none made up by the gateway."""
    assert messages[0]["role"] == "user", messages
    calls: set[str] = set()
    answered: set[str] = set()
    previous = None
    for message in messages:
        role = message["role"]
        if role == "assistant":
            assert previous != "assistant", messages
            assert calls <= answered, messages  # the previous answer's calls all had results
            calls = {c["id"] for c in message.get("tool_calls") or ()}
            answered = set()
        elif role == "tool":
            assert previous in ("assistant", "tool"), messages
            assert message["tool_call_id"] in calls - answered, messages
            assert "ABORTED_BEFORE_DISPATCH" not in json.dumps(message), messages
            answered.add(message["tool_call_id"])
        previous = role


async def test_two_identical_tool_results_at_once_each_get_a_place(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(tool_call())
    first, _ = await ask(gw, [QUESTION])
    history = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT]

    gate = Gate(2)
    upstream.push(gate.held(completion("It is 18 C.")), gate.held(completion("It is 18 C.")))
    results = await asyncio.gather(ask(gw, history), ask(gw, history))
    assert [text for _, text in results] == ["It is 18 C.", "It is 18 C."]
    ids = {conversation_id for conversation_id, _ in results}
    assert len(ids) == 2 and first in ids  # one continued, the other went beside it
    (other,) = ids - {first}
    branch = await gw.gateway.store.get_conversation(other)
    assert branch is not None and branch.parent_id == first

    await gw.flush()
    for conversation_id in ids:
        messages = await gw.messages(conversation_id)
        check_alternation(messages)
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
        assert messages[-1]["content"] == "It is 18 C."
    # The conversation itself holds one result and one answer after the call.
    own = [e.type for e in await gw.gateway.store.events(first)]
    assert own.count("tool/result") == 1 and own.count("assistant/message") == 2


async def test_many_at_once_never_corrupt_a_history(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """Four at once, as `agent.batch([x] * 4)` sends them: one continues, three branch, and
    every history is valid."""
    upstream.push(tool_call())
    first, _ = await ask(gw, [QUESTION])
    history = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT]
    gate = Gate(4)
    upstream.push(*(gate.held(completion("It is 18 C.")) for _ in range(4)))
    results = await asyncio.gather(*(ask(gw, history) for _ in range(4)))
    ids = [conversation_id for conversation_id, _ in results]
    assert len(set(ids)) == 4 and first in ids
    await gw.flush()
    for conversation_id in ids:
        messages = await gw.messages(conversation_id)
        check_alternation(messages)
        assert len(messages) == 4


async def test_replicas_on_one_database_never_corrupt_a_history(
    make_gateway: MakeGateway, upstream: FakeUpstream, pg_url: str
) -> None:
    """Two replicas on one PostgreSQL: the second request comes to the other replica once the
    first's turn has begun there and its start is committed. It sees that turn running in the
    conversation (it waits a moment for it to end, as for any turn another replica may just be
    ending) and branches before it."""
    one = await make_gateway(upstream=upstream, store={"url": pg_url})
    two = await make_gateway(upstream=upstream, store={"url": pg_url})
    upstream.push(tool_call())
    first, _ = await ask(one, [QUESTION])
    history = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT]

    gate = Gate(2)
    upstream.push(gate.held(completion("It is 18 C.")), gate.held(completion("It is 18 C.")))
    upstream.received.clear()
    on_one = asyncio.create_task(ask(one, history))
    await upstream.received.wait()  # its turn has begun: joined, its input submitted
    await one.flush()  # ...and committed
    on_two = await ask(two, history)
    results = [await on_one, on_two]
    ids = {conversation_id for conversation_id, _ in results}
    assert len(ids) == 2 and first in ids
    await one.flush()
    await two.flush()
    for conversation_id in ids:
        messages = await one.messages(conversation_id)
        check_alternation(messages)
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


@pytest.mark.parametrize("new", [True, False], ids=["a new id", "an existing one"])
async def test_two_at_once_naming_one_conversation_each_get_a_place(
    gw: GatewayUnderTest, upstream: FakeUpstream, new: bool
) -> None:
    """The same with `X-Conversation-Id`: the second branches, and says so in its header."""
    named = {"X-Conversation-Id": "session-7"}
    history = [QUESTION]
    if not new:
        upstream.push(tool_call())
        client = gw.client(default_headers=named)
        await client.chat.completions.create(model="fake", messages=history, tools=[TOOL])
        history = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT]
    gate = Gate(2)
    upstream.push(gate.held(completion("It is 18 C.")), gate.held(completion("It is 18 C.")))

    async def ask_named() -> str:
        client = gw.client(default_headers=named)
        raw = await client.chat.completions.with_raw_response.create(
            model="fake", messages=history, tools=[TOOL]
        )
        return raw.headers["X-Conversation-Id"]

    ids = set(await asyncio.gather(ask_named(), ask_named()))
    assert len(ids) == 2 and "session-7" in ids
    (other,) = ids - {"session-7"}
    branch = await gw.gateway.store.get_conversation(other)
    assert branch is not None and branch.parent_id == "session-7"
    await gw.flush()
    for conversation_id in ids:
        messages = await gw.messages(conversation_id)
        check_alternation(messages)
        assert [m["role"] for m in messages] == [m["role"] for m in history] + ["assistant"]


async def test_a_turn_begun_and_ended_while_the_history_is_read_is_not_continued_unseen(
    gw: GatewayUnderTest, upstream: FakeUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worst case of two at once naming one conversation: the second reads its path, and
    the first then starts and ends whole before the second goes on. What the second read
    misses the first's turn: it branches where it read, never continuing after that turn."""
    named = {"X-Conversation-Id": "session-8"}
    client = gw.client(default_headers=named)
    upstream.push(completion("Hello."), completion("One."), completion("Two."))
    hello = [QUESTION, {"role": "assistant", "content": "Hello."}]
    await client.chat.completions.create(model="fake", messages=[QUESTION])
    read_path = service.history_path
    others: list[str] = []

    async def read_then_let_the_other_run(*args: Any, **kwargs: Any) -> Any:
        path = await read_path(*args, **kwargs)
        if not others:  # the second request's read: the first runs whole meanwhile
            others.append("running")
            raw = await client.chat.completions.with_raw_response.create(
                model="fake", messages=[*hello, {"role": "user", "content": "First?"}]
            )
            others[0] = raw.headers["X-Conversation-Id"]
        return path

    monkeypatch.setattr(service, "history_path", read_then_let_the_other_run)
    raw = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[*hello, {"role": "user", "content": "Second?"}]
    )
    second = raw.headers["X-Conversation-Id"]
    assert others == ["session-8"] and second != "session-8"
    await gw.flush()
    for conversation_id, question in (("session-8", "First?"), (second, "Second?")):
        messages = await gw.messages(conversation_id)
        check_alternation(messages)
        assert [m.get("content") for m in messages[:3]] == [QUESTION["content"], "Hello.", question]
        assert len(messages) == 4


async def test_a_langchain_batch_of_one_history_each_get_a_place(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """`ChatOpenAI.abatch([x, x])`, the call under LangGraph's `agent.batch`: the two requests
    carry one history with the same tool call id and result."""
    upstream.push(tool_call())
    first, _ = await ask(gw, [QUESTION])
    llm = ChatOpenAI(
        model="fake", base_url=gw.url + "/v1", api_key="test-key", max_retries=0, timeout=10
    ).bind_tools([TOOL])
    call = {"id": "call_0", "name": "weather", "args": {"city": "Paris"}}
    history = [
        HumanMessage(QUESTION["content"]),
        AIMessage("", tool_calls=[call]),
        ToolMessage("18 C", tool_call_id="call_0"),
    ]
    gate = Gate(2)
    upstream.push(gate.held(completion("It is 18 C.")), gate.held(completion("It is 18 C.")))
    answers = await llm.abatch([history, history])
    assert [a.content for a in answers] == ["It is 18 C.", "It is 18 C."]
    await gw.flush()
    status, listed = await gw.get("/v1/conversations?limit=10")
    assert status == 200, listed
    ids = {c["id"] for c in listed["data"]}
    assert len(ids) == 2 and first in ids
    for conversation_id in ids:
        messages = await gw.messages(conversation_id)
        check_alternation(messages)
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]


async def test_replicas_at_the_same_moment_let_one_continue(
    make_gateway: MakeGateway, upstream: FakeUpstream, pg_url: str
) -> None:
    """The two requests reach two replicas at once: the first's start is not committed yet
    (its replica's writer is held here), so the second cannot see its turn; the turn they both
    continue is claimed in the database, once, and the second branches."""
    one = await make_gateway(upstream=upstream, store={"url": pg_url})
    two = await make_gateway(upstream=upstream, store={"url": pg_url})
    upstream.push(tool_call())
    first, _ = await ask(one, [QUESTION])
    await one.flush()
    history = [QUESTION, {"role": "assistant", "content": None, "tool_calls": [CALL]}, RESULT]

    backend = one.gateway.store.backend
    apply, writes_held = backend.apply, asyncio.Event()

    async def held_apply(writes: Any) -> None:
        await writes_held.wait()
        await apply(writes)

    backend.apply = held_apply  # type: ignore[method-assign]
    gate = Gate(2)
    upstream.push(gate.held(completion("It is 18 C.")), gate.held(completion("It is 18 C.")))
    upstream.received.clear()
    on_one = asyncio.create_task(ask(one, history))
    await upstream.received.wait()  # its turn has begun, nothing of it committed
    on_two = await ask(two, history)
    writes_held.set()
    results = [await on_one, on_two]
    ids = {conversation_id for conversation_id, _ in results}
    assert len(ids) == 2 and first in ids
    await one.flush()
    for conversation_id in ids:
        messages = await one.messages(conversation_id)
        check_alternation(messages)
        assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
