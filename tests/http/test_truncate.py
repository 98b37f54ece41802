"""What the user saw: truncating an interrupted answer to what its client showed.

`POST /v1/conversations/{id}/turns/{turn_id}/truncate` and the `content_chars` of the cancel
endpoints (docs/recording.md, "What the user saw"), on a real server with a real SQLite store.
Counts are Unicode code points: the answers hold emoji and CJK.
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import orjson
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, completion, frames, hang_before_headers
from tests.http.test_auth import MASTER, admin, new_key

QUESTION = {"role": "user", "content": "Three tips, please."}
PARTS = ["Hi 👋 ", "世界! ", "1. 🍎 Eat well. ", "2. 睡觉"]
TEXT = "".join(PARTS)
SHOWN = 9  # "Hi 👋 世界! " and the "1": what the client had rendered when the user stopped it
CUT = TEXT[:SHOWN]


def _truncate_path(conversation_id: str, turn_id: str) -> str:
    return f"/v1/conversations/{conversation_id}/turns/{turn_id}/truncate"


async def _post(
    gw: GatewayUnderTest, path: str, body: Any = None, key: str | None = None, raw: bytes = b""
) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + path,
            data=raw if body is None else None,
            json=body,
            headers=headers,
        ) as response,
    ):
        return response.status, await response.json()


async def _events(gw: GatewayUnderTest, conversation_id: str) -> list[dict[str, Any]]:
    """The conversation's own events as stored."""
    await gw.flush()
    return [e.to_api() for e in await gw.gateway.store.events(conversation_id)]


async def _interrupted(
    gw: GatewayUnderTest, upstream: FakeUpstream, api_key: str = "test-key"
) -> tuple[str, str]:
    """A turn whose client read every part and then left: (conversation id, turn id)."""
    upstream.push(frames(*(chunk(p) for p in PARTS), then="stall"))
    body = {"model": "fake", "messages": [QUESTION], "stream": True}
    headers = {"Authorization": f"Bearer {api_key}"}
    # Raw SSE, not the SDK's stream: leaving an SDK stream mid-way leaves its reader to be
    # finalised by the garbage collector, at whatever moment a later test runs.
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.post(gw.url + "/v1/chat/completions", json=body) as response,
    ):
        seen = ""
        async for line in response.content:
            if line.startswith(b"data: {"):
                seen += orjson.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if seen == TEXT:
                break
    conversation_id = response.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    return conversation_id, response.headers["X-Gateway-Turn-Id"]


async def test_truncate_shortens_the_interrupted_answer(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id, turn_id = await _interrupted(gw, upstream)
    assert await gw.messages(conversation_id) == [
        QUESTION,
        {"role": "assistant", "content": TEXT},
    ]
    before = await _events(gw, conversation_id)
    status, body = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": SHOWN})
    assert status == 200, body
    message_seq = before[1]["seq"]
    assert body == {
        "object": "conversation.turn.truncation",
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "seq": before[-1]["seq"] + 1,
        "message_seq": message_seq,
        "content_chars": SHOWN,
        "delivered_chars": len(TEXT),
        "content": CUT,
    }
    assert await gw.messages(conversation_id) == [QUESTION, {"role": "assistant", "content": CUT}]

    # The log is append-only: the message as delivered stays, the truncate follows the turn's
    # end, in the same turn.
    status, listed = await gw.get(f"/v1/conversations/{conversation_id}/events")
    assert status == 200
    assert listed["data"][:-1] == before
    truncate = listed["data"][-1]
    assert (truncate["type"], truncate["turn_id"], truncate["seq"]) == (
        "assistant/truncate",
        turn_id,
        body["seq"],
    )
    assert truncate["payload"] == {"message_seq": message_seq, "content_chars": SHOWN}

    # The Conversations API's items show it too, still incomplete.
    status, items = await gw.get(f"/v1/conversations/{conversation_id}/items")
    assert status == 200
    assistant = items["data"][-1]
    assert (assistant["role"], assistant["status"]) == ("assistant", "incomplete")
    assert [c["text"] for c in assistant["content"]] == [CUT]

    # The same count again changes nothing and answers the same; a shorter one shortens more.
    assert await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": SHOWN}) == (
        200,
        body,
    )
    assert len(await _events(gw, conversation_id)) == len(before) + 1
    status, shorter = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": 4})
    assert (status, shorter["content"], shorter["seq"]) == (200, "Hi 👋", body["seq"] + 1)
    assert (await gw.messages(conversation_id))[-1]["content"] == "Hi 👋"


