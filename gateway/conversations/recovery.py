"""Closing the turns a dead process left open (`kill -9`, a crash, a lost host), with what
their clients had been delivered (docs/operations.md, "Stopping and crashing").

While a turn streams, its process checkpoints it (gateway.pipeline.checkpoints): the blocks of
the frames its client has, and what each attempt is known to cost. When the process dies, the
same instance at its next start, or another replica once its heartbeat is stale, claims the
turn and closes it from that checkpoint: the delivered prefix becomes the interrupted answer
(so follow-ups include what the user read), its usage is metered as an estimate, and the turn
ends `aborted` with reason `crash_recovered`. A turn with no checkpoint (it had delivered
nothing yet, or had not lived to its first) keeps what was recorded of it, its input.

A checkpoint is its row, written whole, and the parts written after it (what its blocks' text
gained, the attempts or their durations as they stood); a row from before parts existed is
whole by itself.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from gateway import metrics
from gateway.conversations.derive import derive_messages
from gateway.metering.tokens import count_messages, vendor_of
from gateway.storage.records import ASSISTANT_MESSAGE, TURN_END, NewEvent
from gateway.storage.store import Store

if TYPE_CHECKING:
    from gateway.metering.usage import Meter


class PeerWatch:
    """Whether this replica has watched the store long enough to take a silent peer for dead.

    A peer is dead when it missed two heartbeats while this replica's own beats reached the
    store. After an outage of the store every replica's last beat is old, the living ones' as
    much as the dead ones': so after this replica's own beats were interrupted, a peer gets
    those two beats' time again, counted from this replica's first beat back, before its turns
    are taken from it."""

    def __init__(self, beat_s: float) -> None:
        self.beat_s = beat_s
        self.stale_s = 2 * beat_s
        self._since: float | None = None  # the first beat of the current unbroken run
        self._last: float | None = None  # the last time the store was known reachable

    def beat(self, now: float) -> bool:
        """A beat reached the store at `now`; True when peers silent for `stale_s` are dead."""
        if self._since is None or self._last is None or now - self._last > 1.5 * self.beat_s:
            self._since = now  # a beat was missed (or late): the watch starts again
        self._last = now
        return now - self._since >= self.stale_s

    def reached(self, now: float) -> None:
        """The store answered at `now` (a sweep's claims): not a gap in the watch."""
        self._last = now

    def missed(self) -> None:
        self._last = None


async def recover_open_turns(
    store: Store, meter: Meter | None, *, at_start: bool, stale_s: float | None = None
) -> int:
    """Close the open turns of this process's previous life (`at_start`), and, given
    `stale_s`, those of replicas whose heartbeat stopped more than `stale_s` ago; how many
    were closed."""
    stale_before = time.time() - stale_s if stale_s is not None else float("-inf")
    orphans = await store.claim_orphaned_turns(own=at_start, stale_before=stale_before)
    parts = await store.take_checkpoint_parts([turn_id for turn_id, _, _ in orphans])
    for turn_id, conversation_id, body in orphans:
        end: dict[str, Any] = {
            "status": "aborted",
            "reason": "crash_recovered",
            "attempts": None,
            "usage": None,
        }
        if body is not None:
            checkpoint = checkpoint_of(body, parts.get(turn_id, ()))
            if (message := checkpoint["message"]) is not None:
                store.append(NewEvent(conversation_id, turn_id, ASSISTANT_MESSAGE, message))
            end["attempts"] = len(checkpoint["attempts"])
            if checkpoint.get("response_id") is not None:  # not in an older gateway's
                end["response_id"] = checkpoint["response_id"]
            if meter is not None and checkpoint["attempts"]:
                await _estimate_prompts(store, conversation_id, turn_id, checkpoint["attempts"])
                end["metered"] = meter.recovered(turn_id, conversation_id, checkpoint)
        store.append(NewEvent(conversation_id, turn_id, TURN_END, end))
    if orphans:
        metrics.TURNS.labels("aborted", "crash_recovered").inc(len(orphans))
        await store.flush()
    return len(orphans)


def checkpoint_of(body: str, parts: Sequence[str] = ()) -> dict[str, Any]:
    """A turn's last checkpoint (TurnRecorder.checkpoint): its row's body with the parts
    written after it (in their order) applied, those numbered on from it without a gap
    (gateway.pipeline.checkpoints.StreamCheckpoints)."""
    checkpoint: dict[str, Any] = orjson.loads(body)
    seq = checkpoint.pop("seq", 0)
    message = checkpoint["message"]
    if not parts or message is None:  # (a turn's first part always follows a message)
        return checkpoint
    texts = [[block.get("text", "")] for block in message["content"]]
    for part in map(orjson.loads, parts):
        if part["seq"] <= seq:  # (of an earlier whole checkpoint)
            continue
        if part["seq"] != seq + 1:  # one the store never took: what follows needs it
            break
        seq += 1
        if "attempts" in part:
            checkpoint["attempts"] = part["attempts"]
        else:
            for attempt, duration in zip(checkpoint["attempts"], part["durations"], strict=True):
                attempt["duration_ms"] = duration
        for position, text in part["grown"]:
            texts[position].append(text)
    for block, pieces in zip(message["content"], texts, strict=True):
        if "text" in block:  # (a tool call has none: it never grows)
            block["text"] = "".join(pieces)
    return checkpoint


async def _estimate_prompts(
    store: Store, conversation_id: str, turn_id: str, attempts: list[dict[str, Any]]
) -> None:
    """Each attempt whose provider never said its prompt's size gets a tokenizer count of the
    conversation's messages up to the turn (`prompt_tokens`). A floor: a branch's inherited
    history and the request's system prompt and tools are not counted."""
    unknown = [a for a in attempts if a["usage"] is None]
    if not unknown:
        return
    events = await store.events(conversation_id)
    last = max((i for i, e in enumerate(events) if e.turn_id == turn_id), default=-1)
    messages = derive_messages(events[: last + 1])
    for attempt in unknown:
        model = str(attempt["route"].get("model"))
        vendor = vendor_of(str(attempt["route"].get("provider")), model)
        # Off the event loop: the tokenizer may still be loading.
        attempt["prompt_tokens"] = await asyncio.to_thread(count_messages, messages, vendor, model)
