"""Cohere's v2 chat wire format (`POST /v2/chat`).

Pure: an OpenAI chat body as Cohere's request, and Cohere's answers as the gateway's stream
events. The v2 stream names each event twice, in the SSE `event:` line and the JSON's `type`:
`message-start`; per content block `content-start` / `content-delta` / `content-end` (text, or a
reasoning model's `thinking`); a tool plan as `tool-plan-delta`; each tool call as
`tool-call-start` (id, name) / `tool-call-delta` (argument pieces) / `tool-call-end`; citations;
and `message-end`, the last event, carrying the finish reason and the usage, or, when the
answer failed after it began, the finish reason `ERROR` and the error's text. Content blocks and
tool calls are numbered apart by Cohere; the gateway's blocks are numbered in arrival order.
"""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import UpstreamProtocolError
from gateway.providers.params import openai_form
from gateway.stream.events import (
    REASONING,
    TEXT,
    TOOL_CALL,
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    FrameKind,
    StreamEvent,
    StreamFailure,
    Usage,
)
from gateway.stream.sse import SSEFrame

DEFAULT_URL = "https://api.cohere.com/v2/chat"

_FINISH = {
    "COMPLETE": "stop",
    "STOP_SEQUENCE": "stop",
    "MAX_TOKENS": "length",
    "TOOL_CALL": "tool_calls",
}
# An answer that ended so did not finish: the attempt failed.
_FAILED = ("ERROR", "TIMEOUT")
# The efforts that turn a reasoning model's thinking off; any other turns it on.
_NO_THINKING = ("none", "minimal")

# -- the request ---------------------------------------------------------------------------------


def cohere_request(body: dict[str, Any], model: str, *, stream: bool) -> dict[str, Any]:
    """The v2 chat request for an OpenAI chat body (the fields the deployment's parameter
    table let through)."""
    body = openai_form(body)
    out: dict[str, Any] = {
        "model": model,
        "messages": [m for m in map(_message, body.get("messages") or ()) if m is not None],
        "stream": stream,
    }
    for ours, theirs in (
        ("temperature", "temperature"),
        ("top_p", "p"),
        ("seed", "seed"),
        ("frequency_penalty", "frequency_penalty"),
        ("presence_penalty", "presence_penalty"),
    ):
        if body.get(ours) is not None:
            out[theirs] = body[ours]
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None:
        out["max_tokens"] = limit
    stop = body.get("stop")
    if stop is not None:
        out["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    tools = body.get("tools")
    if tools:
        out["tools"] = [
            {"type": "function", "function": t["function"]}
            for t in tools
            if isinstance(t, dict) and t.get("type") == "function"
        ]
        choice = body.get("tool_choice")
        if choice in ("required", "none"):
            out["tool_choice"] = choice.upper()
    response_format = _response_format(body.get("response_format"))
    if response_format is not None:
        out["response_format"] = response_format
    effort = body.get("reasoning_effort")
    if effort is not None:
        out["thinking"] = {"type": "disabled" if effort in _NO_THINKING else "enabled"}
    return out


def _response_format(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict):
        return None
    kind = value.get("type")
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = value.get("json_schema")
        if isinstance(schema, dict) and isinstance(schema.get("schema"), dict):
            return {"type": "json_object", "json_schema": schema["schema"]}
        return {"type": "json_object"}
    return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
        )
    return ""


def _message(message: Any) -> dict[str, Any] | None:
    """One OpenAI chat message as a v2 one."""
    if not isinstance(message, dict):
        return None
    role = message.get("role")
    content = message.get("content")
    if role in ("system", "developer"):
        return {"role": "system", "content": _text(content)}
    if role == "user":
        if isinstance(content, list):
            parts: list[dict[str, Any]] = []
            for part in content:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "text":
                    parts.append({"type": "text", "text": str(part.get("text") or "")})
                elif part.get("type") == "image_url":
                    parts.append({"type": "image_url", "image_url": part.get("image_url")})
            return {"role": "user", "content": parts}
        return {"role": "user", "content": _text(content)}
    if role == "assistant":
        out: dict[str, Any] = {"role": "assistant"}
        text = _text(content)
        calls = [
            {"id": c.get("id"), "type": "function", "function": c.get("function")}
            for c in message.get("tool_calls") or ()
            if isinstance(c, dict)
        ]
        if text or not calls:
            out["content"] = text
        if calls:
            out["tool_calls"] = calls
        return out
    if role == "tool":
        return {
            "role": "tool",
            "tool_call_id": message.get("tool_call_id"),
            "content": _text(content),
        }
    return None


# -- answers -----------------------------------------------------------------------------------


def openai_usage(usage: Any) -> dict[str, Any] | None:
    """Cohere's usage under OpenAI's names: the billed counts (what Cohere charges), else the
    model's own."""
    if not isinstance(usage, dict):
        return None
    for key in ("billed_units", "tokens"):
        counts = usage.get(key)
        if isinstance(counts, dict) and isinstance(counts.get("input_tokens"), int | float):
            prompt = int(counts["input_tokens"])
            completion = int(counts.get("output_tokens") or 0)
            out: dict[str, Any] = {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
            }
            cached = usage.get("cached_tokens")
            if isinstance(cached, int) and cached:
                out["prompt_tokens_details"] = {"cached_tokens": cached}
            return out
    return None


def _failure(message: Any, upstream: dict[str, Any]) -> StreamFailure:
    text = message if isinstance(message, str) and message else "Cohere reported an error"
    return StreamFailure(text, {"message": text, **upstream})


