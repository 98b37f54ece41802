"""`item_reference` input items on POST /v1/responses: ids the gateway issued, read back from the
store for the key's team, recorded as if the items had been sent inline.

The Vercel AI SDK's Responses provider sends every earlier output item this way while `store`
is on (its default), with the rest of the history inline and no `previous_response_id`.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import openai
import pytest

from gateway.conversations.item_refs import resolve_items
from gateway.metering.keys import Principal
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, completion

TEXT = "The capital of the UK is London."
MASTER = "sk-master-item-refs"

Json = dict[str, Any]


async def create(
    gw: GatewayUnderTest, body: Json, key: str = "test-key", headers: dict[str, str] | None = None
) -> tuple[int, Json, str | None]:
    """POST /v1/responses: status, body, and the conversation the turn went in."""
    sent = {"Authorization": f"Bearer {key}", **(headers or {})}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/responses", json=body, headers=sent) as response,
    ):
        raw = await response.read()
        answer = json.loads(raw) if not body.get("stream") else _final(raw)
        return response.status, answer, response.headers.get("X-Conversation-Id")


def _final(raw: bytes) -> Json:
    """The Response of a streamed answer's terminal event."""
    for frame in raw.split(b"\n\n"):
        for line in frame.split(b"\n"):
            if line.startswith(b"data: "):
                event = json.loads(line[6:])
                if event["type"] in ("response.completed", "response.incomplete"):
                    return event["response"]  # type: ignore[no-any-return]
    raise AssertionError(raw)


def ref(item_id: str) -> Json:
    return {"type": "item_reference", "id": item_id}


def user(text: str) -> Json:
    return {"role": "user", "content": text}


def inline(item: Json) -> Json:
    """An output item as a client sends it back inline."""
    return {k: v for k, v in item.items() if k not in ("id", "status")}


async def turn_inputs(gw: GatewayUnderTest, conversation_id: str) -> list[tuple[str, Json]]:
    """The input events of the conversation's last turn, as (type, payload)."""
    status, body = await gw.get(f"/v1/conversations/{conversation_id}/events")
    assert status == 200, body
    last = body["data"][-1]["turn_id"]
    return [
        (e["type"], e["payload"])
        for e in body["data"]
        if e["turn_id"] == last
        and (e["type"] in ("user/message", "tool/result") or e["payload"].get("source") == "client")
    ]


