"""When a replica may take a silent peer for dead: only after two beats of its own that reached
the store, so that an outage of the store, which silences every replica, kills none of them.
And what recovery reads of a dead process's checkpoints: rows written whole, from before
checkpoints had parts too, and parts, each put back in order; parts left behind are dropped."""

from __future__ import annotations

import orjson

from gateway.conversations.recovery import PeerWatch, checkpoint_of, recover_open_turns
from gateway.storage.db import Db
from gateway.storage.records import Conversation, TurnStart
from gateway.storage.store import Store


def test_a_peer_is_judged_only_after_two_beats_of_watching() -> None:
    watch = PeerWatch(beat_s=1.0)
    assert watch.stale_s == 2.0
    assert [watch.beat(t) for t in (10.0, 11.0, 12.0, 13.0)] == [False, False, True, True]


def test_after_an_outage_of_the_store_peers_get_two_beats_again() -> None:
    watch = PeerWatch(beat_s=1.0)
    assert [watch.beat(t) for t in (0.0, 1.0, 2.0)] == [False, False, True]
    watch.missed()  # the store did not answer: every peer's beats may have failed too
    watch.missed()
    assert [watch.beat(t) for t in (5.0, 6.0, 7.0)] == [False, False, True]


def test_a_late_beat_is_a_gap_in_the_watch() -> None:
    """A heartbeat that took long (a store stalling rather than failing) counts as a gap."""
    watch = PeerWatch(beat_s=1.0)
    assert [watch.beat(t) for t in (0.0, 1.0, 2.0)] == [False, False, True]
    assert watch.beat(9.0) is False
    assert [watch.beat(t) for t in (10.0, 11.0)] == [False, True]


def test_a_long_sweep_is_no_gap() -> None:
    """The store answered the sweep's claims: the next beat follows from its end."""
    watch = PeerWatch(beat_s=1.0)
    assert [watch.beat(t) for t in (0.0, 1.0, 2.0)] == [False, False, True]
    watch.reached(6.0)  # the sweep closed many turns
    assert watch.beat(7.0) is True


# -- checkpoints as recovery reads them (gateway.pipeline.checkpoints) -----------------------

# A checkpoint row as the gateway wrote every one before checkpoints had parts: a process
# upgraded while its streams were open leaves these for the new one to close.
PREVIOUS_ROW = (
    '{"message":{"content":[{"type":"text","text":"Hello, wor"}],"interrupted":true,'
    '"surface_op":"append","route":{"deployment":"d","provider":"p","model":"m"},"attempt":1,'
    '"finish_reason":null,"delivery":"acked"},"attempts":[{"number":1,"route":{"deployment":'
    '"d","provider":"p","model":"m"},"outcome":null,"usage":null,"first_token_ms":12.5,'
    '"duration_ms":151.25}],"team_id":"team","key_id":null,"user":null,"alias":"m",'
    '"reasoning":false,"response_id":"chatcmpl-1"}'
)


async def open_turn(store: Store, turn_id: str) -> None:
    store.create_conversation(Conversation(f"c-{turn_id}", 1.0))
    store.start_turn(TurnStart(turn_id, f"c-{turn_id}", 1.0, {"model": "m"}))
    await store.flush()


async def test_a_row_from_before_parts_closes_its_turn_as_it_did(store: Store) -> None:
    await open_turn(store, "t1")

    async def write(db: Db) -> None:
        await db.execute(
            "INSERT INTO turn_checkpoints (turn_id, conversation_id, at, body) VALUES (?, ?, ?, ?)",
            "t1",
            "c-t1",
            2.0,
            PREVIOUS_ROW,
        )

    await store.transact(write)
    assert await recover_open_turns(store, None, at_start=True) == 1
    message, end = [(e.type, e.payload) for e in await store.events("c-t1")]
    assert message == ("assistant/message", orjson.loads(PREVIOUS_ROW)["message"])
    assert end[1]["reason"] == "crash_recovered"
    assert end[1]["attempts"] == 1 and end[1]["response_id"] == "chatcmpl-1"


async def test_parts_whose_checkpoint_is_gone_are_dropped_at_a_sweep(store: Store) -> None:
    """A turn that ended just before its process died keeps its parts past the restart, which
    drops its row; a sweep drops them. The open turns of a living process keep theirs."""
    await open_turn(store, "live")
    durations = orjson.dumps({"seq": 1, "grown": [[0, "!"]], "durations": [160.0]}).decode()
    await store.save_checkpoints([("live", "c-live", 1.0, PREVIOUS_ROW)], [])
    await store.save_checkpoints([], [], [("live", 1, 2.0, durations), ("gone", 3, 2.0, "{}")])
    assert await recover_open_turns(store, None, at_start=False, stale_s=60.0) == 0

    async def left(db: Db) -> list[tuple[str, int]]:
        rows = await db.fetch("SELECT turn_id, seq FROM turn_checkpoint_parts")
        return [(r[0], r[1]) for r in rows]

    assert await store.run(left) == [("live", 1)]
    assert await recover_open_turns(store, None, at_start=True) == 1
    message = (await store.events("c-live"))[0].payload
    assert message["content"] == [{"type": "text", "text": "Hello, wor!"}]
    assert await store.run(left) == []


def test_parts_put_a_checkpoint_back_in_order() -> None:
    parts = [
        {"seq": 1, "grown": [[0, "ld"]], "durations": [170.0]},
        {"seq": 2, "grown": [], "attempts": [{"number": 1, "usage": {"completion_tokens": 3}}]},
        {"seq": 3, "grown": [[0, "!"]], "durations": [190.5]},
    ]
    checkpoint = checkpoint_of(PREVIOUS_ROW, [orjson.dumps(p).decode() for p in parts])
    assert checkpoint["message"]["content"] == [{"type": "text", "text": "Hello, world!"}]
    assert checkpoint["attempts"] == [
        {"number": 1, "usage": {"completion_tokens": 3}, "duration_ms": 190.5}
    ]
    assert checkpoint_of(PREVIOUS_ROW) == orjson.loads(PREVIOUS_ROW)


def test_parts_after_one_the_store_never_took_are_left_out() -> None:
    """What a part adds is only right on top of every part before it: after a gap in their
    numbers the checkpoint stops, a prefix of what was delivered; parts of an earlier whole
    checkpoint are not applied to a later one."""
    whole = orjson.dumps({**orjson.loads(PREVIOUS_ROW), "seq": 4}).decode()
    parts = [
        {"seq": 2, "grown": [[0, "(of the whole before)"]], "durations": [1.0]},
        {"seq": 5, "grown": [[0, "l"]], "durations": [170.0]},
        {"seq": 7, "grown": [[0, "!"]], "durations": [190.5]},  # (6 never written)
    ]
    checkpoint = checkpoint_of(whole, [orjson.dumps(p).decode() for p in parts])
    assert checkpoint["message"]["content"] == [{"type": "text", "text": "Hello, worl"}]
    assert checkpoint["attempts"][0]["duration_ms"] == 170.0
    assert "seq" not in checkpoint
