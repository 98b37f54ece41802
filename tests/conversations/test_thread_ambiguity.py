"""Ambiguity never joins (docs/recording.md, "Conversations and branches"): a history that is
the last turn of more than one conversation of a key and end user starts a conversation of its
own, noted `thread_ambiguous` with the candidates; one that is the last turn of one of them
continues it, however many earlier runs passed through the same history."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, completion

Json = dict[str, Any]
HI = {"role": "user", "content": "Hi, can you help me with something?"}
SURE = {"role": "assistant", "content": "Sure, what do you need?"}


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(
    request: pytest.FixtureRequest, make_gateway: MakeGateway, upstream: FakeUpstream
) -> GatewayUnderTest:
    store = {} if request.param == "sqlite" else {"url": request.getfixturevalue("pg_url")}
    return await make_gateway(upstream=upstream, store=store)


async def ask(
    gw: GatewayUnderTest, upstream: FakeUpstream, messages: list[Json], answer: str
) -> str:
    """One chat turn with no conversation header and no `user`, as the JS SDKs send it; the
    conversation it was recorded in."""
    upstream.push(completion(answer))
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="fake", messages=messages
    )
    assert raw.parse().choices[0].message.content == answer
    return raw.headers["X-Conversation-Id"]


async def own_events(gw: GatewayUnderTest, conversation_id: str) -> list[Json]:
    await gw.flush()
    return [e.to_api() for e in await gw.gateway.store.events(conversation_id)]


def contents(events: list[Json]) -> list[Any]:
    """The texts of the surface events, in order."""
    out = []
    for event in events:
        payload = event["payload"]
        if event["type"] == "user/message":
            out.append(payload["content"])
        elif event["type"] == "assistant/message":
            out.append("".join(b.get("text", "") for b in payload["content"]))
    return out


async def test_two_users_of_one_key_never_share_a_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """Alice and Bob behind one app key, no `user` field, the same first exchange: Alice's
    private follow-up is recorded in a conversation of its own, never in Bob's (nor Bob's in
    Alice's), with a note naming both candidates; after it, her run threads as usual."""
    alice_first = await ask(gw, upstream, [HI], SURE["content"])
    bob_first = await ask(gw, upstream, [HI], SURE["content"])
    assert alice_first != bob_first

    secret = {"role": "user", "content": "My bank PIN is 4512, is that safe?"}
    alice = await ask(gw, upstream, [HI, SURE, secret], "Never share it.")
    bob_question = {"role": "user", "content": "What is the capital of Peru?"}
    bob = await ask(gw, upstream, [HI, SURE, bob_question], "Lima.")
    assert len({alice_first, bob_first, alice, bob}) == 4

    for conversation_id, asked, answered in ((alice, secret, "Never share it."),
                                             (bob, bob_question, "Lima.")):  # fmt: skip
        events = await own_events(gw, conversation_id)
        note = events[0]
        assert note["type"] == "conversation/note"
        assert note["payload"]["note"] == "thread_ambiguous"
        assert set(note["payload"]["candidates"]) == {alice_first, bob_first}
        assert contents(events) == [HI["content"], SURE["content"], asked["content"], answered]
        # Not a branch of either: its history is its own.
        conversation = await gw.gateway.store.get_conversation(conversation_id)
        assert conversation is not None and conversation.parent_id is None
    for first in (alice_first, bob_first):
        assert contents(await own_events(gw, first)) == [HI["content"], SURE["content"]]

    # Alice goes on: her history is now hers alone, and continues her conversation.
    more = {"role": "user", "content": "What should I do instead?"}
    alice_history = [HI, SURE, secret, {"role": "assistant", "content": "Never share it."}]
    again = await ask(gw, upstream, [*alice_history, more], "Use a password manager.")
    assert again == alice
    assert "My bank PIN is 4512, is that safe?" not in str(await own_events(gw, bob))


async def test_identical_runs_in_sequence_stay_separate(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """One run after another, identical to the byte: each run is one conversation, each
    continued at its own last turn (the earlier run has moved on), none a branch, no note."""
    runs = []
    for _ in range(2):
        messages: list[Json] = [HI]
        seen = []
        for step in ("Sure, what do you need?", "Here it is.", "Done."):
            seen.append(await ask(gw, upstream, messages, step))
            messages += [
                {"role": "assistant", "content": step},
                {"role": "user", "content": "Go on."},
            ]
        runs.append(seen)
    (first, *rest), (second, *others) = runs
    assert rest == [first, first] and others == [second, second] and first != second
    for conversation_id in (first, second):
        events = await own_events(gw, conversation_id)
        assert "conversation/note" not in [e["type"] for e in events]
        assert sum(e["type"] == "turn/end" for e in events) == 3
        conversation = await gw.gateway.store.get_conversation(conversation_id)
        assert conversation is not None and conversation.parent_id is None


async def test_interleaved_identical_runs_never_chain_into_each_other(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """Three identical runs taking turns under one key: their first turns end alike, so each
    run's second request is ambiguous and starts its own conversation; from there each run
    continues its own. No conversation holds turns of two runs, and none is a branch."""
    runs: list[list[Json]] = [[HI], [HI], [HI]]
    seen: list[list[str]] = [[], [], []]
    for step in ("Sure, what do you need?", "Here it is.", "Done."):
        for run, messages in enumerate(runs):
            seen[run].append(await ask(gw, upstream, messages, step))
            messages += [
                {"role": "assistant", "content": step},
                {"role": "user", "content": f"Go on, run {run}."},
            ]
    firsts = [s[0] for s in seen]
    mains = [s[1] for s in seen]
    assert [s[2] for s in seen] == mains  # the third step continues the second's
    assert len(set(firsts + mains)) == 6
    for run, conversation_id in enumerate(mains):
        events = await own_events(gw, conversation_id)
        assert events[0]["type"] == "conversation/note"
        assert set(events[0]["payload"]["candidates"]) == set(firsts)
        texts = contents(events)
        assert texts.count(f"Go on, run {run}.") == 2
        assert all(f"run {other}." not in str(texts) for other in range(3) if other != run)
    for conversation_id in firsts + mains:
        conversation = await gw.gateway.store.get_conversation(conversation_id)
        assert conversation is not None and conversation.parent_id is None
