"""What the user saw: an interrupted answer shortened to what its client showed.

A client that does work per chunk (renders, speaks) has had more of an answer delivered than it
showed when the user stopped it. It says how much it showed, in code points of the answer's
text, and the gateway records that as an `assistant/truncate` event of the answer's turn
(the log stays append-only), which every derivation of history applies
(`derive.apply_truncates`, `path.history_path`). docs/recording.md, "What the user saw".

Rules: only the answer of a finished turn that reached its client (interrupted, or completed:
a slow renderer may show less than its socket received); never longer than what was delivered,
nor than an earlier truncate left (the same count again changes nothing); bad input changes
nothing. The answer's usage row then counts as delivered only the share that was shown.
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

import orjson

from gateway.conversations.derive import cut_blocks, derive_messages, text_chars
from gateway.conversations.path import history_path
from gateway.conversations.recorder import TurnRecorder
from gateway.conversations.service import Conversations
from gateway.conversations.threading import recorded_fingerprint
from gateway.dialects.chat_message import assistant_message
from gateway.dialects.requests import parse_json_object
from gateway.errors import Conflict, GatewayError, InvalidRequest, NotFound
from gateway.metering.keys import Principal
from gateway.metering.tokens import count_text
from gateway.storage.db import Db, Row
from gateway.storage.records import (
    ASSISTANT_MESSAGE,
    ASSISTANT_TRUNCATE,
    AssistantMessagePayload,
    ContentBlock,
    Event,
    NewEvent,
)
from gateway.storage.writes import keep_usage_totals

OBJECT = "conversation.turn.truncation"
# How long a cancel waits for its turn to end before applying a truncate (the relay ends a
# cancelled stream within about 2 s: it gives the last frames that long to be acknowledged).
_END_WAIT_S = 10.0


def content_chars_of(body: dict[str, Any]) -> int:
    """The body's `content_chars`: a non-negative integer."""
    value = body.get("content_chars")
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequest(
            "'content_chars' must be a non-negative integer: how many characters (Unicode code"
            " points) of the answer's text the client showed.",
            param="content_chars",
        )
    return value


def cancel_content_chars(raw: bytes) -> int | None:
    """A cancel's optional body: nothing (or only white space), `{}` or a null
    `content_chars` is a plain cancel; else a JSON object with a valid `content_chars`."""
    body = parse_json_object(raw) if raw.strip() else {}
    return None if body.get("content_chars") is None else content_chars_of(body)


async def truncate(
    conversations: Conversations,
    conversation_id: str,
    turn_id: str,
    content_chars: int,
    principal: Principal,
) -> dict[str, Any]:
    """Record that the client showed `content_chars` code points of the turn's interrupted
    answer's text; the result as the API answers it. The turn must be one of the
    conversation's own (not a parent's)."""
    store = conversations.store
    # 404: unknown, another team's
    conversation_id, path = await conversations.named_path(conversation_id, principal)
    row = await _turn(conversations, turn_id)
    if row is None or row[0] != conversation_id:
        raise NotFound(f"No turn found with id '{turn_id}' in conversation '{conversation_id}'.")
    if row[1] is None:
        raise Conflict(
            f"Turn '{turn_id}' has not finished; truncate it once it has ended.",
            code="turn_in_progress",
        )
    answer = _answer(path, conversation_id, turn_id)
    if answer is None:
        raise Conflict(
            f"Turn '{turn_id}' recorded no answer that reached its client (nothing was"
            " delivered, or it failed): there is nothing to truncate.",
            code="turn_not_interrupted",
        )
    message = cast(AssistantMessagePayload, answer.payload)
    blocks = message.get("content") or []
    shown = text_chars(blocks)
    earlier = message.get("truncated")
    delivered = earlier["delivered_chars"] if earlier else shown
    if content_chars > delivered:
        raise InvalidRequest(
            f"'content_chars' {content_chars} is more than was delivered: the answer's text"
            f" is {delivered} characters.",
            param="content_chars",
            code="content_chars_past_delivered",
        )
    if content_chars > shown:
        raise InvalidRequest(
            f"'content_chars' {content_chars} would lengthen the answer: an earlier truncate"
            f" left {shown} characters, and a truncate only shortens.",
            param="content_chars",
            code="truncate_would_lengthen",
        )
    seq: int | None
    if earlier and earlier["content_chars"] == content_chars:
        seq = earlier["seq"]  # the same truncate again: already recorded
        kept = blocks
    else:
        event = NewEvent(
            conversation_id,
            turn_id,
            ASSISTANT_TRUNCATE,
            {"message_seq": answer.seq, "content_chars": content_chars},
        )
        kept = cut_blocks(blocks, content_chars)
        if conversations.threading == "auto":
            # A client continuing after this turn now sends the text it showed: the turn's
            # fingerprint becomes that history's (gateway.conversations.threading).
            before = derive_messages([e for e in path if e.seq < answer.seq], synthesize=False)
            history = [*before, assistant_message(kept)]
            request = orjson.loads(row[3])
            event.fingerprint = recorded_fingerprint(row[2], request, history)
            # And one that drops what was shown and sends a new message is that of a client
            # that dropped a stopped answer: history repair finds the turn by where it began.
            event.start_fingerprint = recorded_fingerprint(row[2], request, before)
        store.append(event)
        await store.flush()
        seq = await _seq_of(conversations, event.uid)
        await _delivered_as_shown(conversations, turn_id, answer, message, kept)
    return {
        "object": OBJECT,
        "conversation_id": conversation_id,
        "turn_id": turn_id,
        "seq": seq,
        "message_seq": answer.seq,
        "content_chars": content_chars,
        "delivered_chars": delivered,
        "content": "".join(b.get("text") or "" for b in kept if b.get("type") == "text"),
    }


