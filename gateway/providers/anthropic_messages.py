"""The Anthropic Messages wire format, for deployments with `provider: anthropic`.

Pure: an OpenAI chat request in, a Messages request out; SSE frames or a message object in, the
gateway's stream events out. Clients always speak OpenAI to the gateway, so the request has to be
translated; the answer is parsed into the same events as an OpenAI stream, and Anthropic's
content blocks map onto them one to one (same indexes, explicit start and stop), so unlike the
chat parser this one never has to guess where a block ends. Thinking signatures ride on the
reasoning block's end so that a later turn could hand them back.
"""

from __future__ import annotations

import re
from typing import Any, TypeGuard

import orjson

from gateway.errors import InvalidRequest, UpstreamProtocolError
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

DEFAULT_MAX_TOKENS = 4096
THINKING_BUDGETS = {"minimal": 1024, "low": 1024, "medium": 4096, "high": 16384}
_MIN_THINKING_BUDGET = 1024

STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "stop",
}

# Anthropic error type -> the HTTP status it comes with (documented in "Errors").
ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "billing_error": 402,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}

# Anthropic error type -> the OpenAI-style `code` the gateway reports (as `errors._code_for`).
_ERROR_CODE = {
    "invalid_request_error": "bad_request",
    "authentication_error": "invalid_api_key",
    "billing_error": "billing_error",
    "permission_error": "permission_denied",
    "not_found_error": "not_found",
    "request_too_large": "payload_too_large",
    "rate_limit_error": "rate_limit_exceeded",
    "api_error": "api_error",
    "timeout_error": "request_timeout",
    "overloaded_error": "overloaded",
}

_DATA_URL = re.compile(r"^data:(?P<media>[\w.+-]+/[\w.+-]+);base64,(?P<data>.*)$", re.DOTALL)


# -- requests ------------------------------------------------------------------------------------


def to_anthropic_request(body: dict[str, Any], model: str, *, stream: bool) -> dict[str, Any]:
    """An OpenAI Chat Completions body as a Messages body. OpenAI-only parameters are dropped."""
    system, messages = _messages(body.get("messages") or [])
    out: dict[str, Any] = {"model": model, "messages": messages}
    if system:
        out["system"] = system

    explicit = body.get("max_completion_tokens")
    if explicit is None:
        explicit = body.get("max_tokens")
    max_tokens = explicit if _is_int(explicit) else None
    thinking, guessed = _thinking(body)
    budget = thinking.get("budget_tokens") if thinking is not None else None
    if thinking is not None and thinking.get("type") == "enabled" and _is_int(budget):
        if max_tokens is None:
            max_tokens = max(DEFAULT_MAX_TOKENS, budget + DEFAULT_MAX_TOKENS)
        elif guessed and budget >= max_tokens:
            # The budget was our guess: shrink it to fit the client's cap, or think not at all.
            budget = max_tokens - 1
            thinking = {**thinking, "budget_tokens": budget}
            if budget < _MIN_THINKING_BUDGET:
                thinking = None
    if thinking is not None:
        out["thinking"] = thinking
    out["max_tokens"] = DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens

    thinking_on = thinking is not None and thinking.get("type") == "enabled"
    # Extended thinking accepts only the default temperature and a top_p of 0.95 or more.
    temperature = body.get("temperature")
    if _is_number(temperature) and not (thinking_on and temperature != 1):
        out["temperature"] = temperature
    top_p = body.get("top_p")
    if _is_number(top_p) and not (thinking_on and top_p < 0.95):
        out["top_p"] = top_p
    stop = body.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        out["stop_sequences"] = [s for s in stop if isinstance(s, str)]

    tools = [_tool(t) for t in body.get("tools") or () if _is_function_tool(t)]
    if tools:
        out["tools"] = tools
        choice = _tool_choice(body.get("tool_choice"))
        if body.get("parallel_tool_calls") is False:
            choice = choice or {"type": "auto"}
            if choice["type"] != "none":
                choice["disable_parallel_tool_use"] = True
        if choice is not None:
            out["tool_choice"] = choice
    user = body.get("user")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    out["stream"] = stream
    return out


def _messages(items: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    system: list[str] = []
    out: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if not blocks:
            return
        if out and out[-1]["role"] == role:  # Anthropic requires user/assistant alternation
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})

    for message in items:
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            text = _plain_text(content)
            if text:
                system.append(text)
        elif role == "user":
            add("user", _user_blocks(content))
        elif role == "assistant":
            add("assistant", _assistant_blocks(message))
        elif role == "tool":
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": str(message.get("tool_call_id") or ""),
            }
            text = _plain_text(content)
            if text:
                result["content"] = text
            add("user", [result])
    for message in out:
        if message["role"] == "user":
            # Tool results must open the user turn that answers the tool calls.
            message["content"].sort(key=lambda block: block.get("type") != "tool_result")
    return "\n\n".join(system), out


