"""The store protocol every backend implements (SQLite now, PostgreSQL later).

Writes are queued and never block the event loop: `create_conversation`, `start_turn` and
`append` return at once, and the backend applies them in submission order. Reads are ordered
after every write submitted before them, so a request always sees the turns that ended before it
began. `append` gives each event the next `seq` of its conversation; a branch's own events
continue after its `parent_seq`.
"""

from __future__ import annotations

from typing import Protocol

from gateway.conversations.events import Conversation, Event, NewEvent, TurnStart


class Store(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def create_conversation(self, conversation: Conversation) -> None: ...

    def start_turn(self, turn: TurnStart) -> None: ...

    def append(self, event: NewEvent) -> None: ...

    async def flush(self) -> None:
        """Wait until everything submitted so far is durable."""

    async def ping(self) -> None:
        """Raise when the store cannot serve."""

    async def get_conversation(self, conversation_id: str) -> Conversation | None: ...

    async def events(self, conversation_id: str, up_to_seq: int | None = None) -> list[Event]:
        """The conversation's own events (not its parent's), in seq order."""
        ...

    async def delete_conversation(self, conversation_id: str, when: float) -> None:
        """Hide a conversation (its events stay, for audit)."""
        ...

    async def open_turns(self) -> list[tuple[str, str]]:
        """(turn id, conversation id) of every turn without a turn/end."""
        ...

    async def turn_ended(self, turn_id: str) -> bool:
        """True once the turn's `turn/end` is recorded."""
        ...


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