async def test_a_second_turn_of_references_continues_as_if_sent_inline(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    # The same two turns twice, by two users (so each continues its own conversation): once
    # sending the first answer back by reference, as the Vercel AI SDK does, once inline.
    first: dict[str, Json] = {}
    for who in ("by-ref", "inline"):
        upstream.reasoning_then_text(["Think", "ing."], ["The capital ", "of the UK is London."])
        status, first[who], _ = await create(
            gw, {"model": "fake", "input": "Capital of the UK?", "stream": True, "user": who}
        )
        assert status == 200, first[who]
    output = first["by-ref"]["output"]
    assert [i["type"] for i in output] == ["reasoning", "message"]

    upstream.push(completion("Paris."), completion("Paris."))
    question, follow = user("Capital of the UK?"), user("And of France?")
    by_ref = [question, *(ref(i["id"]) for i in output), follow]
    status, second, by_ref_conversation = await create(
        gw, {"model": "fake", "input": by_ref, "user": "by-ref"}
    )
    assert status == 200, second
    assert second["output"][0]["content"][0]["text"] == "Paris."
    sent_inline = [question, *(inline(i) for i in first["inline"]["output"]), follow]
    status, _, inline_conversation = await create(
        gw, {"model": "fake", "input": sent_inline, "user": "inline"}
    )
    assert status == 200

    # The upstream got the history with the referenced items in place...
    by_ref_messages, inline_messages = (r["messages"] for r in upstream.requests[2:4])
    assert by_ref_messages == [
        {"role": "user", "content": "Capital of the UK?"},
        {"role": "assistant", "content": TEXT, "reasoning_content": "Thinking."},
        {"role": "user", "content": "And of France?"},
    ]
    assert by_ref_messages == inline_messages
    # ...and the turn recorded exactly what the inline one did.
    assert by_ref_conversation and inline_conversation
    assert by_ref_conversation != inline_conversation
    recorded = await turn_inputs(gw, by_ref_conversation)
    assert recorded[-1] == ("user/message", {"content": "And of France?"})
    assert recorded == await turn_inputs(gw, inline_conversation)
    assert await gw.messages(by_ref_conversation) == await gw.messages(inline_conversation)


async def test_a_function_call_and_its_output_round(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.tool_call("call_w1", "weather", ['{"city"', ': "Paris"}'])
    tools = [{"type": "function", "name": "weather", "parameters": {"type": "object"}}]
    question = user("Weather in Paris?")
    status, first, _ = await create(
        gw, {"model": "fake", "input": [question], "tools": tools, "stream": True}
    )
    assert status == 200, first
    (call,) = first["output"]
    assert (call["type"], call["call_id"]) == ("function_call", "call_w1")

    upstream.push(completion("It is 18C in Paris."))
    result = {"type": "function_call_output", "call_id": "call_w1", "output": "18C"}
    status, second, again = await create(
        gw, {"model": "fake", "input": [question, ref(call["id"]), result], "tools": tools}
    )
    assert status == 200, second
    assert second["output"][0]["content"][0]["text"] == "It is 18C in Paris."
    tool_call = {
        "id": "call_w1",
        "type": "function",
        "function": {"name": "weather", "arguments": '{"city": "Paris"}'},
    }
    assert upstream.requests[1]["messages"] == [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "call_w1", "content": "18C"},
    ]
    assert again is not None
    recorded = await turn_inputs(gw, again)
    assert ("tool/result", {"tool_call_id": "call_w1", "content": "18C"}) in [
        (kind, {k: payload[k] for k in ("tool_call_id", "content") if k in payload})
        for kind, payload in recorded
    ]

    # The function call output is an item of the conversation now (`fco_<seq>`): a request
    # naming that conversation can reference it, and the call it answers, by those ids.
    status, items = await gw.get(f"/v1/conversations/{again}/items")
    assert status == 200, items
    by_type = {i["type"]: i["id"] for i in items["data"]}
    upstream.push(completion("Noted."))
    status, third, _ = await create(
        gw,
        {
            "model": "fake",
            "input": [ref(by_type["function_call"]), ref(by_type["function_call_output"])],
            "tools": tools,
        },
        headers={"X-Conversation-Id": again},
    )
    assert status == 200, third
    assert upstream.requests[2]["messages"][-2:] == [
        {"role": "assistant", "content": None, "tool_calls": [tool_call]},
        {"role": "tool", "tool_call_id": "call_w1", "content": "18C"},
    ]


async def test_references_through_the_openai_sdk(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    api = gw.client()
    upstream.push(completion(TEXT), completion("Paris."))
    first = await api.responses.create(model="fake", input="Capital of the UK?")
    second = await api.responses.create(
        model="fake",
        input=[
            {"role": "user", "content": "Capital of the UK?"},
            {"type": "item_reference", "id": first.output[0].id},
            {"role": "user", "content": "And of France?"},
        ],
    )
    assert second.output_text == "Paris."
    assert upstream.requests[1]["messages"][1] == {"role": "assistant", "content": TEXT}
    # Stream and read-back name the item alike: a retrieved response's ids resolve too.
    stored = await api.responses.retrieve(first.id)
    assert [i.id for i in stored.output] == [i.id for i in first.output]


async def test_conversation_item_ids_resolve_in_the_named_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    api = gw.client()
    conversation = await api.conversations.create(
        items=[{"type": "message", "role": "user", "content": "Remember: blue."}]
    )
    items = await api.conversations.items.list(conversation.id)
    (remembered,) = [i.id for i in items.data]
    upstream.push(completion("Blue."), completion("Blue again."))
    answer = await api.responses.create(
        model="fake",
        conversation=conversation.id,
        input=[ref(remembered)],  # type: ignore[list-item]
    )
    assert answer.output_text == "Blue."
    assert upstream.requests[0]["messages"] == [
        {"role": "user", "content": "Remember: blue."},
        {"role": "user", "content": "Remember: blue."},
    ]
    # previous_response_id names the conversation as well.
    again = await api.responses.create(
        model="fake",
        previous_response_id=answer.id,
        input=[ref(remembered)],  # type: ignore[list-item]
    )
    assert again.output_text == "Blue again."
    assert upstream.requests[1]["messages"][-1] == {"role": "user", "content": "Remember: blue."}


@pytest.fixture
async def teams(make_gateway: MakeGateway, upstream: FakeUpstream) -> tuple[GatewayUnderTest, Json]:
    gw = await make_gateway(upstream=upstream, auth={"master_key": MASTER})
    keys: Json = {}
    async with aiohttp.ClientSession() as session:
        admin = {"Authorization": f"Bearer {MASTER}"}
        for team in ("alpha", "beta"):
            async with session.post(
                gw.url + "/v1/gateway/teams", json={"id": team, "name": team}, headers=admin
            ) as response:
                assert response.status == 201, await response.text()
            async with session.post(
                gw.url + "/v1/gateway/keys", json={"team_id": team}, headers=admin
            ) as response:
                assert response.status == 201, await response.text()
                keys[team] = (await response.json())["key"]
    return gw, keys


async def recorded(gw: GatewayUnderTest) -> tuple[Any, ...]:
    await gw.flush()
    return (
        gw.query("SELECT count(*) FROM events"),
        gw.query("SELECT count(*) FROM turns"),
        gw.query("SELECT count(*) FROM conversations"),
        gw.query("SELECT count(*) FROM responses"),
    )


async def test_unknown_and_foreign_ids_answer_400_naming_them_and_record_nothing(
    teams: tuple[GatewayUnderTest, Json], upstream: FakeUpstream
) -> None:
    gw, keys = teams
    upstream.push(completion(TEXT), completion(TEXT))
    status, alphas, alpha_conversation = await create(
        gw, {"model": "fake", "input": "Capital of the UK?"}, keys["alpha"]
    )
    assert status == 200, alphas
    status, unstored, _ = await create(
        gw, {"model": "fake", "input": "Not kept.", "store": False}, keys["alpha"]
    )
    assert status == 200, unstored
    item_id = alphas["output"][0]["id"]
    response_hex = alphas["id"].removeprefix("resp_")
    before, calls = await recorded(gw), len(upstream.requests)

    cases = [
        (keys["beta"], item_id, {}),  # another team's item
        (keys["alpha"], unstored["output"][0]["id"], {}),  # a response made with store: false
        (keys["alpha"], f"msg_{response_hex}_7", {}),  # no such position
        (keys["alpha"], f"msg_{'0' * 32}_0", {}),  # no such response
        (keys["alpha"], "msg_made_up", {}),  # not an id the gateway makes
        (keys["alpha"], "msg_1", {}),  # a conversation item id, and no conversation named
        (keys["beta"], "msg_1", {"X-Conversation-Id": alpha_conversation}),  # not beta's
    ]
    for key, bad, headers in cases:
        body = {"model": "fake", "input": [user("Capital of the UK?"), ref(bad), user("More?")]}
        status, answer, _ = await create(gw, body, key, headers)
        assert status == 400, (bad, answer)
        assert answer["error"]["param"] == "input[1].id", answer
        assert f"'{bad}'" in answer["error"]["message"], answer
        assert answer["error"]["code"] == "item_not_found"

    status, answer, _ = await create(
        gw, {"model": "fake", "input": [{"type": "item_reference"}]}, keys["alpha"]
    )
    assert (status, answer["error"]["param"]) == (400, "input[0].id")

    assert await recorded(gw) == before
    assert len(upstream.requests) == calls
    # The owner's own reference works.
    upstream.push(completion("More."))
    body = {"model": "fake", "input": [user("Capital of the UK?"), ref(item_id), user("More?")]}
    status, answer, _ = await create(gw, body, keys["alpha"])
    assert status == 200, answer


async def test_the_openai_sdk_raises_bad_request_for_an_unknown_reference(
    gw: GatewayUnderTest,
) -> None:
    with pytest.raises(openai.BadRequestError, match="msg_nothing"):
        await gw.client().responses.create(
            model="fake", input=[{"type": "item_reference", "id": "msg_nothing"}]
        )


async def test_conversation_items_added_by_reference(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """`resolve_items` for POST /v1/conversations/{id}/items: references become the items
    they name (seq ids in that conversation), unknown ones a 400 naming them."""
    upstream.push(completion(TEXT))
    status, first, conversation = await create(gw, {"model": "fake", "input": "Capital?"})
    assert status == 200 and conversation is not None
    status, items = await gw.get(f"/v1/conversations/{conversation}/items")
    question = next(i for i in items["data"] if i["role"] == "user")
    principal = Principal("open")
    resolved = await resolve_items(
        gw.gateway.store,
        gw.gateway.conversations,
        principal,
        conversation,
        [ref(first["output"][0]["id"]), ref(question["id"]), user("Thanks.")],
    )
    assert [(i.get("type"), i.get("role")) for i in resolved] == [
        ("message", "assistant"),
        ("message", "user"),
        (None, "user"),
    ]
    assert resolved[0]["content"][0]["text"] == TEXT
    from gateway.errors import InvalidRequest

    with pytest.raises(InvalidRequest) as caught:
        await resolve_items(
            gw.gateway.store,
            gw.gateway.conversations,
            principal,
            conversation,
            [user("x"), ref("fco_999")],
        )
    assert caught.value.param == "items[1].id"


async def test_the_conversations_api_takes_item_references(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """POST /v1/conversations and .../items resolve references like /v1/responses does."""
    api = gw.client()
    upstream.push(completion(TEXT))
    answered = await api.responses.create(model="fake", input="Capital of the UK?", store=True)
    message_id = answered.output[0].id
    made = await api.conversations.create(items=[user("Tell me"), ref(message_id)])  # type: ignore[list-item]
    listed = await api.conversations.items.list(made.id)
    assert [getattr(i, "role", None) for i in listed.data] == ["user", "assistant"]
    await api.conversations.items.create(made.id, items=[ref(message_id)])  # type: ignore[list-item]
    messages = await gw.messages(made.id)
    assert [m["content"] for m in messages] == ["Tell me", TEXT, TEXT]
    with pytest.raises(openai.BadRequestError):
        await api.conversations.items.create(made.id, items=[ref("msg_nope")])  # type: ignore[list-item]
    assert len(await gw.messages(made.id)) == 3
