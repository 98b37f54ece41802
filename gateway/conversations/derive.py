"""Model history from the event log (docs/recording.md, "Model history").

`derive_messages` walks the surface events of a conversation's path and returns the
provider-neutral history in OpenAI chat message shape. An interrupted answer appears exactly as
delivered. Every assistant tool call gets a result: where none was recorded, a synthetic one
with the code ABORTED_BEFORE_DISPATCH, so the history is valid for every provider.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gateway.conversations.events import (
    ASSISTANT_MESSAGE,
    TOOL_RESULT,
    USER_MESSAGE,
    Event,
)

ABORTED_BEFORE_DISPATCH = "ABORTED_BEFORE_DISPATCH"
ABORTED_CONTENT = f"Error: tool call aborted before dispatch [{ABORTED_BEFORE_DISPATCH}]"


def assistant_message(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    """An `assistant/message` payload's blocks as one OpenAI chat assistant message."""
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    reasoning = "".join(b.get("text", "") for b in blocks if b.get("type") == "reasoning")
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": b.get("arguments", "")},
        }
        for b in blocks
        if b.get("type") == "tool_call"
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if (text or not calls) else None,
    }
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = calls
    return message


def surface_message(event: Event) -> dict[str, Any] | None:
    payload = event.payload
    if event.type == USER_MESSAGE:
        message: dict[str, Any] = {"role": "user", "content": payload.get("content")}
        if payload.get("name"):
            message["name"] = payload["name"]
        return message
    if event.type == TOOL_RESULT:
        return {
            "role": "tool",
            "tool_call_id": payload.get("tool_call_id"),
            "content": payload.get("content"),
        }
    if event.type == ASSISTANT_MESSAGE:
        return assistant_message(payload.get("content") or [])
    return None


def derive_messages(
    events: Iterable[Event], *, synthesize: bool = True, close_last: bool = True
) -> list[dict[str, Any]]:
    """`close_last=False`: the last assistant message's unanswered tool calls stay open (the
    turn ended with them; the client runs them, and the next turn brings their results)."""
    messages = [m for m in (surface_message(e) for e in events) if m is not None]
    return close_unanswered(messages, close_last=close_last) if synthesize else messages


def close_unanswered(
    messages: list[dict[str, Any]], *, close_last: bool = True
) -> list[dict[str, Any]]:
    """Give every assistant tool call a result: a synthetic ABORTED_BEFORE_DISPATCH one where
    none follows it before the next user or assistant message (and, with `close_last`, at the
    end of the history)."""
    out: list[dict[str, Any]] = []
    pending: list[str] = []  # tool call ids of the last assistant message still without a result

    def close_pending() -> None:
        for call_id in pending:
            out.append({"role": "tool", "tool_call_id": call_id, "content": ABORTED_CONTENT})
        pending.clear()

    for message in messages:
        if message.get("role") == "tool":
            if message.get("tool_call_id") in pending:
                pending.remove(message["tool_call_id"])
            out.append(message)
            continue
        if message.get("role") in ("user", "assistant"):
            close_pending()
        out.append(message)
        pending.extend(call.get("id") for call in message.get("tool_calls") or ())
    if close_last:
        close_pending()
    return out