async def test_bad_truncates_answer_4xx_and_change_nothing(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id, turn_id = await _interrupted(gw, upstream)
    path = _truncate_path(conversation_id, turn_id)
    status, _ = await gw.post(path, {"content_chars": SHOWN})
    assert status == 200
    before = await _events(gw, conversation_id)
    cases: list[tuple[Any, int, str]] = [
        ({"content_chars": -1}, 400, "invalid_request"),
        ({"content_chars": True}, 400, "invalid_request"),
        ({"content_chars": 3.0}, 400, "invalid_request"),
        ({"content_chars": "3"}, 400, "invalid_request"),
        ({"content_chars": None}, 400, "invalid_request"),
        ({}, 400, "invalid_request"),
        ([3], 400, "invalid_request"),
        # Never longer than delivered, nor than an earlier truncate left.
        ({"content_chars": len(TEXT) + 1}, 400, "content_chars_past_delivered"),
        ({"content_chars": SHOWN + 1}, 400, "truncate_would_lengthen"),
    ]
    for request, expected, code in cases:
        status, body = await gw.post(path, request)
        assert (status, body["error"]["code"]) == (expected, code), request
        if expected == 400 and isinstance(request, dict):
            assert body["error"]["param"] == "content_chars"
    status, body = await _post(gw, path, raw=b"not json")
    assert status == 400
    assert await _events(gw, conversation_id) == before
    assert (await gw.messages(conversation_id))[-1]["content"] == CUT


async def test_an_answer_that_never_reached_its_client_cannot_be_truncated(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    client = gw.client()
    # Nothing delivered: the client left before the first token.
    upstream.push(hang_before_headers())
    task = asyncio.create_task(
        client.chat.completions.with_raw_response.create(
            model="fake", messages=[QUESTION], stream=True
        )
    )
    await asyncio.wait_for(upstream.stalled.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await gw.flush()
    [(conversation_id, turn_id)] = gw.query("SELECT conversation_id, id FROM turns")
    await gw.wait_turn_end(conversation_id)
    before = await _events(gw, conversation_id)
    status, body = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": 0})
    assert (status, body["error"]["code"]) == (409, "turn_not_interrupted"), body
    assert await _events(gw, conversation_id) == before


async def test_a_completed_answer_shown_in_part_is_recorded_as_shown(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """The whole answer reached the client's socket (recorded completed), but a slow renderer
    showed only part of it when the user stopped: the truncate makes the record what was
    shown, and the delivered count of its usage follows."""
    upstream.text(PARTS)
    response = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], stream=True
    )
    assert (
        "".join([c.choices[0].delta.content or "" async for c in response.parse() if c.choices])
        == TEXT
    )
    conversation_id = response.headers["X-Conversation-Id"]
    turn_id = response.headers["X-Gateway-Turn-Id"]
    await gw.wait_turn_end(conversation_id)
    [(delivered,)] = gw.query("SELECT completion_delivered FROM usage")
    status, body = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": SHOWN})
    assert status == 200, body
    assert (body["content"], body["delivered_chars"]) == (CUT, len(TEXT))
    assert (await gw.messages(conversation_id))[-1]["content"] == CUT
    status, items = await gw.get(f"/v1/conversations/{conversation_id}/items")
    assert items["data"][-1]["status"] == "incomplete"  # read as stopped where it was shown
    await gw.flush()
    [(shown,)] = gw.query("SELECT completion_delivered FROM usage")
    assert 0 < shown < delivered
    [(total,)] = gw.query(
        "SELECT completion_delivered FROM conversations WHERE id = ?", conversation_id
    )
    assert total == shown
    # The next question that sends back what was shown continues this conversation.
    upstream.push(completion("Sure."))
    follow = await gw.client().chat.completions.with_raw_response.create(
        model="fake",
        messages=[
            QUESTION,
            {"role": "assistant", "content": CUT},
            {"role": "user", "content": "go on"},
        ],
    )
    assert follow.headers["X-Conversation-Id"] == conversation_id


async def test_a_completed_answer_shown_in_part_is_put_back_when_dropped(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """The whole answer reached the client, which showed part of it and, stopped, dropped it
    (as many chat UIs do) and asked again without a conversation id: the truncate made that
    part the record, and history repair puts it back."""
    upstream.text(PARTS)
    response = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], stream=True
    )
    async for _ in response.parse():
        pass
    conversation_id = response.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    turn_id = response.headers["X-Gateway-Turn-Id"]
    status, body = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": SHOWN})
    assert status == 200, body
    follow = {"role": "user", "content": "go on"}
    upstream.push(completion("Sure."))
    again = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION, follow]
    )
    assert again.headers["X-Conversation-Id"] == conversation_id
    assert again.headers["X-Gateway-History-Repaired"] == "1"
    assert upstream.requests[-1]["messages"] == [
        QUESTION,
        {"role": "assistant", "content": CUT},
        follow,
    ]


