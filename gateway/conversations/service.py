"""Conversation operations behind the HTTP handlers: join a request, read, branch."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from gateway.conversations.derive import derive_messages
from gateway.conversations.events import Conversation, Event, new_id
from gateway.conversations.history import HISTORY_ROLES, match_history
from gateway.conversations.store import Store, history_path
from gateway.errors import Conflict, InvalidRequest, NotFound

_CONVERSATION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass(frozen=True)
class Joined:
    conversation_id: str
    # Set when the turn needs a conversation that does not exist yet (new, or a branch).
    create: Conversation | None
    new_messages: list[dict[str, Any]]
    # The messages to forward when interrupted answers were put back (history repair).
    repaired: list[dict[str, Any]] | None = None


class Conversations:
    def __init__(self, store: Store, *, repair_interrupted: bool = True) -> None:
        self.store = store
        self.repair_interrupted = repair_interrupted

    async def join(self, requested_id: str | None, messages: list[dict[str, Any]]) -> Joined:
        history = [m for m in messages if m.get("role") in HISTORY_ROLES]
        if requested_id is None:
            cid = new_id("conv")
            return Joined(cid, Conversation(cid, time.time()), history)
        if not _CONVERSATION_ID.match(requested_id):
            raise InvalidRequest(
                "X-Conversation-Id must be 1-128 characters: letters, digits, '.', '_', ':', '-'.",
                param="X-Conversation-Id",
            )
        if await self.store.get_conversation(requested_id) is None:
            return Joined(requested_id, Conversation(requested_id, time.time()), history)
        path = await history_path(self.store, requested_id)
        match = match_history(path, messages, repair=self.repair_interrupted)
        if match.branch_at is None:
            return Joined(requested_id, None, match.new_messages, match.repaired)
        branch_id = new_id("conv")
        branch = Conversation(
            branch_id, time.time(), parent_id=requested_id, parent_seq=match.branch_at
        )
        return Joined(branch_id, branch, match.new_messages)

    async def path(self, conversation_id: str) -> list[Event]:
        try:
            return await history_path(self.store, conversation_id)
        except KeyError:
            raise NotFound(f"No conversation found with id '{conversation_id}'.") from None

    async def messages(self, conversation_id: str) -> list[dict[str, Any]]:
        return derive_messages(await self.path(conversation_id))

    async def branch(self, conversation_id: str, at_seq: Any) -> Conversation:
        if not isinstance(at_seq, int) or isinstance(at_seq, bool) or at_seq < 0:
            raise InvalidRequest("'at_seq' must be a non-negative integer.", param="at_seq")
        path = await self.path(conversation_id)
        last = path[-1].seq if path else 0
        if at_seq > last:
            raise InvalidRequest(
                f"'at_seq' {at_seq} is past the conversation's last event ({last}).", param="at_seq"
            )
        at = [e for e in path if e.seq <= at_seq]
        if at and not await self.store.turn_ended(at[-1].turn_id):
            raise Conflict(
                f"seq {at_seq} falls inside turn {at[-1].turn_id}, which has not finished.",
                code="turn_in_progress",
            )
        branch = Conversation(
            new_id("conv"), time.time(), parent_id=conversation_id, parent_seq=at_seq
        )
        self.store.create_conversation(branch)
        await self.store.flush()
        return branch
