"""Conversation operations behind the HTTP handlers: join a request, read, branch."""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from gateway.conversations.derive import derive_messages
from gateway.conversations.history import HISTORY_ROLES, branch_after, match_history
from gateway.conversations.path import history_path
from gateway.conversations.recorder import TurnRecorder
from gateway.conversations.threading import (
    LARGE_HISTORY,
    KeyedHistory,
    LookupPrints,
    keyed_history,
    lookup_prints,
)
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.ids import new_id
from gateway.metering.keys import Principal
from gateway.storage.db import StoreUnavailable
from gateway.storage.records import TURN_END, Conversation, Event, NotePayload
from gateway.storage.store import Store

log = logging.getLogger(__name__)

_CONVERSATION_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}(~[A-Za-z0-9._-]{1,64})?$")
_GENERATED_ID = re.compile(r"^conv_[0-9a-f]{32}$")


@dataclass(frozen=True)
class Joined:
    conversation_id: str
    # Set when the turn needs a conversation that does not exist yet (new, or a branch).
    create: Conversation | None
    new_messages: list[dict[str, Any]]
    # The messages to forward when interrupted answers were put back (history repair).
    repaired: list[dict[str, Any]] | None = None
    # The messages with the stored answers' signed thinking put back (HistoryMatch.restored).
    restored: list[dict[str, Any]] | None = None
    # The canonical forms of the history that threading looked up (the first history messages
    # of `keyed`, the request's messages), for the turn's end fingerprint to make no second time.
    prior_keys: list[tuple[Any, ...]] | None = None
    keyed: list[dict[str, Any]] | None = None
    # A note recorded with the turn, before its input (`conversation/note`): why threading
    # started a new conversation rather than continue one.
    note: NotePayload | None = None


@dataclass(frozen=True)
class _Threaded:
    """What threading found for a request (`Conversations._threaded`)."""

    # The conversation the request's history continues, if one does.
    existing: Conversation | None = None
    # The conversation is exactly as the matching turn ended it (`Store.ends_at`): what
    # follows the history it was found by is new.
    at_end: bool = False
    keys: list[tuple[Any, ...]] | None = None
    # The conversations the history matches when it cannot tell which one it continues.
    ambiguous: list[str] | None = None
    # The request is a fresh prompt holding its history (reshaped.py): the fingerprint of
    # that history, which the conversation's last turn must have ended with.
    reshaped: str | None = None
    # The fingerprint the conversation was found by, when it is of a turn's end alone (not
    # of where an interrupted turn began); and how many of the request's history messages
    # the history it was found by is.
    ended: str | None = None
    prior: int = 0


def _check_id(requested_id: str, where: str = "X-Conversation-Id") -> None:
    if not _CONVERSATION_ID.match(requested_id):
        raise InvalidRequest(
            f"{where} must be 1-128 characters: letters, digits, '.', '_', ':', '-'.",
            param=where,
        )


def _stored_form(conversation_id: str, principal: Principal) -> str | None:
    """The stored id of a conversation a client names, when it needs no read to know: without
    a team, the id as it is; in the stored form, the id if it is the principal's team's (else
    404). None for a team key's plain id (`Conversations.named`)."""
    team = principal.team_id
    if team is None:
        return conversation_id
    _, tilde, namespace = conversation_id.partition("~")
    if not tilde:
        return None
    if namespace != team:
        raise NotFound(f"No conversation found with id '{conversation_id}'.")
    return conversation_id


