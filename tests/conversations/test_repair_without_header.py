"""History repair without a header (docs/recording.md, "History repair"): a chat UI that drops
a stopped answer from its history, and sends no conversation id, still continues that
conversation with the partial answer put back, a first answer's too; found by the history the
interrupted turn began with, in threading's one read. Ambiguity still never joins."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, completion
from tests.js.test_js_clients import NODE, node

Json = dict[str, Any]
QUESTION = {"role": "user", "content": "Tell me a story."}
GO_ON = {"role": "user", "content": "Go on."}
PARTS = [f"Once upon a time, part {i}. " for i in range(40)]


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(
    request: pytest.FixtureRequest, make_gateway: MakeGateway, upstream: FakeUpstream
) -> GatewayUnderTest:
    store = {} if request.param == "sqlite" else {"url": request.getfixturevalue("pg_url")}
    return await make_gateway(upstream=upstream, store=store)


async def stop_first_answer(gw: GatewayUnderTest, upstream: FakeUpstream, cut_at: int) -> Json:
    """Stream the question with the openai SDK and stop once `cut_at` characters arrived; the
    conversation, what was received and what was recorded, once the turn has ended."""
    upstream.stall_after(PARTS)
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], stream=True
    )
    received = ""
    stream = raw.parse()
    async for chunk in stream:
        received += chunk.choices[0].delta.content or ""
        if len(received) >= cut_at:
            break
    await stream.close()
    conversation_id = raw.headers["X-Conversation-Id"]
    events = await gw.wait_turn_end(conversation_id)
    answer = next(e["payload"] for e in events if e["type"] == "assistant/message")
    assert answer["interrupted"] is True
    recorded = "".join(b["text"] for b in answer["content"])
    assert recorded.startswith(received)
    return {"id": conversation_id, "received": received, "recorded": recorded}


async def go_on(gw: GatewayUnderTest, upstream: FakeUpstream) -> tuple[str, str | None]:
    """The UI's follow-up: the question and "Go on.", the partial answer left out, no header."""
    upstream.push(completion("And they lived happily."))
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION, GO_ON]
    )
    return raw.headers["X-Conversation-Id"], raw.headers.get("X-Gateway-History-Repaired")


async def test_a_stopped_first_answer_is_put_back_without_a_header(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    first = await stop_first_answer(gw, upstream, cut_at=34)
    conversation_id, repaired = await go_on(gw, upstream)
    assert conversation_id == first["id"]
    assert repaired == "1"
    # The model saw what the user read, byte for byte, where it was.
    sent = upstream.requests[-1]["messages"]
    assert sent == [QUESTION, {"role": "assistant", "content": first["recorded"]}, GO_ON]
    events = await gw.wait_turn_end(conversation_id, count=2)
    kinds = [e["type"] for e in events]
    assert kinds == [
        "user/message", "assistant/message", "turn/end",
        "user/message", "assistant/message", "turn/end",
    ]  # fmt: skip
    assert events[3]["payload"]["content"] == "Go on."


async def test_two_stopped_runs_alike_are_ambiguous_and_start_apart(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """Two users of one key stop the same first answer: "Go on." cannot tell whose it is."""
    alice = await stop_first_answer(gw, upstream, cut_at=34)
    bob = await stop_first_answer(gw, upstream, cut_at=60)
    conversation_id, repaired = await go_on(gw, upstream)
    assert conversation_id not in (alice["id"], bob["id"]) and repaired is None
    assert upstream.requests[-1]["messages"] == [QUESTION, GO_ON]  # nothing put back
    events = await gw.wait_turn_end(conversation_id)
    note = events[0]
    assert note["type"] == "conversation/note"
    assert note["payload"]["note"] == "thread_ambiguous"
    assert set(note["payload"]["candidates"]) == {alice["id"], bob["id"]}


async def test_a_completed_first_answer_left_out_starts_a_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """Only an interrupted answer is put back: a history without a completed one matches no
    turn, as before."""
    upstream.text(PARTS[:3])
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=[QUESTION], stream=True
    )
    async for _ in raw.parse():
        pass
    await gw.wait_turn_end(raw.headers["X-Conversation-Id"])
    conversation_id, repaired = await go_on(gw, upstream)
    assert conversation_id != raw.headers["X-Conversation-Id"] and repaired is None


@pytest.mark.skipif(NODE is None, reason="needs node (`make test` installs it)")
async def test_openai_node_stop_then_go_on_is_repaired(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(upstream=upstream)
    upstream.stall_after(PARTS)
    stopped = await node("stop_then_go_on.mjs", gw, STEP="stop", CUT_AT="30")
    events = await gw.wait_turn_end(stopped["conversationId"])
    answer = next(e["payload"] for e in events if e["type"] == "assistant/message")
    recorded = "".join(b["text"] for b in answer["content"])
    assert len(stopped["received"]) >= 30 and recorded.startswith(stopped["received"])
    upstream.push(completion("And they lived happily."))
    followed = await node("stop_then_go_on.mjs", gw, STEP="go_on")
    assert followed["conversationId"] == stopped["conversationId"]
    assert followed["repaired"] == "1"
    assert upstream.requests[-1]["messages"][1] == {"role": "assistant", "content": recorded}
