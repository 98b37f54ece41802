"""Stored responses (the Responses API): each is one turn of a conversation in the event log.

A response's history is its conversation's derived history up to where the response began;
`previous_response_id` continues that conversation, or branches it when it has moved on since
(the response chain forks, as OpenAI's does). Status and output are read back from the turn's
events: an interrupted answer is a `cancelled` response with `incomplete` items.
"""

from __future__ import annotations

import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, cast

import orjson

from gateway.conversations.derive import apply_truncates, derive_messages
from gateway.conversations.history import resends
from gateway.conversations.path import history_path
from gateway.conversations.service import Conversations, Joined
from gateway.errors import ConversationLocked, InvalidRequest, NotFound
from gateway.ids import new_id
from gateway.metering.keys import Principal
from gateway.storage.db import Db, Row
from gateway.storage.records import (
    ASSISTANT_MESSAGE,
    TURN_END,
    AssistantMessagePayload,
    ContentBlock,
    Conversation,
    Event,
    TurnEndPayload,
)
from gateway.storage.store import Store

_GENERATED_ID = re.compile(r"^resp_[0-9a-f]{32}$")  # as made in gateway.http.responses
# How long a request on a conversation waits for a turn running in it here to end.
_QUIET_WITHIN_S = 1.0


@dataclass(frozen=True)
class StoredResponse:
    id: str
    turn_id: str
    conversation_id: str
    team_id: str | None
    created_at: float
    request: dict[str, Any]
    previous_response_id: str | None
    store: bool


