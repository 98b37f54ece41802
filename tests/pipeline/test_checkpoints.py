"""Delivery checkpoints (gateway.pipeline.checkpoints): a stream's checkpoint is written whole,
then added to by parts while only its blocks' text grows; whatever was written, the checkpoint
recovery puts together is exactly the last one taken, and after a crash the turn holds exactly
the text its client had been delivered as of that look."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import orjson
import pytest

from gateway.context import Gateway
from gateway.conversations.recorder import Attempt, TurnRecorder
from gateway.conversations.recovery import checkpoint_of, recover_open_turns
from gateway.pipeline import checkpoints as checkpoints_module
from gateway.pipeline.checkpoints import SLOTS, Checkpoints, StreamCheckpoints
from gateway.pipeline.relay import Relay
from gateway.storage.db import Db, StoreUnavailable
from gateway.storage.records import Conversation, TurnStart
from gateway.storage.store import Store
from gateway.stream.events import BlockDelta, BlockEnd, BlockStart, StreamEvent
from tests.conversations.test_turn_ends import Kept


class Streaming:
    """One attempt's stream as its client receives it, a frame at a time."""

    def __init__(self, turn: TurnRecorder) -> None:
        self.turn = turn
        self.attempt: Attempt = turn.new_attempt({"deployment": "d", "provider": "p", "model": "m"})
        self.frames = 0

    def frame(self, *events: StreamEvent) -> None:
        self.attempt.add(list(events))
        self.attempt.frame_written()
        self.frames += 1

    def text(self, index: int, *pieces: str) -> None:
        for piece in pieces:
            self.frame(BlockDelta(index, piece))

    def checkpoint(self) -> dict[str, Any]:
        return self.turn.checkpoint(self.attempt, self.frames, "acked")


class Held:
    """What the store holds of one turn's checkpoint: its row and the parts after it."""

    def __init__(self) -> None:
        self.stream = StreamCheckpoints()
        self.body = ""
        self.parts: list[str] = []
        self.kinds = ""  # "w" a look written whole, "p" one added as a part
        self.written = 0

    def look(self, body: dict[str, Any]) -> dict[str, Any]:
        """Take `body` as the checkpoints would; what recovery would read back."""
        seq, encoded = self.stream.encode(body)
        if seq is None:
            self.body, self.parts = encoded, []
        else:
            assert seq == self.stream.seq
            self.parts.append(encoded)
        self.kinds += "w" if seq is None else "p"
        self.written += len(encoded)
        return checkpoint_of(self.body, self.parts)


def text_of(checkpoint: dict[str, Any]) -> list[str]:
    return [block["text"] for block in checkpoint["message"]["content"]]


def test_a_growing_answer_is_added_to_by_parts_that_put_it_back_exactly() -> None:
    stream = Streaming(TurnRecorder(Kept(), "c1", "t1", team_id="team", alias="m"))
    held = Held()
    stream.frame(BlockStart(0, "text"))
    whole_each_time = 0  # what writing every look whole would have written
    for look in range(200):
        stream.text(0, f"piece {look} ", "and more ")
        body = stream.checkpoint()
        assert held.look(body) == body
        whole_each_time += len(orjson.dumps(body))
    assert text_of(body) == ["".join(f"piece {n} and more " for n in range(200))]
    # Written whole at the first look, then again each time its parts came to outweigh it:
    # a handful of times, so what the stream wrote in all grows with its length, not its
    # square.
    assert held.kinds.startswith("wp")
    assert held.kinds.count("w") <= 10
    assert held.written * 10 < whole_each_time


def test_a_block_that_joins_before_another_makes_the_checkpoint_whole() -> None:
    """Block 0 holds only white space (an interrupted answer leaves it out) until a delta
    comes to it after block 1 began: it joins in front of block 1."""
    stream = Streaming(TurnRecorder(Kept(), "c1", "t1"))
    held = Held()
    stream.frame(BlockStart(0, "text"))
    stream.text(0, "\n", " ")
    stream.frame(BlockStart(1, "text"))
    stream.text(1, "Hello", " there")
    assert text_of(held.look(stream.checkpoint())) == ["Hello there"]
    stream.text(1, ", you")
    assert text_of(held.look(stream.checkpoint())) == ["Hello there, you"]
    stream.text(0, "late words, and more")  # (longer than block 1 was at the last look)
    body = stream.checkpoint()
    assert held.look(body) == body
    assert text_of(body) == ["\n late words, and more", "Hello there, you"]
    stream.text(1, " again")
    body = stream.checkpoint()
    assert held.look(body) == body
    assert held.kinds == "wpwp"