async def test_a_turn_in_progress_is_409(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(frames(chunk("Still 思考 "), then="stall"))
    response = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], stream=True
    )
    stream = response.parse()
    async for _ in stream:
        break
    conversation_id = response.headers["X-Conversation-Id"]
    path = _truncate_path(conversation_id, response.headers["X-Gateway-Turn-Id"])
    before = await _events(gw, conversation_id)
    status, body = await gw.post(path, {"content_chars": 1})
    assert (status, body["error"]["code"]) == (409, "turn_in_progress")
    assert await _events(gw, conversation_id) == before
    await stream.close()
    await gw.wait_turn_end(conversation_id)
    status, body = await gw.post(path, {"content_chars": 1})
    assert (status, body["content"]) == (200, "S")


async def test_unknown_ids_and_other_teams_turns_are_404_alike(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(upstream=upstream, auth={"master_key": MASTER})
    for team in ("red", "blue"):
        status, _ = await admin(gw, "POST", "/v1/gateway/teams", {"id": team, "name": team})
        assert status == 201
    red, blue = (await new_key(gw, "red"))["key"], (await new_key(gw, "blue"))["key"]
    conversation_id, turn_id = await _interrupted(gw, upstream, red)
    blue_conversation, _ = await _interrupted(gw, upstream, blue)
    before = await _events(gw, conversation_id)
    chars = {"content_chars": 1}

    # Red's conversation, asked by blue: as if it did not exist.
    status, theirs = await _post(gw, _truncate_path(conversation_id, turn_id), chars, blue)
    status_unknown, unknown = await _post(gw, _truncate_path("conv_nope", turn_id), chars, blue)
    assert status == status_unknown == 404
    assert theirs["error"] == {
        **unknown["error"],
        "message": unknown["error"]["message"].replace("conv_nope", conversation_id),
    }
    # Red's turn in blue's own conversation: as an unknown turn.
    status, theirs = await _post(gw, _truncate_path(blue_conversation, turn_id), chars, blue)
    status_unknown, unknown = await _post(
        gw, _truncate_path(blue_conversation, "turn_nope"), chars, blue
    )
    assert status == status_unknown == 404
    assert theirs["error"] == {
        **unknown["error"],
        "message": unknown["error"]["message"].replace("turn_nope", turn_id),
    }
    assert await _events(gw, conversation_id) == before
    # Red may.
    status, body = await _post(gw, _truncate_path(conversation_id, turn_id), chars, red)
    assert (status, body["content"]) == (200, "H")


async def test_branches_see_the_truncated_text(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id, turn_id = await _interrupted(gw, upstream)
    turn_end = (await _events(gw, conversation_id))[-1]["seq"]
    # Made before the truncate, at the answer: the truncate (a later seq) still applies.
    status, before = await gw.post(
        f"/v1/conversations/{conversation_id}/branches", {"at_seq": turn_end - 1}
    )
    assert status == 201
    status, body = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": SHOWN})
    assert status == 200
    shown = [QUESTION, {"role": "assistant", "content": CUT}]
    assert await gw.messages(before["id"]) == shown
    # Made after it, at the turn's end and at the truncate itself (the log's last event).
    for at_seq in (turn_end, body["seq"]):
        status, after = await gw.post(
            f"/v1/conversations/{conversation_id}/branches", {"at_seq": at_seq}
        )
        assert status == 201, after
        assert await gw.messages(after["id"]) == shown
    # A request that goes on differently after the answer branches at it, and the branch sees
    # the shown text.
    client = gw.client(default_headers={"X-Conversation-Id": conversation_id})
    upstream.push(completion("Sure."))
    await client.chat.completions.create(model="fake", messages=[*shown, _user("A?")])
    upstream.push(completion("Sure."))
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[*shown, _user("B?")]
    )
    branch_id = response.headers["X-Conversation-Id"]
    assert branch_id != conversation_id
    await gw.wait_turn_end(branch_id)
    assert gw.query("SELECT parent_seq FROM conversations WHERE id = ?", branch_id) == [
        (turn_end - 1,)
    ]
    assert await gw.messages(branch_id) == [
        *shown,
        _user("B?"),
        {"role": "assistant", "content": "Sure."},
    ]


def _user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


async def test_a_chat_follow_up_sending_the_truncated_text_continues(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id, turn_id = await _interrupted(gw, upstream)
    status, _ = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": SHOWN})
    assert status == 200
    history = [QUESTION, {"role": "assistant", "content": CUT}, _user("続けて")]
    upstream.push(completion("Sure."))
    client = gw.client(default_headers={"X-Conversation-Id": conversation_id})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=history
    )
    assert response.headers["X-Conversation-Id"] == conversation_id  # joined, not branched
    assert upstream.requests[-1]["messages"] == history
    events = await gw.wait_turn_end(conversation_id, count=2)
    second = [e for e in events if e["turn_id"] == response.headers["X-Gateway-Turn-Id"]]
    assert [e["type"] for e in second] == ["user/message", "assistant/message", "turn/end"]
    assert await gw.messages(conversation_id) == [
        *history,
        {"role": "assistant", "content": "Sure."},
    ]


async def test_history_repair_puts_back_the_truncated_text(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    conversation_id, turn_id = await _interrupted(gw, upstream)
    status, _ = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": SHOWN})
    assert status == 200
    # A chat UI that dropped the partial answer when the user pressed Stop.
    follow = {"role": "user", "content": "Again?"}
    upstream.push(completion("Sure."))
    client = gw.client(default_headers={"X-Conversation-Id": conversation_id})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION, follow]
    )
    assert response.headers["X-Conversation-Id"] == conversation_id
    assert response.headers["X-Gateway-History-Repaired"] == "1"
    assert upstream.requests[-1]["messages"] == [
        QUESTION,
        {"role": "assistant", "content": CUT},
        follow,
    ]