class ResponseStore:
    def __init__(self, store: Store, conversations: Conversations) -> None:
        self._store = store
        self._conversations = conversations

    def save(self, response: StoredResponse) -> None:
        self._store.write(
            "response",
            {
                "id": response.id,
                "turn_id": response.turn_id,
                "conversation_id": response.conversation_id,
                "team_id": response.team_id,
                "created_at": response.created_at,
                "request": orjson.dumps(response.request).decode(),
                "previous_response_id": response.previous_response_id,
                "store": int(response.store),
            },
        )

    async def get(self, response_id: str, principal: Principal) -> StoredResponse:
        async def op(db: Db) -> Row | None:
            return await db.fetchrow(
                "SELECT id, turn_id, conversation_id, team_id, created_at, request,"
                " previous_response_id, store FROM responses"
                " WHERE id = ? AND deleted_at IS NULL",
                response_id,
            )

        row = await self._store.run(op)
        if row is None and _GENERATED_ID.match(response_id):
            # An id this gateway made: another replica may be committing it right now. (Any
            # other id cannot be anywhere: waiting on it would let a client hold a request for
            # two seconds and poll the database a hundred times with one made-up id.)
            row = await self._store.settled(lambda: self._store.run(op), lambda r: r is not None)
        if row is None or not row[7] or not principal.sees(row[3]):
            raise NotFound(f"No response found with id '{response_id}'.")
        return StoredResponse(
            row[0], row[1], row[2], row[3], row[4], orjson.loads(row[5]), row[6], bool(row[7])
        )

    async def delete(self, response_id: str, principal: Principal) -> None:
        await self.get(response_id, principal)

        async def op(db: Db) -> None:
            await db.execute(
                "UPDATE responses SET deleted_at = ? WHERE id = ?", time.time(), response_id
            )

        await self._store.run(op)

    async def turn_events(self, response: StoredResponse) -> list[Event]:
        """The response's turn, as its client saw it: a truncate of its answer (recorded after
        its `turn/end`, with its turn id) applied and left out, so `turn/end` stays last."""
        events = await self._store.events(response.conversation_id)
        return apply_truncates(e for e in events if e.turn_id == response.turn_id)

    async def history(
        self,
        principal: Principal,
        previous_response_id: str | None,
        conversation_id: str | None,
        header_id: str | None = None,
        new_messages: list[dict[str, Any]] | None = None,
    ) -> tuple[Joined, list[dict[str, Any]]]:
        """Where the new response goes, and the model history it continues (tool calls left
        unanswered: the new input may answer them; see `close_unanswered`). `header_id`, the
        request's `X-Conversation-Id`, names the conversation as it does for chat: with
        `previous_response_id` or `conversation` it must name the same one. `new_messages`,
        the request's input: a previous response's next tool step, sent on that response
        again, continues the conversation it moved on (`resends`) rather than fork it."""
        named = self._conversations.named
        shown_header = header_id
        if header_id is not None:
            header_id = await named(header_id, principal)
        if conversation_id is not None:
            conversation_id = await named(conversation_id, principal)
        if header_id is not None and conversation_id is not None and header_id != conversation_id:
            raise InvalidRequest(
                f"X-Conversation-Id '{header_id}' and conversation '{conversation_id}' name"
                " different conversations.",
                param="conversation",
            )
        if previous_response_id is not None:
            previous = await self.get(previous_response_id, principal)
            if header_id is not None and header_id != previous.conversation_id:
                raise InvalidRequest(
                    f"X-Conversation-Id '{shown_header}' and previous_response_id"
                    f" '{previous_response_id}' name different conversations.",
                    param="previous_response_id",
                )
            own = await self._store.settled(
                lambda: self.turn_events(previous), lambda e: bool(e) and e[-1].type == TURN_END
            )
            if not own or own[-1].type != TURN_END:
                raise InvalidRequest(
                    f"The response '{previous_response_id}' has not finished yet.",
                    param="previous_response_id",
                )
            # A turn here that runs, or starts and even ends, while the path is read is not in
            # what was read: this request is then not the one that continues.
            running = self._store.open_turns(previous.conversation_id)
            started = self._store.turns_started(previous.conversation_id)
            path = await history_path(self._store, previous.conversation_id)
            upto = own[-1].seq
            upto_path = [e for e in path if e.seq <= upto]
            # Another request may be continuing it from the same point right now (its turn
            # runs here, or on another replica it claimed the turn first): this one forks.
            if (
                path
                and path[-1].seq == upto
                and not running
                and not self._store.open_turns(previous.conversation_id)
                and self._store.turns_started(previous.conversation_id) == started
                and await self._claimed(previous.turn_id)
            ):
                return Joined(previous.conversation_id, None, []), derive_messages(
                    upto_path, synthesize=False
                )
            if (
                new_messages
                and not running
                and self._store.turns_started(previous.conversation_id) == started
                and self._next_step(previous.conversation_id, path, upto, new_messages)
                and await self._claimed(path[-1].turn_id)
            ):
                return Joined(previous.conversation_id, None, []), derive_messages(
                    path, synthesize=False
                )
            # The conversation moved on since that response: fork it there.
            source = await self._store.get_conversation(previous.conversation_id)
            branch = Conversation(
                new_id("conv"),
                time.time(),
                parent_id=previous.conversation_id,
                parent_seq=upto,
                team_id=source.team_id if source else principal.team_id,
                key_id=principal.key_id,
            )
            return Joined(branch.id, branch, []), derive_messages(upto_path, synthesize=False)
        if conversation_id is not None:
            stored_id = conversation_id

            async def read() -> tuple[Joined, list[Event]]:
                path = await self._conversations.path(stored_id, principal)
                return Joined(stored_id, None, []), path

            joined, path = await self._when_unlocked(stored_id, read, "conversation")
            return joined, derive_messages(path, synthesize=False)
        if header_id is not None:
            named_id = header_id
            joined, path = await self._conversations.open(named_id, principal)
            if joined.create is None:
                joined, path = await self._when_unlocked(
                    joined.conversation_id,
                    lambda: self._conversations.open(named_id, principal),
                    "X-Conversation-Id",
                    (joined, path),
                )
            return joined, derive_messages(path, synthesize=False)
        conversation = Conversation(
            new_id("conv"), time.time(), team_id=principal.team_id, key_id=principal.key_id
        )
        return Joined(conversation.id, conversation, []), []

    async def _when_unlocked(
        self,
        conversation_id: str,
        read: Callable[[], Awaitable[tuple[Joined, list[Event]]]],
        param: str,
        first: tuple[Joined, list[Event]] | None = None,
    ) -> tuple[Joined, list[Event]]:
        """The conversation and its path as `read` gives them, once no turn runs in it: one
        running here may take a moment to end (a client that stopped a stream and asked again
        at once is ahead of its stop being handled), then it is read again; one still running,
        here or on another replica (its start committed, not its end), refuses the request."""
        joined, path = first if first is not None else await read()
        if self._store.open_turns(conversation_id):
            if not await self._store.quiet(conversation_id, _QUIET_WITHIN_S):
                raise ConversationLocked(param)
            joined, path = await read()
        if path and self._store.shared and not await self._store.turn_ended(path[-1].turn_id):
            raise ConversationLocked(param)
        return joined, path

    async def _claimed(self, turn_id: str) -> bool:
        """Whether this request may continue after `turn_id`: always on a store only this
        process writes (its running turns are known in memory), else the first to claim it
        (Store.claim_next)."""
        return not self._store.shared or await self._store.claim_next(turn_id, new_id("claim"))

    def _next_step(
        self,
        conversation_id: str,
        path: list[Event],
        upto: int,
        new_messages: list[dict[str, Any]],
    ) -> bool:
        """Whether the request is the next step of the turn that moved the conversation on
        from the previous response (`resends`), that turn having ended and nothing else
        running in the conversation: a step another request is taking forks, as before."""
        if path[-1].type != TURN_END or self._store.open_turns(conversation_id):
            return False
        moved = derive_messages((e for e in path if e.seq > upto), synthesize=False)
        return resends(moved, new_messages)


def answer_of(events: list[Event]) -> tuple[str, list[ContentBlock], dict[str, Any] | None]:
    """(status, assistant blocks, usage) of a response's turn, from its events."""
    found = next((e for e in reversed(events) if e.type == ASSISTANT_MESSAGE), None)
    end = next((e for e in reversed(events) if e.type == TURN_END), None)
    message = cast(AssistantMessagePayload, found.payload) if found else None
    blocks = list(message.get("content") or []) if message else []
    usage = message.get("usage") if message else None
    if end is None:
        return "in_progress", blocks, usage
    outcome = cast(TurnEndPayload, end.payload).get("status")
    if outcome == "aborted":
        return "cancelled", blocks, usage
    if outcome == "error":
        return "failed", blocks, usage
    if message is not None and message.get("finish_reason") in ("length", "content_filter"):
        return "incomplete", blocks, usage
    return "completed", blocks, usage
