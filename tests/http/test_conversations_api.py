"""Joining, reading and branching conversations; next-request consistency after a cancel."""

from __future__ import annotations

import asyncio

import aiohttp

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, completion, frames, replay

FIRST = {"role": "user", "content": "Give me three tips."}
PREFIX = ["1. Sleep well.\n", "2. Drink water", ".\n3. Wal"]


async def _cancelled_turn(gw: GatewayUnderTest, upstream: FakeUpstream) -> str:
    upstream.push(frames(*(chunk(p) for p in PREFIX), then="stall"))
    response = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[FIRST], stream=True
    )
    stream = response.parse()
    seen = 0
    async for _ in stream:
        seen += 1
        if seen == len(PREFIX):
            break
    await stream.close()
    conversation_id = response.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    return conversation_id


async def test_after_a_cancel_the_derived_history_holds_the_prefix(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id = await _cancelled_turn(gw, upstream)
    status, body = await gw.get(f"/v1/conversations/{conversation_id}/messages")
    assert status == 200
    assert body["object"] == "list"
    assert body["data"] == [FIRST, {"role": "assistant", "content": "".join(PREFIX)}]


async def test_follow_up_with_the_conversation_id_records_only_new_messages(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id = await _cancelled_turn(gw, upstream)
    history = [
        FIRST,
        {"role": "assistant", "content": "".join(PREFIX)},
        {"role": "user", "content": "Expand on point two."},
    ]
    upstream.push(replay("openai-chat-text-usage.sse"))
    client = gw.client(default_headers={"X-Conversation-Id": conversation_id})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "system", "content": "Be brief."}, *history], stream=True
    )
    async for _ in response.parse():
        pass
    assert response.headers["X-Conversation-Id"] == conversation_id  # joined, not branched
    # The upstream got exactly the history the client sent, interrupted prefix included.
    assert upstream.requests[-1]["messages"] == [
        {"role": "system", "content": "Be brief."},
        *history,
    ]
    events = await gw.wait_turn_end(conversation_id, count=2)
    second_turn = [e for e in events if e["turn_id"] == events[-1]["turn_id"]]
    assert [e["type"] for e in second_turn] == ["user/message", "assistant/message", "turn/end"]
    assert second_turn[0]["payload"]["content"] == "Expand on point two."
    _, body = await gw.get(f"/v1/conversations/{conversation_id}/messages")
    assert body["data"][:3] == history
    assert body["data"][3] == {"role": "assistant", "content": "The capital of the UK is London."}


async def test_a_diverging_history_starts_a_branch(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id = await _cancelled_turn(gw, upstream)
    # The client dropped the interrupted answer and asked something else.
    edited = [
        FIRST,
        {"role": "assistant", "content": "Something else entirely."},
        {"role": "user", "content": "Why?"},
    ]
    upstream.push(replay("openai-chat-text-usage.sse"))
    client = gw.client(default_headers={"X-Conversation-Id": conversation_id})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=edited, stream=True
    )
    async for _ in response.parse():
        pass
    branch_id = response.headers["X-Conversation-Id"]
    assert branch_id != conversation_id
    await gw.wait_turn_end(branch_id)
    _, body = await gw.get(f"/v1/conversations/{branch_id}/messages")
    assert body["data"] == [
        *edited,
        {"role": "assistant", "content": "The capital of the UK is London."},
    ]
    # The original is untouched.
    _, body = await gw.get(f"/v1/conversations/{conversation_id}/messages")
    assert body["data"] == [FIRST, {"role": "assistant", "content": "".join(PREFIX)}]


