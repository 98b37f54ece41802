"""The OpenAI Conversations API's items, mapped onto the event log.

Surface events become items (`message`, `reasoning`, `function_call`, `function_call_output`),
each named by the seq that recorded it, so ids are stable and unique along a conversation's
path. Items a client adds become the same input events a chat request would record.
"""

from __future__ import annotations

from typing import Any, cast

import orjson

from gateway.errors import InvalidRequest
from gateway.storage.records import (
    ASSISTANT_MESSAGE,
    TOOL_RESULT,
    USER_MESSAGE,
    AssistantMessagePayload,
    Event,
    MessageContent,
    ToolResultPayload,
    UserMessagePayload,
)

_TEXT_PARTS = ("input_text", "output_text", "text")


def _content_parts(content: MessageContent, kind: str) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": kind, "text": content}]
    parts = []
    for part in content or ():
        if not isinstance(part, dict):
            continue
        if part.get("type") in ("text", "input_text", "output_text"):
            parts.append({"type": kind, "text": part.get("text", "")})
        elif part.get("type") == "image_url":
            url = part.get("image_url")
            parts.append(
                {
                    "type": "input_image",
                    "image_url": url.get("url") if isinstance(url, dict) else url,
                }
            )
        else:
            parts.append(part)
    return parts


def event_items(event: Event) -> list[dict[str, Any]]:
    seq = event.seq
    if event.type == USER_MESSAGE:
        user = cast(UserMessagePayload, event.payload)
        return [
            {
                "type": "message",
                "id": f"msg_{seq}",
                "role": "user",
                "status": "completed",
                "content": _content_parts(user.get("content"), "input_text"),
            }
        ]
    if event.type == TOOL_RESULT:
        result = cast(ToolResultPayload, event.payload)
        output = result.get("content")
        return [
            {
                "type": "function_call_output",
                "id": f"fco_{seq}",
                "call_id": result.get("tool_call_id"),
                "output": output if isinstance(output, str) else orjson.dumps(output).decode(),
                "status": "completed",
            }
        ]
    if event.type != ASSISTANT_MESSAGE:
        return []
    payload = cast(AssistantMessagePayload, event.payload)
    status = "incomplete" if payload.get("interrupted") else "completed"
    items: list[dict[str, Any]] = []
    texts: list[dict[str, Any]] = []
    for i, block in enumerate(payload.get("content") or ()):
        kind = block.get("type")
        if kind == "reasoning":
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{seq}_{i}",
                    "summary": [{"type": "summary_text", "text": block.get("text", "")}],
                    "status": status,
                }
            )
        elif kind == "text":
            texts.append({"type": "output_text", "text": block.get("text", ""), "annotations": []})
        elif kind == "tool_call":
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{seq}_{i}",
                    "call_id": block.get("id"),
                    "name": block.get("name"),
                    "arguments": block.get("arguments", ""),
                    "status": "completed",
                }
            )
    if texts:
        message = {"type": "message", "id": f"msg_{seq}", "role": "assistant", "status": status}
        items.insert(
            sum(1 for it in items if it["type"] == "reasoning"), {**message, "content": texts}
        )
    return items


def path_items(events: list[Event]) -> list[dict[str, Any]]:
    return [item for event in events for item in event_items(event)]


def _text_of(content: Any) -> Any:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") in _TEXT_PARTS for p in content
    ):
        return "".join(str(p.get("text", "")) for p in content)
    parts = []
    for part in content or ():
        if isinstance(part, dict) and part.get("type") in _TEXT_PARTS:
            parts.append({"type": "text", "text": part.get("text", "")})
        elif isinstance(part, dict) and part.get("type") == "input_image":
            parts.append({"type": "image_url", "image_url": {"url": part.get("image_url")}})
    return parts


def items_to_messages(items: object, param: str = "items") -> list[dict[str, Any]]:
    """Conversation items a client sends, as OpenAI chat messages (what the log records)."""
    if not isinstance(items, list):
        raise InvalidRequest(f"'{param}' must be an array of items.", param=param)
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"{param}[{i}]"
        if not isinstance(item, dict):
            raise InvalidRequest(f"'{where}' must be an object.", param=where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise InvalidRequest(
                    f"'{where}.role' must be user, assistant, system or developer.",
                    param=f"{where}.role",
                )
            messages.append({"role": role, "content": _text_of(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": item.get("name"), "arguments": item.get("arguments", "")},
            }
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id"),
                    "content": item.get("output", ""),
                }
            )
        else:
            raise InvalidRequest(
                f"'{where}.type' {kind!r} is not supported.", param=f"{where}.type"
            )
    return messages
