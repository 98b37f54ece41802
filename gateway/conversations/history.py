"""Joining a request to a stored conversation.

A stateless chat client sends its whole history every time. With `X-Conversation-Id`, the
request's messages are compared with the conversation's stored surface messages: the matching
prefix is already recorded, the rest is new input. When the request disagrees with the stored
history (an edit, a regenerate, a client that dropped a message), the turn starts a branch at the
last matching event. Comparison is on what a model sees (role, text, tool calls and results);
fields clients commonly drop or add (reasoning, `name`, `refusal: null`) are ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.conversations.derive import surface_message
from gateway.conversations.events import SURFACE_TYPES, Event

HISTORY_ROLES = frozenset({"user", "assistant", "tool"})


def _text(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    role = message.get("role")
    if role == "assistant":
        calls = tuple(
            (
                call.get("id"),
                (call.get("function") or {}).get("name"),
                (call.get("function") or {}).get("arguments"),
            )
            for call in message.get("tool_calls") or ()
        )
        return ("assistant", _text(message.get("content")), calls)
    if role == "tool":
        return ("tool", message.get("tool_call_id"), _text(message.get("content")))
    return (role, _text(message.get("content")))


@dataclass(frozen=True)
class HistoryMatch:
    new_messages: list[dict[str, Any]]
    # None: the request continues the stored history. Otherwise the seq to branch at.
    branch_at: int | None


def match_history(stored: list[Event], request_messages: list[dict[str, Any]]) -> HistoryMatch:
    surface = [e for e in stored if e.type in SURFACE_TYPES]
    history = [m for m in request_messages if m.get("role") in HISTORY_ROLES]
    matched = 0
    while matched < len(surface) and matched < len(history):
        stored_message = surface_message(surface[matched])
        if stored_message is None or message_key(stored_message) != message_key(history[matched]):
            break
        matched += 1
    new = history[matched:]
    if matched == len(surface):
        return HistoryMatch(new, None)
    return HistoryMatch(new, surface[matched - 1].seq if matched else 0)