def _plain_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


def _user_blocks(content: Any) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    blocks: list[dict[str, Any]] = []
    for part in content if isinstance(content, list) else ():
        if not isinstance(part, dict):
            continue
        kind = part.get("type")
        if kind == "text":
            text = part.get("text")
            if isinstance(text, str) and text:
                blocks.append({"type": "text", "text": text})
        elif kind == "image_url":
            blocks.append(_image(part.get("image_url")))
        else:
            raise InvalidRequest(
                f"content parts of type {kind!r} cannot be sent to an Anthropic model",
                param="messages",
            )
    return blocks


def _image(image_url: Any) -> dict[str, Any]:
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if isinstance(url, str):
        match = _DATA_URL.match(url)
        if match:
            source = {"type": "base64", "media_type": match["media"], "data": match["data"]}
            return {"type": "image", "source": source}
        if url.startswith(("http://", "https://")):
            return {"type": "image", "source": {"type": "url", "url": url}}
    raise InvalidRequest("image_url must be a base64 data URL or an http(s) URL", param="messages")


def _assistant_blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    # `reasoning_content` is dropped: without its signature Anthropic would reject it.
    blocks: list[dict[str, Any]] = []
    text = _plain_text(message.get("content"))
    if not text:
        content = message.get("content")
        if isinstance(content, list):  # a refusal part is the only other assistant part
            text = "".join(
                p["refusal"]
                for p in content
                if isinstance(p, dict) and isinstance(p.get("refusal"), str)
            )
    if text:
        blocks.append({"type": "text", "text": text})
    for call in message.get("tool_calls") or ():
        if not isinstance(call, dict):
            continue
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": _arguments(function.get("arguments")),
            }
        )
    return blocks


def _arguments(arguments: Any) -> dict[str, Any]:
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            parsed = orjson.loads(arguments)
        except orjson.JSONDecodeError:
            return {}
        if isinstance(parsed, dict):
            return parsed
    return {}


def _is_function_tool(tool: Any) -> bool:
    return (
        isinstance(tool, dict)
        and tool.get("type", "function") == "function"
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
    )


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    out: dict[str, Any] = {"name": function["name"]}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    parameters = function.get("parameters")
    out["input_schema"] = (
        parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    )
    return out


def _tool_choice(choice: Any) -> dict[str, Any] | None:
    if choice == "auto":
        return {"type": "auto"}
    if choice == "required":
        return {"type": "any"}
    if choice == "none":
        return {"type": "none"}
    if isinstance(choice, dict):
        function = choice.get("function")
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            return {"type": "tool", "name": function["name"]}
    return None