async def test_branch_at_the_cancelled_turn_keeps_the_prefix(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id = await _cancelled_turn(gw, upstream)
    status, events = await gw.get(f"/v1/conversations/{conversation_id}/events")
    assert status == 200
    assert [e["type"] for e in events["data"]] == ["user/message", "assistant/message", "turn/end"]
    assert set(events["data"][0]) >= {"seq", "turn_id", "type", "created_at", "payload"}
    turn_end_seq = events["data"][-1]["seq"]

    status, created = await gw.post(
        f"/v1/conversations/{conversation_id}/branches", {"at_seq": turn_end_seq}
    )
    assert status == 201
    branch_id = created["id"]
    status, body = await gw.get(f"/v1/conversations/{branch_id}/messages")
    assert body["data"] == [FIRST, {"role": "assistant", "content": "".join(PREFIX)}]

    # Continue the branch: only the new message is recorded there, after the branch point.
    upstream.push(completion("Sure."))
    client = gw.client(default_headers={"X-Conversation-Id": branch_id})
    await client.chat.completions.create(
        model="fake", messages=[*body["data"], {"role": "user", "content": "More."}]
    )
    own = await gw.wait_turn_end(branch_id)
    assert [e["type"] for e in own] == ["user/message", "assistant/message", "turn/end"]
    assert own[0]["seq"] == turn_end_seq + 1

    # A branch at the user message drops the answer.
    status, created = await gw.post(f"/v1/conversations/{conversation_id}/branches", {"at_seq": 1})
    status, body = await gw.get(f"/v1/conversations/{created['id']}/messages")
    assert body["data"] == [FIRST]


async def test_branch_inside_an_unfinished_turn_is_409(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(chunk("Still "), then="stall"))
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[FIRST], stream=True
    )
    stream = response.parse()
    async for _ in stream:
        break
    conversation_id = response.headers["X-Conversation-Id"]
    status, body = await gw.post(f"/v1/conversations/{conversation_id}/branches", {"at_seq": 1})
    assert status == 409
    assert body["error"]["code"] == "turn_in_progress"
    await stream.close()
    await gw.wait_turn_end(conversation_id)
    status, body = await gw.post(f"/v1/conversations/{conversation_id}/branches", {"at_seq": 1})
    assert status == 201


async def test_unknown_conversation_is_404(gw: GatewayUnderTest) -> None:
    for path in ("/v1/conversations/nope/events", "/v1/conversations/nope/messages"):
        status, body = await gw.get(path)
        assert status == 404
        assert body["error"]["type"] == "invalid_request_error"
    status, body = await gw.post("/v1/conversations/nope/branches", {"at_seq": 0})
    assert status == 404


async def test_bad_branch_requests_are_400(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    conversation_id = await _cancelled_turn(gw, upstream)
    for body in ({}, {"at_seq": -1}, {"at_seq": "2"}, {"at_seq": 99}):
        status, answer = await gw.post(f"/v1/conversations/{conversation_id}/branches", body)
        assert status == 400, body
        assert answer["error"]["param"] == "at_seq"


async def test_new_conversation_id_from_the_client_is_created(gw: GatewayUnderTest) -> None:
    client = gw.client(default_headers={"X-Conversation-Id": "my-chat-1"})
    response = await client.chat.completions.with_raw_response.create(
        model="demo", messages=[FIRST]
    )
    assert response.headers["X-Conversation-Id"] == "my-chat-1"
    events = await gw.wait_turn_end("my-chat-1")
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]


async def test_invalid_conversation_id_is_400(gw: GatewayUnderTest) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + "/v1/chat/completions",
            json={"model": "demo", "messages": [FIRST]},
            headers={"X-Conversation-Id": "bad id with spaces"},
        ) as response,
    ):
        assert response.status == 400
        assert (await response.json())["error"]["param"] == "X-Conversation-Id"


async def test_concurrent_turns_get_distinct_increasing_seqs(gw: GatewayUnderTest) -> None:
    client = gw.client(default_headers={"X-Conversation-Id": "busy"})
    responses = await asyncio.gather(
        *(
            client.chat.completions.with_raw_response.create(model="demo", messages=[FIRST])
            for _ in range(5)
        )
    )
    # Each joins "busy" or, when another turn's answer landed first, branches from it (the
    # request no longer continues the stored history): every turn is recorded exactly once.
    ids = [r.headers["X-Conversation-Id"] for r in responses]
    assert "busy" in ids
    for conversation_id in set(ids):
        events = await gw.wait_turn_end(conversation_id, count=ids.count(conversation_id))
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))
        assert sum(e["type"] == "turn/end" for e in events) == ids.count(conversation_id)


