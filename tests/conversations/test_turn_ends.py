"""TurnEnds (gateway.conversations.turn_ends): the non-streaming answers that complete in one loop
iteration are recorded together once its handlers have run, each handler's future done when
its own turn is; a turn whose client left in between keeps the ending that was recorded for
it; a turn whose recording fails reports it to its own handler only."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.conversations.recorder import TurnRecorder
from gateway.conversations.turn_ends import TurnEnds
from gateway.storage.records import Conversation, NewEvent, TurnStart
from gateway.stream.events import BlockDelta, BlockEnd, BlockStart, Finish


class Kept:
    """A store that keeps the events it is given (TurnWrites)."""

    def __init__(self) -> None:
        self.events: list[NewEvent] = []

    def create_conversation(self, conversation: Conversation) -> None:
        pass

    def start_turn(self, turn: TurnStart) -> None:
        pass

    def append(self, event: NewEvent) -> None:
        self.events.append(event)

    async def durable_enough(self) -> None:
        pass

    def mark(self) -> tuple[int, None]:
        return (len(self.events), None)

    def types(self, turn: TurnRecorder) -> list[str]:
        return [e.type for e in self.events if e.turn_id == turn.turn_id]


def answered(store: Kept, name: str) -> tuple[TurnRecorder, Any]:
    turn = TurnRecorder(store, f"conv-{name}", f"turn-{name}")
    turn.begin(new_conversation=None, new_messages=[], request={})
    attempt = turn.new_attempt({"deployment": "d"})
    attempt.add([BlockStart(0, "text"), BlockDelta(0, name), BlockEnd(0), Finish("stop")])
    return turn, attempt


async def test_answers_of_one_iteration_are_recorded_together_after_it() -> None:
    store, ends = Kept(), TurnEnds()
    (one, one_attempt), (two, two_attempt) = answered(store, "one"), answered(store, "two")
    first = ends.completed(one, one_attempt)
    second = ends.completed(two, two_attempt)
    assert store.events == [] and not one.ended  # decided, not recorded yet
    await first
    assert second.done()  # recorded in the same pass
    for turn, text in ((one, "one"), (two, "two")):
        assert store.types(turn) == ["assistant/message", "turn/end"]
        message = next(e for e in store.events if e.turn_id == turn.turn_id)
        assert message.payload["content"] == [{"type": "text", "text": text}]
    # The next iteration's answers make a batch of their own.
    three, three_attempt = answered(store, "three")
    await ends.completed(three, three_attempt)
    assert store.types(three) == ["assistant/message", "turn/end"]


async def test_a_turn_whose_client_left_meanwhile_keeps_the_ending_recorded_for_it() -> None:
    store, ends = Kept(), TurnEnds()
    (gone, gone_attempt), (kept, kept_attempt) = answered(store, "gone"), answered(store, "kept")
    waiting = ends.completed(gone, gone_attempt)
    other = ends.completed(kept, kept_attempt)
    # Before the batch runs, the first client leaves: its handler's wait is cancelled, and the
    # relay records what it got (nothing).
    waiting.cancel()
    gone.interrupted(gone_attempt, 0, "acked", "client_disconnect")
    await other
    assert store.types(gone) == ["assistant/attempt", "turn/end"]  # no message after its end
    assert store.types(kept) == ["assistant/message", "turn/end"]


class Refusing(Kept):
    """A store that fails to take one turn's answer."""

    def append(self, event: NewEvent) -> None:
        if event.turn_id == "turn-broken" and event.type == "assistant/message":
            raise OSError("no room")
        super().append(event)


async def test_a_failure_to_record_one_turn_reaches_its_own_handler_only() -> None:
    store, ends = Refusing(), TurnEnds()
    (broken, broken_attempt), (fine, fine_attempt) = (
        answered(store, "broken"),
        answered(store, "fine"),
    )
    failing = ends.completed(broken, broken_attempt)
    succeeding = ends.completed(fine, fine_attempt)
    with pytest.raises(OSError, match="no room"):
        await failing
    await succeeding
    assert store.types(fine) == ["assistant/message", "turn/end"]