class Conversations:
    def __init__(
        self,
        store: Store,
        *,
        repair_interrupted: bool = True,
        threading: str = "auto",
        session_headers: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.repair_interrupted = repair_interrupted
        self.threading = threading  # auto | header | off (ConversationsConfig)
        self.session_headers = tuple(session_headers)

    def requested_id(
        self, headers: Mapping[str, str], metadata: Any, session: Any = None
    ) -> str | None:
        """The conversation a request names: `X-Conversation-Id`, a configured session header,
        `metadata.conversation_id`, or LiteLLM's `litellm_session_id` (`session`). 400 when
        two of them name different ones, or when threading is off."""
        named = [
            (h, v) for h in ("X-Conversation-Id", *self.session_headers) if (v := headers.get(h))
        ]
        if session is not None:
            if not isinstance(session, str) or not session:
                raise InvalidRequest(
                    "'litellm_session_id' must be a non-empty string.", param="litellm_session_id"
                )
            named.append(("litellm_session_id", session))
        if isinstance(metadata, dict) and "conversation_id" in metadata:
            value = metadata["conversation_id"]
            if not isinstance(value, str):
                raise InvalidRequest(
                    "'metadata.conversation_id' must be a string.", param="metadata.conversation_id"
                )
            named.append(("metadata.conversation_id", value))
        if not named:
            return None
        where, value = named[0]
        if self.threading == "off":
            raise InvalidRequest(
                f"{where} names a conversation, but this gateway records every request as a"
                " conversation of its own (conversations.threading: off).",
                param=where,
            )
        for other, other_value in named[1:]:
            if other_value != value:
                raise InvalidRequest(
                    f"{where} '{value}' and {other} '{other_value}' name different conversations.",
                    param=other,
                )
        _check_id(value, where)
        return value

    async def named(self, conversation_id: str, principal: Principal) -> str:
        """The stored id of a conversation a client names.

        Ids a client chooses live in its team's namespace, stored as `<id>~<team>`: two teams
        using one string never meet, and neither can tell whether the other uses it. An id
        stored as it is (one the gateway made, `conv_...`; one made before ids were scoped)
        is the team's own when it can see it; an id already in the stored form names its
        team's namespace, and another team's is not found. Without a team (open mode, the
        master key) an id stands as it is."""
        stored = _stored_form(conversation_id, principal)
        if stored is not None:
            return stored
        return (await self._scoped(conversation_id, principal))[0]

    async def _lookup(
        self, conversation_id: str, principal: Principal
    ) -> tuple[str, Conversation | None]:
        """`named` and the conversation stored under that id, if any: one read of each id."""
        stored = _stored_form(conversation_id, principal)
        if stored is not None:
            return stored, await self._conversation(stored)
        return await self._scoped(conversation_id, principal)

    async def _scoped(
        self, conversation_id: str, principal: Principal
    ) -> tuple[str, Conversation | None]:
        """A team key's plain id: the conversation stored as it is when the team sees it, else
        the one in the team's namespace."""
        made = await self._conversation(conversation_id)
        if made is not None and principal.sees(made.team_id):
            return conversation_id, made
        scoped = f"{conversation_id}~{principal.team_id}"
        return scoped, await self._conversation(scoped)

    async def join(
        self,
        requested_id: str | None,
        messages: list[dict[str, Any]],
        principal: Principal,
        user: str | None = None,
        *,
        restore_thinking: bool = True,
    ) -> Joined:
        """The conversation a request's turn goes in: the one it names, else (threading: auto)
        the one its history continues, else a new one; and which of its messages are new.
        Without `restore_thinking` (no deployment that needs the stored answers' signed
        thinking back), a history that is the conversation exactly as it ended is not read
        back to be compared: what follows it is new, whatever the conversation's length."""
        prints, keyed = None, None
        if LARGE_HISTORY.get() and self.threading == "auto":
            # Fingerprints in the size of a large body are made on a thread, the whole history
            # keyed once for the turn's end (threading.KeyedHistory).
            key_id = principal.key_id
            if requested_id is None:
                repair = self.repair_interrupted
                look = functools.partial(lookup_prints, repair=repair, whole=True)
                prints = await asyncio.to_thread(look, key_id, user, messages)
            else:
                keyed = await asyncio.to_thread(keyed_history, key_id, user, messages)
        if requested_id is not None:
            history = [m for m in messages if m.get("role") in HISTORY_ROLES]
            _check_id(requested_id)
            try:
                requested_id, existing = await self._lookup(requested_id, principal)
            except StoreUnavailable as exc:
                return self._unjoined(requested_id, history, principal, exc)
            if existing is None and self.store.open_turns(requested_id):
                # Created by a request still running, whose input the read above did not see:
                # this one goes beside it, not into it.
                existing = Conversation(requested_id, time.time(), team_id=principal.team_id)
                return _keyed(self._branch(existing, 0, history, principal), keyed, messages)
            if existing is None:
                return _keyed(Joined(*self._new(requested_id, principal), history), keyed, messages)
            self._check(existing, principal)
        else:
            threaded = await self._threaded(messages, principal, user, prints)
            existing, keys = threaded.existing, threaded.keys
            if isinstance(keys, KeyedHistory):
                keyed = keys  # for the turn's end, however the request is joined
                history = keys.history
            else:
                history = [m for m in messages if m.get("role") in HISTORY_ROLES]
            if existing is None:
                new = self._new(new_id("conv"), principal)
                note: NotePayload | None = None
                if threaded.ambiguous:
                    note = {"note": "thread_ambiguous", "candidates": threaded.ambiguous}
                return Joined(*new, history, prior_keys=keys, keyed=messages, note=note)
            if threaded.reshaped is not None:
                if await self._at_end(existing.id, threaded):
                    return Joined(existing.id, None, history, prior_keys=keys, keyed=messages)
                new = self._new(new_id("conv"), principal)
                return Joined(*new, history, prior_keys=keys, keyed=messages)
            if threaded.at_end and not restore_thinking:
                continues = history[threaded.prior :]
                return Joined(existing.id, None, continues, prior_keys=keys, keyed=messages)
            if threaded.ended is not None and not restore_thinking:
                branch = await self._branch_after(existing, threaded, history, principal)
                if branch is not None:
                    return _keyed(branch, keyed, messages)
        # A turn here that runs while the path is read, or starts (and even ends) meanwhile,
        # may be missing from it, or only its start be there.
        before, started = self.store.open_turns(existing.id), self.store.turns_started(existing.id)
        path = await self._settled_path(existing.id, within_s=2.0)
        match = match_history(path, messages, repair=self.repair_interrupted)
        running = self.store.open_turns(existing.id) | before
        if path and path[-1].type != TURN_END:
            running |= {path[-1].turn_id}  # running on another replica (or left by a crash)
        moved = self.store.turns_started(existing.id) != started
        if match.branch_at is None and (running or moved):
            # Another request continues this conversation from where this one would: its turn
            # is running, and its input already follows that point. This one branches there,
            # so neither history holds the other's turn.
            path = _before(path, running)
            match = match_history(path, messages, repair=self.repair_interrupted)
            if match.branch_at is None:
                match = replace(match, branch_at=path[-1].seq if path else 0, repaired=None)
        # Another replica's request may be continuing the same turn right now, its start not
        # committed yet: the store lets one of them continue it (a turn of the conversation's
        # own: one it inherits is continued in its parent too).
        ended = (
            _own_end(path, existing.id) if match.branch_at is None and self.store.shared else None
        )
        if ended and not await self.store.claim_next(ended.turn_id, new_id("claim")):
            match = replace(match, branch_at=ended.seq, repaired=None)
        if match.branch_at is None:
            joined = Joined(existing.id, None, match.new_messages, match.repaired, match.restored)
        else:
            joined = self._branch(
                existing, match.branch_at, match.new_messages, principal, match.restored
            )
        return _keyed(joined, keyed, messages)

    @staticmethod
    def _branch(
        parent: Conversation,
        at_seq: int,
        new_messages: list[dict[str, Any]],
        principal: Principal,
        restored: list[dict[str, Any]] | None = None,
    ) -> Joined:
        branch = Conversation(
            new_id("conv"),
            time.time(),
            parent_id=parent.id,
            parent_seq=at_seq,
            team_id=parent.team_id,  # a branch belongs with its conversation
            key_id=principal.key_id,
        )
        return Joined(branch.id, branch, new_messages, restored=restored)

    def _unjoined(
        self,
        requested_id: str,
        history: list[dict[str, Any]],
        principal: Principal,
        exc: StoreUnavailable,
    ) -> Joined:
        """A named conversation while the store cannot be read (as `Store.threads_of` does for
        threading): the turn goes ahead on the client's own history, recorded whole as new
        input under that id (its conversation is created if it does not exist when the spool
        replays). Its stored form is guessed as `named` would find it: a generated id as it
        is, a client's own in its team's namespace."""
        log.warning("store unavailable (%s): a turn continues its conversation unjoined", exc)
        stored = requested_id
        team = principal.team_id
        if team is not None and "~" not in requested_id and not _GENERATED_ID.match(requested_id):
            stored = f"{requested_id}~{team}"
        conversation = Conversation(
            stored, time.time(), team_id=principal.team_id, key_id=principal.key_id
        )
        return Joined(stored, conversation, history)

    async def _threaded(
        self,
        messages: list[dict[str, Any]],
        principal: Principal,
        user: str | None,
        prints: LookupPrints | None,
    ) -> _Threaded:
        """The conversation whose history at some turn's end is this request's history
        (gateway.conversations.threading): one indexed read, none for a first message.

        Several conversations can end with one history: runs of one agent, or users of one
        key who send no `user`, whose first exchanges were alike. The one whose last turn it
        is continues (an earlier run has moved on); when that is not one conversation, the
        request cannot tell whose history it is, and starts its own (`ambiguous`): continuing
        the wrong one would put one user's turn in another's conversation."""
        if self.threading != "auto":
            return _Threaded()
        if prints is None:
            prints = lookup_prints(principal.key_id, user, messages, repair=self.repair_interrupted)
        keys, history_print, start_print = prints.keys, prints.history_print, prints.start_print
        if history_print is None and start_print is None:
            return _Threaded(keys=keys)
        found = [
            c
            for c in await self.store.threads_of(history_print, start_print)
            if c.deleted_at is None and principal.sees(c.team_id)
        ]
        found = list({c.id: c for c in found}.values())  # (one conversation may match both)
        if len(found) > 1:
            ends = await self.store.last_fingerprints([c.id for c in found])
            at_end = [
                c
                for c in found
                if (end := ends.get(c.id)) is not None
                and (
                    (history_print is not None and end[0] == history_print)
                    or (start_print is not None and end[1] == start_print)
                )
            ]
            if len(at_end) != 1:
                return _Threaded(keys=keys, ambiguous=[c.id for c in found])
            found = at_end
        if not found:
            return _Threaded(keys=keys)
        conversation = found[0]
        as_ended = history_print is not None and self.store.ends_at(conversation.id, history_print)
        if prints.view is not None:
            return _Threaded(conversation, as_ended, keys, reshaped=history_print)
        ended = history_print if start_print is None else None
        return _Threaded(conversation, as_ended, keys, ended=ended, prior=prints.prior)

    async def _branch_after(
        self,
        existing: Conversation,
        threaded: _Threaded,
        history: list[dict[str, Any]],
        principal: Principal,
    ) -> Joined | None:
        """A regenerate or an edited message after a turn of `existing`: the request's history
        is the conversation as that turn ended it (its fingerprint says so), so only what
        follows the turn is read to find where the request departs from it, not the whole
        path, which costs in the conversation's length. None when that cannot tell (`join`
        then compares the whole path)."""
        assert threaded.ended is not None
        new = history[threaded.prior :]
        # Enough events for each new message and the turn ends and notes between them: a
        # request whose messages reach past them is compared with the whole path.
        found = await self.store.after_end(existing.id, threaded.ended, 4 * len(new) + 8)
        if found is None:
            return None
        seq, after = found
        match = branch_after(after, new, seq, repair=self.repair_interrupted)
        if match is None or match.branch_at is None:
            return None
        return self._branch(existing, match.branch_at, match.new_messages, principal)

    async def _at_end(self, conversation_id: str, threaded: _Threaded) -> bool:
        """Whether a fresh prompt's history is where the conversation is now: its last turn
        ended with it and nothing runs in it. Its prompt shares no message with the stored
        ones, so it cannot be compared with them: it continues the conversation there, or
        starts one of its own (a step taken again, or taken twice at once)."""
        if self.store.open_turns(conversation_id):
            return False
        if threaded.at_end:
            return True
        ends = await self.store.last_fingerprints([conversation_id])
        end = ends.get(conversation_id)
        return end is not None and end[0] == threaded.reshaped

    async def open(self, requested_id: str, principal: Principal) -> tuple[Joined, list[Event]]:
        """A conversation named by `X-Conversation-Id` for a client that keeps no history (the
        Responses API): its path so far, or none when the id is new (created with the turn)."""
        _check_id(requested_id)
        requested_id, existing = await self._lookup(requested_id, principal)
        if existing is None:
            return Joined(*self._new(requested_id, principal), []), []
        self._check(existing, principal)
        return Joined(requested_id, None, []), await self._settled_path(requested_id, within_s=2.0)

    @staticmethod
    def _new(conversation_id: str, principal: Principal) -> tuple[str, Conversation]:
        if principal.team_id is None and "~" in conversation_id:
            raise InvalidRequest(
                f"'{conversation_id}' is in a team's namespace (after '~'): only that team's"
                " keys start conversations there.",
                param="X-Conversation-Id",
            )
        conversation = Conversation(
            conversation_id, time.time(), team_id=principal.team_id, key_id=principal.key_id
        )
        return conversation_id, conversation

    @staticmethod
    def _check(conversation: Conversation, principal: Principal) -> None:
        if not principal.sees(conversation.team_id) or conversation.deleted_at is not None:
            # The same answer as for an id that does not exist: nothing leaks across teams.
            raise NotFound(f"No conversation found with id '{conversation.id}'.")

    async def path(self, conversation_id: str, principal: Principal) -> list[Event]:
        return (await self.named_path(conversation_id, principal))[1]

    async def named_path(
        self, conversation_id: str, principal: Principal
    ) -> tuple[str, list[Event]]:
        """The stored id of a conversation a client names (`named`) and its path (404 when
        the principal may not see it)."""
        conversation = await self._visible(conversation_id, principal)
        return conversation.id, await self._settled_path(conversation.id, within_s=1.0)

    async def _visible(self, conversation_id: str, principal: Principal) -> Conversation:
        """The conversation a client names, if the principal may see it; else 404."""
        stored, conversation = await self._lookup(conversation_id, principal)
        if conversation is None:
            raise NotFound(f"No conversation found with id '{stored}'.")
        self._check(conversation, principal)
        return conversation

    async def _conversation(self, conversation_id: str) -> Conversation | None:
        conversation = await self.store.get_conversation(conversation_id)
        if conversation is None and _GENERATED_ID.match(conversation_id):
            # An id this gateway made: another replica may be committing it right now.
            conversation = await self.store.settled(
                lambda: self.store.get_conversation(conversation_id), lambda c: c is not None
            )
        return conversation

    async def _settled_path(self, conversation_id: str, *, within_s: float) -> list[Event]:
        """The path; on a shared store, once its last turn has ended (it may have ended on
        another replica a moment ago; a turn really still running costs `within_s`)."""
        path = await history_path(self.store, conversation_id)
        if not path or not self.store.shared:
            return path
        last = path[-1].turn_id
        if not await self.store.turn_ended(last) and await self.store.settled(
            lambda: self.store.turn_ended(last), bool, within_s=within_s
        ):
            path = await history_path(self.store, conversation_id)
        return path

    async def messages(self, conversation_id: str, principal: Principal) -> list[dict[str, Any]]:
        """The model history as of now: the last turn's tool calls are pending, not aborted,
        until a next turn leaves them unanswered."""
        return derive_messages(await self.path(conversation_id, principal), close_last=False)

    async def branch(self, conversation_id: str, at_seq: Any, principal: Principal) -> Conversation:
        if not isinstance(at_seq, int) or isinstance(at_seq, bool) or at_seq < 0:
            raise InvalidRequest("'at_seq' must be a non-negative integer.", param="at_seq")
        parent = await self._visible(conversation_id, principal)
        path = await self._settled_path(parent.id, within_s=1.0)
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
            new_id("conv"),
            time.time(),
            parent_id=parent.id,
            parent_seq=at_seq,
            team_id=parent.team_id,
            key_id=principal.key_id,
        )
        self.store.create_conversation(branch)
        await self.store.flush()
        return branch

    # -- the OpenAI Conversations API ------------------------------------------------------

    async def create(
        self, principal: Principal, messages: list[dict[str, Any]], metadata: dict[str, Any]
    ) -> Conversation:
        conversation = Conversation(
            new_id("conv"),
            time.time(),
            team_id=principal.team_id,
            key_id=principal.key_id,
            metadata=metadata or None,
        )
        history = [m for m in messages if m.get("role") in HISTORY_ROLES]
        if history:
            self._record_inputs(conversation.id, conversation, history, principal, "create")
        else:
            self.store.create_conversation(conversation)
        await self.store.flush()
        return conversation

    async def get(self, conversation_id: str, principal: Principal) -> Conversation:
        return await self._visible(conversation_id, principal)

    async def update(
        self, conversation_id: str, principal: Principal, metadata: dict[str, str]
    ) -> Conversation:
        """Replace the conversation's metadata, as OpenAI's Conversations API does."""
        conversation = await self.get(conversation_id, principal)
        await self.store.flush()  # its creation committed first: the update must not precede it
        await self.store.set_conversation_metadata(conversation.id, metadata or None)
        return replace(conversation, metadata=metadata or None)

    async def delete(self, conversation_id: str, principal: Principal) -> None:
        conversation = await self.get(conversation_id, principal)
        await self.store.delete_conversation(conversation.id, time.time())

    async def add_items(
        self, conversation_id: str, principal: Principal, messages: list[dict[str, Any]]
    ) -> list[Event]:
        """Record items a client adds; returns the events that recorded them."""
        conversation_id = (await self.get(conversation_id, principal)).id
        history = [m for m in messages if m.get("role") in HISTORY_ROLES]
        turn_id = self._record_inputs(conversation_id, None, history, principal, "items")
        await self.store.flush()
        return [e for e in await self.store.events(conversation_id) if e.turn_id == turn_id]

    def _record_inputs(
        self,
        conversation_id: str,
        create: Conversation | None,
        messages: list[dict[str, Any]],
        principal: Principal,
        how: str,
    ) -> str:
        turn = TurnRecorder(
            self.store,
            conversation_id,
            new_id("turn"),
            team_id=principal.team_id,
            key_id=principal.key_id,
        )
        turn.dialect = "openai.conversations"
        turn.begin(
            new_conversation=create,
            new_messages=messages,
            request={"endpoint": f"conversations.{how}"},
        )
        turn.inputs_recorded()
        return turn.turn_id


def _keyed(joined: Joined, keyed: KeyedHistory | None, messages: list[dict[str, Any]]) -> Joined:
    """`joined`, carrying the whole history's keys when they were made ahead (by threading's
    lookup, or on a thread for a large body)."""
    return joined if keyed is None else replace(joined, prior_keys=keyed, keyed=messages)


def _before(path: list[Event], running: frozenset[str]) -> list[Event]:
    """The path up to the first event of a turn still running."""
    for i, event in enumerate(path):
        if event.turn_id in running:
            return path[:i]
    return path


def _own_end(path: list[Event], conversation_id: str) -> Event | None:
    """The path's last event, when it is the end of a turn of the conversation's own."""
    last = path[-1] if path else None
    if last is not None and last.type == TURN_END and last.conversation_id == conversation_id:
        return last
    return None