def _thinking(body: dict[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """The `thinking` object to send, and whether it was guessed from `reasoning_effort`."""
    passthrough = body.get("thinking")
    if isinstance(passthrough, dict):
        return dict(passthrough), False
    effort = body.get("reasoning_effort")
    budget = THINKING_BUDGETS.get(effort) if isinstance(effort, str) else None
    if budget is None:
        return None, False
    return {"type": "enabled", "budget_tokens": budget}, True


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


# -- responses -----------------------------------------------------------------------------------


def _int(value: Any) -> int:
    return value if _is_int(value) else 0


def openai_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Anthropic usage in OpenAI's names; the original stays under `provider_usage`."""
    cached = _int(usage.get("cache_read_input_tokens"))
    prompt = (
        _int(usage.get("input_tokens")) + cached + _int(usage.get("cache_creation_input_tokens"))
    )
    completion = _int(usage.get("output_tokens"))
    out: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    details = usage.get("output_tokens_details")
    thinking = details.get("thinking_tokens") if isinstance(details, dict) else None
    if _is_int(thinking):
        out["completion_tokens_details"] = {"reasoning_tokens": thinking}
    out["provider_usage"] = usage
    return out


def finish_reason(stop_reason: str) -> str:
    return STOP_REASONS.get(stop_reason, stop_reason)


def _failure(obj: dict[str, Any]) -> StreamFailure:
    error = obj.get("error")
    error = error if isinstance(error, dict) else {}
    kind = str(error.get("type") or "api_error")
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = "the provider reported an error in the stream"
    upstream = {
        "type": kind,
        "message": message,
        "code": _ERROR_CODE.get(kind, kind),  # as for the same error over HTTP
        "status_code": ERROR_STATUS.get(kind),
    }
    return StreamFailure(message, upstream)


def _start_events(index: int, block: dict[str, Any]) -> list[StreamEvent]:
    kind = block.get("type")
    if kind in ("text", "thinking"):
        text = block.get(kind)  # a start normally comes empty, a whole message does not
        start: list[StreamEvent] = [BlockStart(index, TEXT if kind == "text" else REASONING)]
        if isinstance(text, str) and text:
            start.append(BlockDelta(index, text))
        return start
    if kind == "redacted_thinking":
        return [BlockStart(index, "redacted_thinking", data={"data": block.get("data")})]
    if kind == "tool_use":
        id, name = block.get("id"), block.get("name")
        return [
            BlockStart(
                index,
                TOOL_CALL,
                id=id if isinstance(id, str) else None,
                name=name if isinstance(name, str) else None,
            )
        ]
    return [BlockStart(index, str(kind), data=block)]


class AnthropicStreamParser:
    def __init__(self) -> None:
        self._usage: dict[str, Any] = {}
        self._signatures: dict[int, str] = {}
        self.done = False  # saw `message_stop`
        self.finished = False  # saw a stop_reason

    def feed(self, frame: SSEFrame) -> tuple[list[StreamEvent], FrameKind]:
        data = frame.data
        if data is None or frame.event == "ping":
            return [], "comment"
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError(f"invalid JSON in a stream event: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise UpstreamProtocolError(f"a stream event is not a JSON object: {data[:200]!r}")
        kind = obj.get("type")
        if frame.event == "error" or kind == "error":
            return [_failure(obj)], "error"
        if kind == "ping":
            return [], "comment"
        if kind == "message_stop":
            self.done = True
            return [], "done"
        return self.event(obj), "data"

    def event(self, obj: dict[str, Any]) -> list[StreamEvent]:
        kind = obj.get("type")
        if kind == "message_start":
            message = obj.get("message")
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._usage = dict(usage)
            return []
        if kind == "message_delta":
            out: list[StreamEvent] = []
            delta = obj.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            if isinstance(reason, str) and reason:
                self.finished = True
                out.append(Finish(finish_reason(reason)))
            usage = obj.get("usage")
            if isinstance(usage, dict):
                self._usage = {**self._usage, **usage}  # message_delta counts are cumulative
                out.append(Usage(openai_usage(self._usage)))
            return out
        if kind not in ("content_block_start", "content_block_delta", "content_block_stop"):
            return []  # a newer event type: nothing the gateway assembles
        index = obj.get("index")
        if not _is_int(index):
            raise UpstreamProtocolError(f"a {kind} event has no integer index")
        if kind == "content_block_start":
            block = obj.get("content_block")
            if not isinstance(block, dict):
                raise UpstreamProtocolError("a content_block_start event has no content_block")
            signature = block.get("signature")
            if isinstance(signature, str) and signature:
                self._signatures[index] = signature
            return _start_events(index, block)
        if kind == "content_block_stop":
            signature = self._signatures.pop(index, None)
            return [BlockEnd(index, {"signature": signature} if signature else None)]
        delta = obj.get("delta")
        if not isinstance(delta, dict):
            return []
        delta_type = delta.get("type")
        field = {
            "text_delta": "text",
            "thinking_delta": "thinking",
            "input_json_delta": "partial_json",
        }.get(str(delta_type))
        if field is not None:
            text = delta.get(field)
            return [BlockDelta(index, text)] if isinstance(text, str) else []
        if delta_type == "signature_delta":
            signature = delta.get("signature")
            if isinstance(signature, str):
                self._signatures[index] = self._signatures.get(index, "") + signature
        return []  # citations_delta and newer delta types


def parse_message(obj: dict[str, Any]) -> list[StreamEvent]:
    """A non-streaming Messages response as the same events a stream would give."""
    if obj.get("type") == "error" or isinstance(obj.get("error"), dict):
        return [_failure(obj)]
    out: list[StreamEvent] = []
    for index, block in enumerate(obj.get("content") or ()):
        if not isinstance(block, dict):
            continue
        out += _start_events(index, block)
        if block.get("type") == "tool_use":
            out.append(BlockDelta(index, orjson.dumps(block.get("input") or {}).decode()))
        signature = block.get("signature") if block.get("type") == "thinking" else None
        out.append(BlockEnd(index, {"signature": signature} if signature else None))
    reason = obj.get("stop_reason")
    if isinstance(reason, str) and reason:
        out.append(Finish(finish_reason(reason)))
    usage = obj.get("usage")
    if isinstance(usage, dict):
        out.append(Usage(openai_usage(usage)))
    return out


def openai_error_body(status: int, body: dict[str, Any] | None) -> dict[str, Any]:
    """An Anthropic error response as the OpenAI error object the gateway hands its clients."""
    error = body.get("error") if isinstance(body, dict) else None
    error = error if isinstance(error, dict) else {}
    kind = error.get("type")
    if not isinstance(kind, str) or not kind:
        kind = next((k for k, s in ERROR_STATUS.items() if s == status), None) or (
            "invalid_request_error" if 400 <= status < 500 else "api_error"
        )
    message = error.get("message")
    if not isinstance(message, str) or not message:
        message = f"upstream returned HTTP {status}"
    return {
        "error": {
            "message": message,
            "type": kind,
            "code": _ERROR_CODE.get(kind, kind),
            "param": None,
        }
    }