async def _responses_interrupted(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> tuple[str, str, str]:
    """A streamed response whose client read every part and left: (response, conversation,
    turn) ids."""
    upstream.push(frames(*(chunk(p) for p in PARTS), then="stall"))
    api = gw.client()
    raw = await api.responses.with_raw_response.create(
        model="fake", input=QUESTION["content"], stream=True
    )
    stream = raw.parse()
    seen, response_id = "", ""
    async for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            seen += event.delta
        if seen == TEXT:
            break
    await stream.close()
    conversation_id = raw.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    return response_id, conversation_id, raw.headers["X-Gateway-Turn-Id"]


async def test_a_previous_response_id_follow_up_carries_the_truncated_text(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    response_id, conversation_id, turn_id = await _responses_interrupted(gw, upstream)
    status, _ = await gw.post(_truncate_path(conversation_id, turn_id), {"content_chars": SHOWN})
    assert status == 200
    api = gw.client()
    stored = await api.responses.retrieve(response_id)
    assert stored.status == "cancelled"
    assert [(i.status, i.content[0].text) for i in stored.output] == [("incomplete", CUT)]

    upstream.push(completion("Sure."))
    raw = await api.responses.with_raw_response.create(
        model="fake", input="Go on.", previous_response_id=response_id
    )
    assert raw.parse().output_text == "Sure."
    assert upstream.requests[-1]["messages"] == [
        QUESTION,
        {"role": "assistant", "content": CUT},
        {"role": "user", "content": "Go on."},
    ]
    # The truncate did not move the conversation on: the follow-up continues it, no fork.
    assert raw.headers["X-Conversation-Id"] == conversation_id


async def test_the_chat_cancel_takes_content_chars(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(*(chunk(p) for p in PARTS), then="stall"))
    client = gw.client(default_headers={"X-Request-Id": "req-shown-1"})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], stream=True
    )
    conversation_id = response.headers["X-Conversation-Id"]
    stream = response.parse()
    seen, status, answer = "", 0, None
    async for part in stream:
        seen += part.choices[0].delta.content or ""
        if seen == TEXT and answer is None:
            # A bad count is refused before anything happens: the stream goes on.
            status, refused = await gw.post(
                "/v1/chat/completions/req-shown-1/cancel", {"content_chars": -1}
            )
            assert (status, refused["error"]["param"]) == (400, "content_chars")
            status, answer = await gw.post(
                "/v1/chat/completions/req-shown-1/cancel", {"content_chars": SHOWN}
            )
    assert status == 200, answer
    assert answer is not None
    truncation = answer.pop("truncation")
    assert answer == {
        "id": "req-shown-1",
        "object": "chat.completion.cancellation",
        "status": "cancelled",
    }
    assert truncation["content"] == CUT
    assert (truncation["conversation_id"], truncation["turn_id"]) == (
        conversation_id,
        response.headers["X-Gateway-Turn-Id"],
    )
    events = await _events(gw, conversation_id)
    assert [e["type"] for e in events] == [
        "user/message",
        "assistant/message",
        "turn/end",
        "assistant/truncate",
    ]
    assert events[1]["payload"]["content"] == [{"type": "text", "text": TEXT}]
    assert events[2]["payload"]["reason"] == "client_cancel"
    assert await gw.messages(conversation_id) == [QUESTION, {"role": "assistant", "content": CUT}]