def _answer(path: list[Event], conversation_id: str, turn_id: str) -> Event | None:
    """The turn's answer (not an assistant message its client sent as history)."""
    for event in reversed(path):
        if (
            event.turn_id == turn_id
            and event.conversation_id == conversation_id
            and event.type == ASSISTANT_MESSAGE
            and cast(AssistantMessagePayload, event.payload).get("source") != "client"
        ):
            return event
    return None


async def _turn(conversations: Conversations, turn_id: str) -> Row | None:
    """(conversation id, ended_at, key id, request) of a turn."""

    async def read(db: Db) -> Row | None:
        return await db.fetchrow(
            "SELECT conversation_id, ended_at, key_id, request FROM turns WHERE id = ?", turn_id
        )

    return await conversations.store.run(read)


async def _delivered_as_shown(
    conversations: Conversations,
    turn_id: str,
    answer: Event,
    message: AssistantMessagePayload,
    kept: list[ContentBlock],
) -> None:
    """The answering attempt's usage row counts as delivered only its share that was shown
    (its delivered count scaled by the tokens of what was kept over those of what was
    delivered: the provider's count stays the measure), and the conversation's totals follow.
    The billed counts are left as they are. A count only ever goes down."""
    attempt = message.get("attempt")
    if not isinstance(attempt, int):
        return
    kept_tokens = _tokens(kept)
    all_tokens = _tokens(message.get("content") or [])
    if kept_tokens >= all_tokens:
        return

    async def update(db: Db) -> None:
        usage_id = f"{turn_id}:{attempt}"
        delivered = await db.fetchval(
            "SELECT completion_delivered FROM usage WHERE id = ?", usage_id
        )
        if not delivered:
            return
        shown = -(-int(delivered) * kept_tokens // all_tokens)  # rounded up
        if shown < delivered:
            await db.execute(
                "UPDATE usage SET completion_delivered = ? WHERE id = ?", shown, usage_id
            )
            await keep_usage_totals(db, [answer.conversation_id])

    await conversations.store.transact(update)


def _tokens(blocks: list[ContentBlock]) -> int:
    return sum(
        count_text(b.get("text") or b.get("arguments") or "") + count_text(b.get("name") or "")
        for b in blocks
    )


async def _seq_of(conversations: Conversations, uid: str) -> int | None:
    async def read(db: Db) -> int | None:
        value = await db.fetchval("SELECT seq FROM events WHERE uid = ?", uid)
        return int(value) if value is not None else None

    return await conversations.store.run(read)


# -- a cancel that says what was shown ----------------------------------------------------------


async def truncate_cancelled(
    conversations: Conversations,
    turn: TurnRecorder,
    content_chars: int,
    principal: Principal,
) -> dict[str, Any]:
    """After a cancel took effect: wait for its turn to end (the relay records the delivered
    prefix once the client has acknowledged the last frames), then truncate it."""
    try:
        async with asyncio.timeout(_END_WAIT_S):
            await turn.wait_ended()
    except TimeoutError:
        raise Conflict(
            f"The request was cancelled, but its turn '{turn.turn_id}' has not ended yet;"
            " truncate it once it has.",
            code="turn_in_progress",
        ) from None
    try:
        return await truncate(
            conversations, turn.conversation_id, turn.turn_id, content_chars, principal
        )
    except GatewayError as error:
        error.message = f"The request was cancelled, but not truncated: {error.message}"
        raise


async def event_log(
    conversations: Conversations, conversation_id: str, principal: Principal
) -> list[Event]:
    """The conversation's path as recorded (`GET .../events`): its truncates listed, and the
    messages they shorten as they were delivered."""
    conversation_id, path = await conversations.named_path(conversation_id, principal)
    if any(e.type == ASSISTANT_MESSAGE and "truncated" in e.payload for e in path):
        path = await history_path(conversations.store, conversation_id, raw=True)
    return path


async def branch_point(
    conversations: Conversations, conversation_id: str, at_seq: object, principal: Principal
) -> object:
    """`at_seq` as `Conversations.branch` takes it. It counts the events of the derived path,
    which leaves truncates out: a branch asked at a truncate that ends the log (or between
    two there) is made at the last event before them, with the same history (a truncate
    applies wherever its message appears, in a branch too)."""
    if not isinstance(at_seq, int) or isinstance(at_seq, bool):
        return at_seq
    conversation_id, path = await conversations.named_path(conversation_id, principal)
    if not path or at_seq <= path[-1].seq:
        return at_seq
    if any(e.type == ASSISTANT_MESSAGE and "truncated" in e.payload for e in path):
        recorded = await history_path(conversations.store, conversation_id, raw=True)
        if at_seq <= recorded[-1].seq:
            return path[-1].seq
    return at_seq