def _finish_events(reason: Any, usage: Any) -> list[StreamEvent]:
    out: list[StreamEvent] = [Finish(_FINISH.get(str(reason), str(reason).lower()))]
    counts = openai_usage(usage)
    if counts is not None:
        out.append(Usage(counts))
    return out


class CohereStreamParser:
    def __init__(self) -> None:
        self._next_index = 0
        self._open: dict[tuple[str, int], int] = {}  # (kind, Cohere's index) -> block index
        self.done = False  # saw `message-end`
        self.finished = False  # saw its finish reason
        self.response_id: str | None = None  # the `message-start`'s id

    def feed(self, frame: SSEFrame) -> tuple[list[StreamEvent], FrameKind]:
        data = frame.data
        if data is None:
            return [], "comment"
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError(f"invalid JSON in a stream event: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise UpstreamProtocolError(f"a stream event is not a JSON object: {data[:200]!r}")
        kind = obj.get("type") or frame.event
        delta = obj.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if kind == "message-end":
            self.done = True
            reason = delta.get("finish_reason")
            if reason in _FAILED or delta.get("error"):
                return [_failure(delta.get("error"), {"finish_reason": reason})], "error"
            out = self._close_all()
            if reason:
                self.finished = True
                out += _finish_events(reason, delta.get("usage"))
            return out, "done"
        if kind == "message-start":
            if isinstance(obj.get("id"), str):
                self.response_id = obj["id"]
            return [], "data"
        message = delta.get("message")
        message = message if isinstance(message, dict) else {}
        found = obj.get("index")
        index = found if isinstance(found, int) else 0
        if kind in ("content-start", "content-delta"):
            content = message.get("content")
            if not isinstance(content, dict):
                return [], "data"
            block = "thinking" if "thinking" in content else "text"
            text = content.get(block)
            out = self._start(("content", index), REASONING if block == "thinking" else TEXT)
            if isinstance(text, str) and text:
                out.append(BlockDelta(self._open["content", index], text))
            return out, "data"
        if kind == "tool-plan-delta":
            plan = message.get("tool_plan")
            out = self._start(("plan", 0), REASONING)
            if isinstance(plan, str) and plan:
                out.append(BlockDelta(self._open["plan", 0], plan))
            return out, "data"
        if kind in ("tool-call-start", "tool-call-delta"):
            call = message.get("tool_calls")
            call = call if isinstance(call, dict) else {}
            function = call.get("function")
            function = function if isinstance(function, dict) else {}
            out = self._start(("tool", index), TOOL_CALL, call.get("id"), function.get("name"))
            arguments = function.get("arguments")
            if isinstance(arguments, str) and arguments:
                out.append(BlockDelta(self._open["tool", index], arguments))
            return out, "data"
        if kind in ("content-end", "tool-call-end"):
            ended = self._open.pop(("content" if kind == "content-end" else "tool", index), None)
            return ([BlockEnd(ended)] if ended is not None else []), "data"
        return [], "data"  # citations, and newer event types

    def _start(
        self, key: tuple[str, int], kind: str, id: Any = None, name: Any = None
    ) -> list[StreamEvent]:
        if key in self._open:
            return []
        # A tool plan ends where the first tool call starts.
        out: list[StreamEvent] = []
        if key[0] == "tool" and (plan := self._open.pop(("plan", 0), None)) is not None:
            out.append(BlockEnd(plan))
        index = self._open[key] = self._next_index
        self._next_index += 1
        out.append(
            BlockStart(
                index,
                kind,
                id if isinstance(id, str) else None,
                name if isinstance(name, str) else None,
            )
        )
        return out

    def _close_all(self) -> list[StreamEvent]:
        out: list[StreamEvent] = [BlockEnd(i) for i in self._open.values()]
        self._open.clear()
        return out


def parse_cohere_response(obj: dict[str, Any]) -> list[StreamEvent]:
    """A whole v2 answer as the same events a stream would give."""
    message = obj.get("message")
    if not isinstance(message, dict):
        return [_failure(obj.get("message"), {})]
    out: list[StreamEvent] = []
    index = 0

    def block(kind: str, text: str, id: Any = None, name: Any = None) -> None:
        nonlocal index
        out.extend((BlockStart(index, kind, id, name), BlockDelta(index, text), BlockEnd(index)))
        index += 1

    if isinstance(message.get("tool_plan"), str) and message["tool_plan"]:
        block(REASONING, message["tool_plan"])
    for part in message.get("content") or ():
        if not isinstance(part, dict):
            continue
        if part.get("type") == "thinking" and isinstance(part.get("thinking"), str):
            block(REASONING, part["thinking"])
        elif part.get("type") == "text" and isinstance(part.get("text"), str):
            block(TEXT, part["text"])
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            arguments = function.get("arguments")
            block(
                TOOL_CALL,
                arguments if isinstance(arguments, str) else orjson.dumps(arguments).decode(),
                call.get("id"),
                function.get("name"),
            )
    reason = obj.get("finish_reason")
    if reason in _FAILED:
        return [_failure(obj.get("error"), {"finish_reason": reason})]
    return out + _finish_events(reason or "COMPLETE", obj.get("usage"))


def openai_error_body(status: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """Cohere's error JSON (`{"id", "message"}`) in the OpenAI shape; None for anything else."""
    message = body.get("message")
    if not isinstance(message, str) or "error" in body:
        return None
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}
