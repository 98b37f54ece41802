"""Delivery checkpoints: what each streaming turn's client has, written to the store a few
times a second, so that a turn whose process dies is closed with its delivered prefix
(gateway.conversations.recovery; docs/operations.md, "Stopping and crashing").

One task per process takes them. Each stream is looked at once an INTERVAL_S, the streams
spread over that interval's ticks so that no tick holds the event loop for all of them; only a
stream whose client got frames since its last look answers. A turn's first checkpoint is
written whole (its row in turn_checkpoints). After that, while only its blocks' text grows, a
look adds a part (turn_checkpoint_parts): the text each block gained, and the attempts as they
stand (their durations alone when nothing else changed), so that a tick writes what moved
rather than every delivered prefix again. The checkpoint is written whole again, its parts
dropped, when anything else changed, and when its parts come to outweigh it, which keeps all a
stream writes linear in its length. A tick's checkpoints, and the drop of those of turns that
ended, are one transaction. Nothing is written per chunk, and nothing when no stream moved. A
tick the store cannot take is skipped: its streams are written whole at their next look. A
stream is looked at only once its turn's start is durable (the store took it, or its journal or
spool did): written straight to the database, a checkpoint could otherwise land there before
its turn, which a crash would then lose, and recovery would find a checkpoint it cannot close.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from typing import Any

import orjson

from gateway.context import Gateway, InFlight
from gateway.metering.choices import with_other_choices
from gateway.pipeline.relay import Relay
from gateway.storage.records import Checkpoint

log = logging.getLogger(__name__)

# Each stream is looked at this often: a crash loses at most this much of what was delivered,
# plus a tick's take and save.
INTERVAL_S = 0.15
# The streams are spread over the ticks of an interval: a tick looks at a third of them.
TICK_S = 0.05
SLOTS = round(INTERVAL_S / TICK_S)


def _without(d: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    rest = {**d}  # (a copy less some keys: faster than a comprehension over all of them)
    for key in keys:
        rest.pop(key, None)
    return rest


def _attempts(body: Checkpoint) -> list[dict[str, Any]]:
    """The attempts but for their durations, which change at every look."""
    return [_without(attempt, "duration_ms") for attempt in body["attempts"]]


class _Last:
    """The last checkpoint a stream wrote, when it has a message: all but its blocks' text,
    each block's text length, its attempts but for their durations; and what the parts since
    it was written whole cost."""

    __slots__ = ("attempts", "blocks", "fields", "lengths", "message", "parts", "size")

    def __init__(self, body: Checkpoint, size: int) -> None:
        message = body["message"]
        assert message is not None
        self.fields = _without(body, "message", "attempts")
        self.message = _without(message, "content")
        self.blocks = [_without(block, "text") for block in message["content"]]
        # (A tool call has no text: its arguments are whole once kept, and never grow.)
        self.lengths = [len(block.get("text", "")) for block in message["content"]]
        self.attempts = _attempts(body)
        self.size = size  # the whole checkpoint's JSON
        self.parts = 0  # the parts' since

    def grown(self, body: Checkpoint) -> tuple[list[tuple[int, str]], list[int]] | None:
        """What each block of `body` gained on this checkpoint (position, text), and their
        lengths; None when `body` is not this checkpoint grown.

        While the turn streams one attempt, a block's text only grows, and a block an
        interrupted answer keeps stays kept (BlockAssembler.interrupted_blocks): so with as
        many blocks as before they are the same blocks, and what a block has past its length
        at the last look is what it gained. A block that joins may come before others, and
        makes the checkpoint whole again."""
        message = body["message"]
        if message is None:
            return None
        content = message["content"]
        if len(content) != len(self.lengths):
            return None
        if _without(message, "content") != self.message:
            return None
        if _without(body, "message", "attempts") != self.fields:
            return None
        grown: list[tuple[int, str]] = []
        lengths: list[int] = []
        for position, (block, shape, length) in enumerate(
            zip(content, self.blocks, self.lengths, strict=True)
        ):
            text = block.get("text", "")
            if not isinstance(text, str) or len(text) < length:
                return None
            if _without(block, "text") != shape:  # a block closed since, with its data
                return None
            if len(text) > length:
                grown.append((position, text[length:]))
            lengths.append(len(text))
        return grown, lengths


class StreamCheckpoints:
    """One stream's checkpoints as the store is to hold them: the ticks it is looked at
    (`slot`), and its last checkpoint, which the next one may be a part of.

    Each checkpoint, whole or part, is numbered (`seq`, in its JSON, beside a whole one's own
    keys); recovery adds to a whole checkpoint only the parts numbered on from it without a
    gap, so a part the store never took ends what is put together rather than being skipped
    over, and a part of an earlier whole one is never added to a later one."""

    __slots__ = ("_last", "seq", "several", "slot", "tags")

    def __init__(self, slot: int = 0, several: bool = False, tags: str | None = None) -> None:
        self.slot = slot
        self.seq = 0  # the last checkpoint's number
        self._last: _Last | None = None
        # What the turn's usage rows need beside TurnRecorder.checkpoint's body, should they
        # be written from a checkpoint: the other choices of an `n > 1` stream
        # (gateway.metering.choices), the request's metadata tags.
        self.several = several
        self.tags = tags

    def complete(self, body: Checkpoint, relay: Relay) -> Checkpoint:
        """`body` with what this stream adds to it (`several`, `tags`)."""
        if self.several:
            with_other_choices(body, relay.turn.attempts)
        if self.tags is not None:
            body["tags"] = self.tags
        return body

    def encode(self, body: Checkpoint) -> tuple[int | None, str]:
        """Checkpoint `body` (TurnRecorder.checkpoint) as the store is to hold it: (None, its
        JSON) to be written whole, or (its number, a part) to be added to the last one written
        whole (gateway.conversations.recovery.checkpoint_of puts them together)."""
        last = self._last
        seq = self.seq + 1
        if last is not None and (grown := last.grown(body)) is not None:
            attempts = _attempts(body)
            part: dict[str, Any] = {"seq": seq, "grown": grown[0]}
            if attempts == last.attempts:
                part["durations"] = [attempt["duration_ms"] for attempt in body["attempts"]]
            else:
                part["attempts"] = body["attempts"]
            encoded = orjson.dumps(part).decode()
            if last.parts + len(encoded) <= last.size:
                last.parts += len(encoded)
                last.lengths, last.attempts = grown[1], attempts
                self.seq = seq
                return seq, encoded
        whole = orjson.dumps({**body, "seq": seq}).decode()
        self._last = _Last(body, len(whole)) if body["message"] is not None else None
        self.seq = seq
        return None, whole

    def forget(self) -> None:
        """What was encoded last may not be in the store: the next checkpoint is whole."""
        self._last = None


class Taken:
    """A tick's checkpoints: the relays looked at that moved; the rows written whole (turn id,
    conversation id, time, body) and the parts (turn id, number, time, body); the turns whose
    checkpoints the store holds that ended."""

    __slots__ = ("ended", "parts", "relays", "rows")

    def __init__(self) -> None:
        self.relays: list[Relay] = []
        self.rows: list[tuple[str, str, float, str]] = []
        self.parts: list[tuple[str, int, float, str]] = []
        self.ended: set[str] = set()


class Checkpoints:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.saved: set[str] = set()  # turns with a checkpoint in the store
        self.ending: set[str] = set()  # of those, the turns that ended: to drop
        # What was running at the last tick, and the relays among it by the tick they are
        # looked at: a tick reads what changed and its own share, not every stream.
        self.seen: set[InFlight] = set()
        self.streams: dict[Relay, StreamCheckpoints] = {}
        self.slots: list[dict[Relay, StreamCheckpoints]] = [{} for _ in range(SLOTS)]
        self.ticks = 0
        self.met = 0  # streams met: each new one takes the next slot

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time()
        while True:
            # A tick keeps its place: a slow save delays the next tick, not every one after.
            at = max(at + TICK_S, loop.time())
            await asyncio.sleep(at - loop.time())
            try:
                await self.tick()
            except Exception as exc:  # the store down or slow: the next tick tries again
                log.debug("checkpoint skipped: %s", exc)

    async def tick(self) -> None:
        taken = self.take()
        if not taken.rows and not taken.parts and not taken.ended:
            return
        try:
            await self.gateway.store.save_checkpoints(taken.rows, taken.ended, taken.parts)
        except BaseException:
            self._unsaved(taken.relays)
            raise
        self.saved -= taken.ended
        self.ending -= taken.ended
        self.saved.update(row[0] for row in taken.rows)

    def take(self) -> Taken:
        """The checkpoints of the streams looked at this tick that moved; the turns whose
        checkpoints the store holds that ended."""
        self._meet()
        slot = self.ticks % SLOTS
        self.ticks += 1
        saved, ending = self.saved, self.ending
        durable = self.gateway.store.durable
        now = time.time()
        taken = Taken()
        try:
            for relay, stream in self.slots[slot].items():
                turn = relay.turn
                if turn.ended:
                    if turn.turn_id in saved:
                        ending.add(turn.turn_id)
                    continue
                if not durable(turn.start_mark):
                    # Its turn first: recovery cannot close a turn it does not find.
                    continue
                body = relay.checkpoint()
                if body is None:
                    continue
                if stream.several or stream.tags is not None:
                    body = stream.complete(body, relay)
                taken.relays.append(relay)
                seq, encoded = stream.encode(body)
                if seq is None:
                    taken.rows.append((turn.turn_id, turn.conversation_id, now, encoded))
                else:
                    taken.parts.append((turn.turn_id, seq, now, encoded))
        except BaseException:
            self._unsaved(taken.relays)
            raise
        taken.ended = set(ending)
        return taken

    def _unsaved(self, relays: list[Relay]) -> None:
        """These relays' last looks are not in the store: each is taken again at its next look,
        moved or not, and whole."""
        for relay in relays:
            relay.checkpointed = 0
            if (stream := self.streams.get(relay)) is not None:
                stream.forget()

    def _meet(self) -> None:
        """Give each relay that started since the last tick its slot; forget those that left,
        their turns' checkpoints to be dropped."""
        running = self.gateway.running
        if running == self.seen:
            return
        for entry in running - self.seen:
            if isinstance(entry, Relay):
                several = entry.body.get("n") not in (None, 1)
                stream = self.streams[entry] = StreamCheckpoints(
                    self.met % SLOTS, several, entry.turn.tags
                )
                self.slots[stream.slot][entry] = stream
                self.met += 1
        for entry in self.seen - running:
            if not isinstance(entry, Relay) or entry not in self.streams:
                continue
            del self.slots[self.streams.pop(entry).slot][entry]
            if entry.turn.turn_id in self.saved:
                self.ending.add(entry.turn.turn_id)
        self.seen = set(running)
