"""Model history from the event log (docs/recording.md, "Model history").

`derive_messages` walks the surface events of a conversation's path and returns the
provider-neutral history in OpenAI chat message shape. An interrupted answer appears exactly as
delivered, or as its client said it showed it (`assistant/truncate`: `apply_truncates`). Every
assistant tool call gets a result: where none was recorded, a synthetic one with the code
ABORTED_BEFORE_DISPATCH, so the history is valid for every provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import chain
from typing import Any, cast

from gateway.dialects.chat_message import assistant_message
from gateway.storage.records import (
    ASSISTANT_MESSAGE,
    ASSISTANT_TRUNCATE,
    TOOL_RESULT,
    USER_MESSAGE,
    AssistantMessagePayload,
    ContentBlock,
    Event,
    ToolResultPayload,
    TruncatePayload,
    UserMessagePayload,
)

ABORTED_BEFORE_DISPATCH = "ABORTED_BEFORE_DISPATCH"
ABORTED_CONTENT = f"Error: tool call aborted before dispatch [{ABORTED_BEFORE_DISPATCH}]"


def surface_message(event: Event) -> dict[str, Any] | None:
    # The payload is read as the shape its type names, bound rather than cast(): this runs for
    # every event of every history read, and a cast is a call.
    kind, payload = event.type, event.payload
    if kind == USER_MESSAGE:
        user: UserMessagePayload = payload  # type: ignore[assignment]
        message: dict[str, Any] = {"role": "user", "content": user.get("content")}
        if user.get("name"):
            message["name"] = user["name"]
        return message
    if kind == TOOL_RESULT:
        result: ToolResultPayload = payload  # type: ignore[assignment]
        return {
            "role": "tool",
            "tool_call_id": result.get("tool_call_id"),
            "content": result.get("content"),
        }
    if kind == ASSISTANT_MESSAGE:
        answer: AssistantMessagePayload = payload  # type: ignore[assignment]
        return assistant_message(answer.get("content") or [])
    return None


def derive_messages(
    events: Iterable[Event], *, synthesize: bool = True, close_last: bool = True
) -> list[dict[str, Any]]:
    """`close_last=False`: the last assistant message's unanswered tool calls stay open (the
    turn ended with them; the client runs them, and the next turn brings their results)."""
    surface = (surface_message(e) for e in apply_truncates(events))
    messages = [m for m in surface if m is not None]
    return close_unanswered(messages, close_last=close_last) if synthesize else messages


def close_unanswered(
    messages: list[dict[str, Any]], *, close_last: bool = True
) -> list[dict[str, Any]]:
    """Give every assistant tool call a result where none follows it before the next user or
    assistant message (and, with `close_last`, at the end of the history): its result from
    later in the messages, moved up to its call (providers take results only right after
    their call), else a synthetic ABORTED_BEFORE_DISPATCH one."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # tool call ids of the last assistant message still without a result
    results: dict[object, list[int]] = {}  # tool call id -> where its results are
    for i, message in enumerate(messages):
        if message.get("role") == "tool":
            results.setdefault(message.get("tool_call_id"), []).append(i)
    moved: set[int] = set()

    def close_pending(at: int) -> None:
        for call_id in pending:
            later = next((j for j in results.get(call_id, ()) if j > at and j not in moved), None)
            if later is not None:
                moved.add(later)
                out.append(messages[later])
            else:
                out.append({"role": "tool", "tool_call_id": call_id, "content": ABORTED_CONTENT})
        pending.clear()

    for i, message in enumerate(messages):
        if i in moved:
            continue
        if message.get("role") == "tool":
            if message.get("tool_call_id") in pending:
                pending.remove(message["tool_call_id"])
            out.append(message)
            continue
        if message.get("role") in ("user", "assistant"):
            close_pending(i)
        out.append(message)
        pending.extend(call.get("id") for call in message.get("tool_calls") or ())
    if close_last:
        close_pending(len(messages))
    return out


# -- what the user saw (docs/recording.md, "What the user saw") ---------------------------------


def text_chars(blocks: Iterable[ContentBlock]) -> int:
    """The length of an answer's text content (its `text` blocks joined), in code points."""
    return sum(len(b.get("text") or "") for b in blocks if b.get("type") == "text")


def cut_blocks(blocks: list[ContentBlock], content_chars: int) -> list[ContentBlock]:
    """The blocks a client showed when it showed `content_chars` code points of their text:
    everything before the first code point it did not show, that text block cut there (and
    left out when nothing of it was shown), nothing after it (tool calls, reasoning, text).
    A count that reaches the end of the text keeps every block."""
    kept: list[ContentBlock] = []
    left = content_chars
    for block in blocks:
        if block.get("type") == "text":
            text = block.get("text") or ""
            if len(text) > left:
                if left > 0:
                    kept.append({**block, "text": text[:left]})
                return kept
            left -= len(text)
        kept.append(block)
    return kept


def _content_chars(payload: TruncatePayload) -> int | None:
    value: object = payload.get("content_chars")  # as the client sent it
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def apply_truncates(events: Iterable[Event], later: Iterable[Event] = ()) -> list[Event]:
    """The events with each `assistant/truncate` applied to the message it names and left
    out: that message (a copy; the log is never changed) holds the blocks its client showed,
    and `truncated` (`seq`, `content_chars`, `delivered_chars`). `later`: truncates of these
    messages recorded past the end of `events` (after a branch point), applied as well.

    Truncates only ever shorten: of several for one message, the shortest holds."""
    events = list(events)
    cuts: dict[tuple[str, int | None], tuple[int, Event]] = {}
    found = False
    for event in chain(events, later):
        if event.type != ASSISTANT_TRUNCATE:
            continue
        found = True
        truncate = cast(TruncatePayload, event.payload)
        chars = _content_chars(truncate)
        if chars is None:
            continue
        key = (event.conversation_id, truncate.get("message_seq"))
        if key not in cuts or chars < cuts[key][0]:
            cuts[key] = (chars, event)
    if not found:
        return events
    out: list[Event] = []
    for event in events:
        if event.type == ASSISTANT_TRUNCATE:
            continue
        cut = cuts.get((event.conversation_id, event.seq))
        if cut is not None and event.type == ASSISTANT_MESSAGE:
            chars, truncating = cut
            message = cast(AssistantMessagePayload, event.payload)
            blocks = list(message.get("content") or [])
            delivered = text_chars(blocks)
            payload: AssistantMessagePayload = {
                **message,
                "content": cut_blocks(blocks, chars),
                # An answer that reached its client whole but was shown in part reads as
                # stopped where the showing stopped.
                "interrupted": bool(message.get("interrupted")) or chars < delivered,
                "truncated": {
                    "seq": truncating.seq,
                    "content_chars": chars,
                    "delivered_chars": delivered,
                },
            }
            event = Event(
                event.conversation_id,
                event.seq,
                event.turn_id,
                event.type,
                event.created_at,
                payload,
            )
        out.append(event)
    return out
