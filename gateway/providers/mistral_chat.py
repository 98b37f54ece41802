"""Mistral's chat completions wire format: OpenAI's, with Mistral's own habits.

Pure: a request built for La Plateforme (`/v1/chat/completions`), and its answers read as the
gateway's stream events. What differs from OpenAI's chat:

- A reasoning (Magistral) model's thinking comes as content *parts*, `{"type": "thinking",
  "thinking": [{"type": "text", "text": ...}]}`, where the answer's text is a plain string (or
  `{"type": "text"}` parts in a whole answer).
- An error is `{"object": "error", "message", "type", "param", "code"}`, also when sent inside
  a stream, where OpenAI's parser looks for an `error` key.
- The request takes fewer fields, some under other names (`random_seed`, `max_tokens`,
  `tool_choice: "any"`), and refuses fields it does not know. Usage always comes on the finish
  chunk, so `stream_options` is never sent.
"""

from __future__ import annotations

from typing import Any

from gateway.providers.openai_chat import ChatStreamParser, parse_completion
from gateway.providers.params import openai_form
from gateway.stream.events import FrameKind, StreamEvent, StreamFailure
from gateway.stream.sse import SSEFrame

DEFAULT_API_BASE = "https://api.mistral.ai/v1"

# OpenAI chat fields Mistral takes under the same name.
_SAME = (
    "temperature",
    "top_p",
    "n",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "parallel_tool_calls",
    "prediction",
    "prompt_cache_key",
)
# JSON Schema keys Mistral's tool grammar refuses (as litellm strips them too).
_SCHEMA_NOISE = ("$schema", "$id", "strict")


def mistral_request(body: dict[str, Any], model: str, *, stream: bool) -> dict[str, Any]:
    """The Mistral request for an OpenAI chat body (the fields the deployment's parameter
    table let through)."""
    body = openai_form(body)
    reasons = "magistral" in model.lower()
    messages = [_message(m, reasons) for m in body.get("messages") or ()]
    out: dict[str, Any] = {
        "model": model,
        "messages": [m for m in messages if m is not None],
        "stream": stream,
    }
    for key in _SAME:
        if body.get(key) is not None:
            out[key] = body[key]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        out["max_tokens"] = limit
    if body.get("seed") is not None:
        out["random_seed"] = body["seed"]
    tools = body.get("tools")
    if tools:
        out["tools"] = [_clean_schema(tool) for tool in tools]
        choice = body.get("tool_choice")
        if choice is not None:
            out["tool_choice"] = "any" if choice == "required" else choice
    effort = body.get("reasoning_effort")
    # A Magistral model always reasons (its default `prompt_mode` is "reasoning"); the newer
    # models that take an effort take OpenAI's field.
    if effort is not None and "magistral" not in model.lower():
        out["reasoning_effort"] = effort
    return out


# What each role's message may hold (Mistral refuses any other field).
_FIELDS = {
    "system": ("role", "content"),
    "user": ("role", "content"),
    "assistant": ("role", "content", "tool_calls", "prefix"),
    "tool": ("role", "content", "tool_call_id", "name"),
}


def _message(message: Any, reasons: bool) -> dict[str, Any] | None:
    """An OpenAI chat message as Mistral takes it: its own fields only, a tool call as
    `{id, type, function}`, an earlier answer's reasoning as a thinking part for a model that
    reasons (and left out for one that does not); None for an assistant message with nothing
    in it."""
    if not isinstance(message, dict):
        return None
    role = "system" if message.get("role") == "developer" else message.get("role")
    fields = _FIELDS.get(str(role))
    if fields is None:
        return None
    out = {k: message[k] for k in fields if message.get(k) is not None}
    out["role"] = role
    if role != "assistant":
        return out
    calls = message.get("tool_calls")
    if isinstance(calls, list) and calls:
        out["tool_calls"] = [
            {"id": c.get("id"), "type": "function", "function": c.get("function")}
            for c in calls
            if isinstance(c, dict)
        ]
    else:
        out.pop("tool_calls", None)
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasons and isinstance(reasoning, str) and reasoning:
        content = out.get("content")
        if isinstance(content, list):
            parts = content
        else:
            parts = [{"type": "text", "text": content}] if content else []
        think = {"type": "thinking", "thinking": [{"type": "text", "text": reasoning}]}
        out["content"] = [{**think, "closed": True}, *parts]
    if not out.get("content") and not out.get("tool_calls"):
        return None
    return out


def _clean_schema(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: _clean_schema(v)
            for k, v in value.items()
            if k not in _SCHEMA_NOISE and not (k == "additionalProperties" and v is False)
        }
    if isinstance(value, list):
        return [_clean_schema(v) for v in value]
    return value


def _split_parts(content: list[Any]) -> tuple[str | None, str | None]:
    """Content parts as (reasoning, text): thinking parts' text, and text parts' text."""
    reasoning: list[str] = []
    text: list[str] = []
    for part in content:
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "thinking":
            for inner in part.get("thinking") or ():
                if isinstance(inner, dict) and isinstance(inner.get("text"), str):
                    reasoning.append(inner["text"])
        elif kind == "text" and isinstance(part.get("text"), str):
            text.append(part["text"])
    return ("".join(reasoning) if reasoning else None), ("".join(text) if text else None)


def _error(obj: dict[str, Any]) -> StreamFailure:
    message = obj.get("message")
    if not isinstance(message, str) or not message:
        message = str(message) if message else "Mistral reported an error in the stream"
    return StreamFailure(message, {k: v for k, v in obj.items() if k != "object"})


def _as_openai_choices(obj: dict[str, Any], key: str) -> dict[str, Any]:
    """`obj` with each choice's content parts (under `key`: delta or message) as OpenAI's
    `reasoning_content` and `content` strings; `obj` itself when no content is a list."""
    choices = obj.get("choices")
    if not isinstance(choices, list) or not any(
        isinstance(c, dict)
        and isinstance(c.get(key), dict)
        and isinstance(c[key].get("content"), list)
        for c in choices
    ):
        return obj
    out = []
    for choice in choices:
        inner = choice.get(key) if isinstance(choice, dict) else None
        if isinstance(inner, dict) and isinstance(inner.get("content"), list):
            reasoning, text = _split_parts(inner["content"])
            inner = {**inner, "content": text}
            if reasoning is not None:
                inner["reasoning_content"] = reasoning
            choice = {**choice, key: inner}
        out.append(choice)
    return {**obj, "choices": out}


class MistralStreamParser(ChatStreamParser):
    """OpenAI's chat stream parser, reading Mistral's thinking parts and error objects."""

    def feed(self, frame: SSEFrame) -> tuple[list[StreamEvent], FrameKind]:
        events, kind = super().feed(frame)
        if events and type(events[0]) is StreamFailure:
            return events, "error"
        return events, kind

    def chunk(self, obj: dict[str, Any]) -> list[StreamEvent]:
        if obj.get("object") == "error":
            return [_error(obj)]
        return super().chunk(_as_openai_choices(obj, "delta"))


def parse_mistral_completion(obj: dict[str, Any]) -> list[StreamEvent]:
    """A whole Mistral answer as the same events a stream would give."""
    if obj.get("object") == "error":
        return [_error(obj)]
    return parse_completion(_as_openai_choices(obj, "message"))