async def test_a_cancel_past_what_was_delivered_cancels_but_does_not_truncate(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(*(chunk(p) for p in PARTS), then="stall"))
    client = gw.client(default_headers={"X-Request-Id": "req-shown-2"})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], stream=True
    )
    stream = response.parse()
    seen, status, answer = "", 0, None
    async for part in stream:
        seen += part.choices[0].delta.content or ""
        if seen == TEXT and answer is None:
            status, answer = await gw.post(
                "/v1/chat/completions/req-shown-2/cancel", {"content_chars": len(TEXT) + 1}
            )
    assert status == 400
    assert answer is not None and answer["error"]["code"] == "content_chars_past_delivered"
    assert answer["error"]["message"].startswith("The request was cancelled")
    conversation_id = response.headers["X-Conversation-Id"]
    events = await _events(gw, conversation_id)
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    assert await gw.messages(conversation_id) == [QUESTION, {"role": "assistant", "content": TEXT}]


async def test_a_cancel_with_an_empty_body_works_as_before(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(*(chunk(p) for p in PARTS), then="stall"))
    client = gw.client(default_headers={"X-Request-Id": "req-shown-3"})
    response = await client.chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], stream=True
    )
    stream = response.parse()
    seen, status, answer = "", 0, None
    async for part in stream:
        seen += part.choices[0].delta.content or ""
        if seen == TEXT and answer is None:
            status, answer = await _post(gw, "/v1/chat/completions/req-shown-3/cancel")
    assert (status, answer) == (
        200,
        {"id": "req-shown-3", "object": "chat.completion.cancellation", "status": "cancelled"},
    )
    conversation_id = response.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    assert await gw.messages(conversation_id) == [QUESTION, {"role": "assistant", "content": TEXT}]


async def test_the_responses_cancel_takes_content_chars(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(frames(*(chunk(p) for p in PARTS), then="stall"))
    api = gw.client()
    raw = await api.responses.with_raw_response.create(
        model="fake", input=QUESTION["content"], stream=True
    )
    stream = raw.parse()
    seen, response_id, status, answer = "", "", 0, None
    async for event in stream:
        if event.type == "response.created":
            response_id = event.response.id
        if event.type == "response.output_text.delta":
            seen += event.delta
            if seen == TEXT:
                status, answer = await gw.post(
                    f"/v1/responses/{response_id}/cancel", {"content_chars": SHOWN}
                )
    assert status == 200, answer
    assert answer is not None and answer["status"] == "cancelled"
    assert [(i["status"], i["content"][0]["text"]) for i in answer["output"]] == [
        ("incomplete", CUT)
    ]
    stored = await api.responses.retrieve(response_id)
    assert [i.content[0].text for i in stored.output] == [CUT]
    conversation_id = raw.headers["X-Conversation-Id"]
    assert await gw.messages(conversation_id) == [QUESTION, {"role": "assistant", "content": CUT}]
