"""A conversation's path: its own events after its ancestors' up to each branch point."""

from __future__ import annotations

import orjson

from gateway.conversations.derive import apply_truncates
from gateway.storage.db import Db
from gateway.storage.records import ASSISTANT_TRUNCATE, Conversation, Event
from gateway.storage.store import Store


async def history_path(
    store: Store, conversation_id: str, up_to_seq: int | None = None, *, raw: bool = False
) -> list[Event]:
    """Every event on the conversation's path: ancestors' events through each branch point,
    then its own, in seq order. Raises KeyError for an unknown conversation.

    Each `assistant/truncate` is applied to the message it names and left out
    (`apply_truncates`), also one recorded in an ancestor after the branch point: a truncate
    says what the user saw of that message, wherever the message appears. `raw`: the events
    as recorded (the event log as the API lists it)."""
    chain: list[tuple[Conversation, int | None]] = []
    conversation = await store.get_conversation(conversation_id)
    if conversation is None:
        raise KeyError(conversation_id)
    limit = up_to_seq
    while True:
        chain.append((conversation, limit))
        if conversation.parent_id is None:
            break
        parent_seq = conversation.parent_seq or 0
        limit = parent_seq if limit is None else min(limit, parent_seq)
        parent = await store.get_conversation(conversation.parent_id)
        if parent is None:
            break  # a parent that vanished leaves the branch's own events
        conversation = parent
    events: list[Event] = []
    later: list[Event] = []
    for conversation, limit in reversed(chain):
        events.extend(await store.events(conversation.id, limit))
        if limit is not None and not raw:
            later.extend(await truncates_after(store, conversation.id, limit))
    return events if raw else apply_truncates(events, later)


async def truncates_after(store: Store, conversation_id: str, seq: int) -> list[Event]:
    """The conversation's `assistant/truncate` events after `seq` (its own only)."""

    async def read(db: Db) -> list[Event]:
        rows = await db.fetch(
            "SELECT seq, turn_id, created_at, payload FROM events"
            " WHERE conversation_id = ? AND seq > ? AND type = ? ORDER BY seq",
            conversation_id,
            seq,
            ASSISTANT_TRUNCATE,
        )
        return [
            Event(conversation_id, s, t, ASSISTANT_TRUNCATE, c, orjson.loads(p))
            for s, t, c, p in rows
        ]

    return await store.run(read)