async def test_history_repair_sends_the_dropped_prefix_upstream(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id = await _cancelled_turn(gw, upstream)
    # A chat UI that dropped the partial answer when the user pressed Stop.
    follow_up = [FIRST, {"role": "user", "content": "Go on."}]
    upstream.push(completion("Walk daily."))
    client = gw.client(default_headers={"X-Conversation-Id": conversation_id})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=follow_up
    )
    assert response.headers["X-Gateway-History-Repaired"] == "1"
    assert response.headers["X-Conversation-Id"] == conversation_id
    prefix = {"role": "assistant", "content": "".join(PREFIX)}
    assert upstream.requests[-1]["messages"] == [FIRST, prefix, follow_up[1]]
    events = await gw.wait_turn_end(conversation_id, count=2)
    assert [e["type"] for e in events[3:]] == ["user/message", "assistant/message", "turn/end"]
    assert await gw.messages(conversation_id) == [
        FIRST,
        prefix,
        follow_up[1],
        {"role": "assistant", "content": "Walk daily."},
    ]


async def test_history_repair_can_be_turned_off(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(
        models=[
            {"name": "fake", "deployments": [{"provider": "openai", "api_base": upstream.url}]}
        ],
        conversations={"repair_interrupted": False},
    )
    conversation_id = await _cancelled_turn(gw, upstream)
    upstream.push(completion("Walk daily."))
    client = gw.client(default_headers={"X-Conversation-Id": conversation_id})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[FIRST, {"role": "user", "content": "Go on."}]
    )
    assert "X-Gateway-History-Repaired" not in response.headers
    assert response.headers["X-Conversation-Id"] != conversation_id  # a branch, as before


async def test_a_tool_round_resent_re_serialised_continues_the_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """A client that parses the tool call's arguments and sends them back with json.dumps
    (LangChain does) continues the conversation it names instead of branching it."""
    question = {"role": "user", "content": "Weather in Paris?"}
    upstream.tool_call("call_1", "weather", ['{"city":', '"Paris"}'])
    first = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[question], stream=True
    )
    conversation_id = first.headers["X-Conversation-Id"]
    call_id, arguments = "", ""
    async for part in first.parse():
        for delta in (part.choices[0].delta.tool_calls or []) if part.choices else []:
            call_id = delta.id or call_id
            arguments += (delta.function.arguments or "") if delta.function else ""
    assert (call_id, arguments) == ("call_1", '{"city":"Paris"}')
    await gw.wait_turn_end(conversation_id)
    upstream.push(completion("18 C and sunny."))
    resent = {
        "id": call_id,
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
    }
    second = await gw.client(
        default_headers={"X-Conversation-Id": conversation_id}
    ).chat.completions.with_raw_response.create(
        model="fake",
        messages=[
            question,
            {"role": "assistant", "content": None, "tool_calls": [resent]},
            {"role": "tool", "tool_call_id": call_id, "content": "18 C"},
        ],
    )
    assert second.headers["X-Conversation-Id"] == conversation_id  # not a branch
    events = await gw.wait_turn_end(conversation_id, count=2)
    kinds = [e["type"] for e in events if e["type"] != "turn/end"]
    assert kinds == ["user/message", "assistant/message", "tool/result", "assistant/message"]


async def test_a_turn_that_ended_in_tool_calls_shows_them_pending_not_aborted(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    question = {"role": "user", "content": "Weather in Paris?"}
    upstream.tool_call("call_1", "weather", ['{"city":"Paris"}'])
    response = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[question], stream=True
    )
    conversation_id = response.headers["X-Conversation-Id"]
    async for _ in response.parse():
        pass
    events = await gw.wait_turn_end(conversation_id)
    assert events[-1]["payload"]["status"] == "completed"
    status, body = await gw.get(f"/v1/conversations/{conversation_id}/messages")
    assert status == 200
    assert [m["role"] for m in body["data"]] == ["user", "assistant"]
    assert body["data"][1]["tool_calls"][0]["id"] == "call_1"
    # The next turn answers with a new question instead: now the call was never answered.
    upstream.push(completion("Fine."))
    followup = [question, body["data"][1], {"role": "user", "content": "Skip that."}]
    await gw.client(default_headers={"X-Conversation-Id": conversation_id}).chat.completions.create(
        model="fake", messages=followup
    )
    await gw.wait_turn_end(conversation_id, count=2)
    status, body = await gw.get(f"/v1/conversations/{conversation_id}/messages")
    roles = [m["role"] for m in body["data"]]
    assert roles == ["user", "assistant", "tool", "user", "assistant"]
    assert "ABORTED_BEFORE_DISPATCH" in body["data"][2]["content"]