def test_a_block_closed_with_data_makes_the_checkpoint_whole() -> None:
    stream = Streaming(TurnRecorder(Kept(), "c1", "t1", team_id="team"))
    held = Held()
    stream.frame(BlockStart(0, "reasoning"))
    stream.text(0, "Let me think")
    held.look(stream.checkpoint())
    stream.text(0, " about it.")
    held.look(stream.checkpoint())
    stream.frame(BlockEnd(0, {"signature": "sig-1"}))
    stream.frame(BlockStart(1, "text"))
    stream.text(1, "Yes.")
    body = stream.checkpoint()
    assert held.look(body) == body
    assert body["message"]["content"][0]["signature"] == "sig-1"
    assert held.kinds == "wpw"


def test_a_checkpoint_without_a_message_is_written_whole_and_the_first_message_too() -> None:
    stream = Streaming(TurnRecorder(Kept(), "c1", "t1"))
    held = Held()
    stream.frame(BlockStart(0, "text"))
    stream.text(0, "  ")
    assert held.look(stream.checkpoint())["message"] is None
    stream.text(0, "Hi")
    body = stream.checkpoint()
    assert held.look(body) == body
    assert held.kinds == "ww"


class StubRelay(Relay):
    """A relay reduced to what the checkpoints read: its request, its turn, and its checkpoint
    when its client got frames since the last one (Relay.checkpoint)."""

    def __init__(self, stream: Streaming) -> None:  # (none of a real relay's state)
        self.stream = stream
        self.body = {"model": "m"}
        self.turn = stream.turn
        self.checkpointed = 0

    def checkpoint(self) -> dict[str, Any] | None:
        if self.stream.frames == self.checkpointed:
            return None
        self.checkpointed = self.stream.frames
        return self.stream.checkpoint()


async def open_turn(store: Store, turn_id: str) -> Streaming:
    store.create_conversation(Conversation(f"c-{turn_id}", 1.0))
    store.start_turn(TurnStart(turn_id, f"c-{turn_id}", 1.0, {"model": "m"}))
    await store.flush()
    return Streaming(TurnRecorder(store, f"c-{turn_id}", turn_id, team_id="team", alias="m"))


async def held_rows(store: Store) -> tuple[dict[str, str], dict[str, int]]:
    """Each turn's checkpoint row, and how many parts it has."""

    async def read(db: Db) -> tuple[dict[str, str], dict[str, int]]:
        rows = await db.fetch("SELECT turn_id, body FROM turn_checkpoints")
        parts = await db.fetch("SELECT turn_id FROM turn_checkpoint_parts")
        counts: dict[str, int] = {}
        for (turn_id,) in parts:
            counts[turn_id] = counts.get(turn_id, 0) + 1
        return {r[0]: r[1] for r in rows}, counts

    return await store.run(read)


async def an_interval(checkpoints: Checkpoints) -> None:
    """One tick for each slot: every stream looked at once."""
    for _ in range(SLOTS):
        await checkpoints.tick()


