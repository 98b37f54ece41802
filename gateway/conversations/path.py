"""A conversation's path: its own events after its ancestors' up to each branch point."""

from __future__ import annotations

from gateway.conversations.events import Conversation, Event
from gateway.storage.store import Store


async def history_path(
    store: Store, conversation_id: str, up_to_seq: int | None = None
) -> list[Event]:
    """Every event on the conversation's path: ancestors' events through each branch point,
    then its own, in seq order. Raises KeyError for an unknown conversation."""
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
    for conversation, limit in reversed(chain):
        events.extend(await store.events(conversation.id, limit))
    return events