async def test_a_refused_tick_is_written_whole_next_and_recovery_gets_the_delivered_text(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    streams = [await open_turn(store, f"t{n}") for n in range(SLOTS + 1)]  # two share a slot
    relays = [StubRelay(s) for s in streams]
    gateway = cast(Gateway, SimpleNamespace(running=set(relays), store=store))
    checkpoints = Checkpoints(gateway)
    for s in streams:
        s.frame(BlockStart(0, "text"))
        s.text(0, f"{s.turn.turn_id} starts ")
    await an_interval(checkpoints)
    for s in streams:
        s.text(0, "and goes on ")
    await an_interval(checkpoints)
    rows, parts = await held_rows(store)
    assert set(rows) == {s.turn.turn_id for s in streams}
    assert parts == {s.turn.turn_id: 1 for s in streams}

    refusals = []
    save = store.save_checkpoints

    async def refuse(*args: Any) -> None:
        refusals.append(args)
        raise StoreUnavailable("down")

    monkeypatch.setattr(store, "save_checkpoints", refuse)
    for s in streams:
        s.text(0, "unsaved ")
    for _ in range(SLOTS):
        with pytest.raises(StoreUnavailable):
            await checkpoints.tick()
    assert len(refusals) == SLOTS
    monkeypatch.setattr(store, "save_checkpoints", save)
    await an_interval(checkpoints)  # nothing new delivered, yet each is written again, whole
    rows, parts = await held_rows(store)
    assert parts == {}
    for s in streams:
        assert text_of(checkpoint_of(rows[s.turn.turn_id])) == [
            f"{s.turn.turn_id} starts and goes on unsaved "
        ]
    for s in streams:
        s.text(0, "to the end")
    await an_interval(checkpoints)
    streams[0].text(0, " (never looked at)")  # delivered after the last look: a crash loses it

    assert await recover_open_turns(store, None, at_start=True) == len(streams)
    for s in streams:
        events = await store.events(s.turn.conversation_id)
        assert [e.type for e in events] == ["assistant/message", "turn/end"]
        assert events[0].payload["interrupted"] is True
        assert [b["text"] for b in events[0].payload["content"]] == [
            f"{s.turn.turn_id} starts and goes on unsaved to the end"
        ]
        assert events[1].payload["reason"] == "crash_recovered"
    assert await held_rows(store) == ({}, {})


async def test_the_checkpoints_of_turns_that_ended_are_dropped_with_their_parts(
    store: Store,
) -> None:
    ended, left, going = [await open_turn(store, t) for t in ("ended", "left", "going")]
    relays = {s.turn.turn_id: StubRelay(s) for s in (ended, left, going)}
    gateway = cast(Gateway, SimpleNamespace(running=set(relays.values()), store=store))
    checkpoints = Checkpoints(gateway)
    for s in (ended, left, going):
        s.frame(BlockStart(0, "text"))
        s.text(0, "one ")
    await an_interval(checkpoints)
    for s in (ended, left, going):
        s.text(0, "two ")
    await an_interval(checkpoints)
    assert (await held_rows(store))[1] == {"ended": 1, "left": 1, "going": 1}
    ended.turn.ended = True  # its relay still finishing
    gateway.running.discard(relays["left"])  # its relay gone
    await an_interval(checkpoints)
    rows, parts = await held_rows(store)
    assert set(rows) == {"going"} and parts == {"going": 1}


class Failing(StubRelay):
    """A relay whose next look raises (a bug in assembling its answer, say)."""

    fail = False

    def checkpoint(self) -> dict[str, Any] | None:
        if self.fail:
            self.fail = False
            raise RuntimeError("look failed")
        return super().checkpoint()


async def test_a_tick_whose_look_fails_takes_its_streams_whole_at_their_next_look(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(checkpoints_module, "SLOTS", 1)  # both streams looked at each tick
    first, second = await open_turn(store, "first"), await open_turn(store, "second")
    relay = StubRelay(first)
    failing = Failing(second)
    gateway = cast(Gateway, SimpleNamespace(running={relay}, store=store))
    checkpoints = Checkpoints(gateway)
    for s in (first, second):
        s.frame(BlockStart(0, "text"))
        s.text(0, "one ")
    await checkpoints.tick()
    gateway.running.add(failing)  # met after `relay`: looked at after it
    await checkpoints.tick()
    first.text(0, "two ")
    failing.fail = True
    with pytest.raises(RuntimeError):
        await checkpoints.tick()  # `relay` was taken, its part not saved
    first.text(0, "three")
    await checkpoints.tick()
    rows, parts = await held_rows(store)
    assert text_of(checkpoint_of(rows["first"])) == ["one two three"]
    assert parts == {}
    assert await recover_open_turns(store, None, at_start=True) == 2
    message = (await store.events("c-first"))[0].payload
    assert message["content"] == [{"type": "text", "text": "one two three"}]
