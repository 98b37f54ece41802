"""The Anthropic Messages wire format, for deployments with `provider: anthropic`.

Pure but for one bounded memory: an OpenAI chat request in, a Messages request out; SSE frames
or a message object in, the gateway's stream events out. Clients always speak OpenAI to the
gateway, so the request has to be translated; the answer is parsed into the same events as an
OpenAI stream, and Anthropic's content blocks map onto them one to one (same indexes, explicit
start and stop), so unlike the chat parser this one never has to guess where a block ends.

What OpenAI has no words for (docs/providers.md, "Anthropic deployments"): `response_format`
becomes JSON outputs or a forced `json_answer` tool whose input comes back as the answer's text;
`cache_control` is carried where Anthropic takes it; thinking signatures ride on the reasoning
block's end, and signed thinking goes back in later turns from an assistant message's
`thinking_blocks`, or from `SIGNED_THINKING`, the memory of recent answers that called tools.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any, TypeGuard

import orjson

from gateway.errors import InvalidRequest, UpstreamProtocolError
from gateway.providers.params import ANTHROPIC_EXTRAS, THINKING_BUDGETS, anthropic_fields
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
# The room a `reasoning_effort` budget leaves for the answer (docs/providers.md, "Thinking"):
# the client's own output cap, or this much when the cap is larger.
ANSWER_ROOM = 4096

# The tool a `response_format` becomes where Anthropic's native JSON outputs cannot serve it
# (docs/providers.md, "Structured output"). Its input is the answer: it comes back to the client
# as text, never as a tool call, so a client's own tool may not take this name.
JSON_TOOL = "json_answer"

# Anthropic stop reason -> OpenAI finish reason; one not listed (a newer one) is `stop`, so a
# client only ever sees OpenAI's own finish reasons.
STOP_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
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


def anthropic_max_tokens(body: Mapping[str, Any]) -> int:
    """The `max_tokens` an OpenAI chat body is sent to Anthropic with: the client's bound,
    raised to make room for a thinking budget the gateway added for its `reasoning_effort`,
    else `DEFAULT_MAX_TOKENS` (plus the budget). A client's own Messages body, sent as it came,
    has the same: the dialect copies its `max_tokens` and `thinking`, never guessed."""
    explicit = body.get("max_completion_tokens")
    if explicit is None:
        explicit = body.get("max_tokens")
    max_tokens = explicit if _is_int(explicit) else None
    thinking, guessed = _thinking(body)
    budget = thinking.get("budget_tokens") if thinking is not None else None
    if thinking is not None and thinking.get("type") == "enabled" and _is_int(budget):
        if max_tokens is None:
            max_tokens = budget + DEFAULT_MAX_TOKENS
        elif guessed:
            # The budget is ours, not the client's: the client's cap stays the answer's room.
            max_tokens = max(max_tokens, budget + min(max_tokens, ANSWER_ROOM))
    return DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens


def to_anthropic_request(body: dict[str, Any], model: str, *, stream: bool) -> dict[str, Any]:
    """An OpenAI Chat Completions body as a Messages body. OpenAI-only parameters are dropped."""
    thinking, _ = _thinking(body)
    thinking_on = thinking is not None and thinking.get("type") in ("enabled", "adaptive")

    system, messages = _messages(body.get("messages") or [], thinking_on=thinking_on)
    out: dict[str, Any] = {"model": model, "messages": messages}
    if system:
        out["system"] = system
    if thinking is not None:
        out["thinking"] = thinking
    out["max_tokens"] = anthropic_max_tokens(body)

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
    if any(tool["name"] == JSON_TOOL for tool in tools):
        raise InvalidRequest(
            f"The tool name {JSON_TOOL!r} is reserved for structured output on Anthropic"
            " deployments; rename the tool.",
            param="tools",
        )
    choice = _tool_choice(body.get("tool_choice")) if tools else None
    if tools and body.get("parallel_tool_calls") is False:
        choice = choice or {"type": "auto"}
        if choice["type"] != "none":
            choice["disable_parallel_tool_use"] = True
    tools, choice = _structured_output(
        out, body.get("response_format"), tools, choice, model, thinking_on=thinking_on
    )
    if tools:
        out["tools"] = tools
        if choice is not None:
            out["tool_choice"] = choice
    user = body.get("user")
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    # top_k, service_tier, safety_identifier; what cannot be carried was refused before
    # (gateway.providers.params).
    out.update(anthropic_fields(body))
    # A Messages client's own fields (context_management, container, ...), as it sent them.
    extras = body.get(ANTHROPIC_EXTRAS)
    for name, value in extras.items() if isinstance(extras, dict) else ():
        mapped = out.get(name)
        out[name] = {**value, **mapped} if isinstance(mapped, dict) else value
    out["stream"] = stream
    return out


def as_sent(body: dict[str, Any], model: str, *, stream: bool) -> dict[str, Any]:
    """A Messages client's own body (`ANTHROPIC_REQUEST`), for this deployment: its model, and
    without the gateway's own `metadata.conversation_id`."""
    out = {**body, "model": model, "stream": stream}
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and "conversation_id" in metadata:
        rest = {k: v for k, v in metadata.items() if k != "conversation_id"}
        if rest:
            out["metadata"] = rest
        else:
            del out["metadata"]
    return out


def _messages(
    items: list[Any], *, thinking_on: bool = False
) -> tuple[str | list[dict[str, Any]], list[dict[str, Any]]]:
    """The system prompt (a string, or text blocks when one carries `cache_control`) and the
    messages, alternating user and assistant."""
    system: list[list[dict[str, Any]]] = []  # each system message's text blocks
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
            if blocks := _cached(message, _text_blocks(content)):
                system.append(blocks)
        elif role == "user":
            add("user", _cached(message, _user_blocks(content)))
        elif role == "assistant":
            add("assistant", _cached(message, _assistant_blocks(message, thinking_on)))
        elif role == "tool":
            result: dict[str, Any] = {
                "type": "tool_result",
                "tool_use_id": str(message.get("tool_call_id") or ""),
            }
            if message.get("is_error") is True:  # from /v1/messages (gateway.dialects)
                result["is_error"] = True
            blocks = _text_blocks(content)
            if any("cache_control" in block for block in blocks):
                result["content"] = blocks
            elif text := "".join(block["text"] for block in blocks):
                result["content"] = text
            add("user", _cached(message, [result]))
    for message in out:
        if message["role"] == "user":
            # Tool results must open the user turn that answers the tool calls.
            message["content"].sort(key=lambda block: block.get("type") != "tool_result")
    if any("cache_control" in block for blocks in system for block in blocks):
        return [block for blocks in system for block in blocks], out
    return "\n\n".join("".join(b["text"] for b in blocks) for blocks in system), out


def _cache_control(part: dict[str, Any]) -> dict[str, Any]:
    """A part's `cache_control` (OpenAI-dialect extension, Anthropic's own shape), if any."""
    value = part.get("cache_control")
    return {"cache_control": value} if isinstance(value, dict) else {}


def _cached(message: dict[str, Any], blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A message-level `cache_control` marks the message's last block, where Anthropic takes it."""
    marker = _cache_control(message)
    if marker and blocks:
        blocks[-1] = {**blocks[-1], **marker}
    return blocks


def _text_blocks(content: Any) -> list[dict[str, Any]]:
    """Text content as text blocks, each part's `cache_control` kept (empty text left out)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    parts = content if isinstance(content, list) else ()
    return [
        {"type": "text", "text": part["text"], **_cache_control(part)}
        for part in parts
        if isinstance(part, dict) and isinstance(part.get("text"), str) and part["text"]
    ]


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
                blocks.append({"type": "text", "text": text, **_cache_control(part)})
        elif kind == "image_url":
            blocks.append({**_image(part.get("image_url")), **_cache_control(part)})
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


def _assistant_blocks(message: dict[str, Any], thinking_on: bool = False) -> list[dict[str, Any]]:
    """An assistant turn in the order Anthropic requires: its signed thinking (only with
    thinking on: Anthropic wants none otherwise), its text, its tool calls. `reasoning_content`
    alone is dropped: without its signature Anthropic would reject it."""
    calls = [call for call in message.get("tool_calls") or () if isinstance(call, dict)]
    blocks: list[dict[str, Any]] = []
    if thinking_on:
        blocks += thinking_blocks(message.get("thinking_blocks")) or SIGNED_THINKING.restore(
            [str(call.get("id") or "") for call in calls]
        )
    content = message.get("content")
    parts = _text_blocks(content)
    if any("cache_control" in part for part in parts):
        blocks += parts
    else:
        text = "".join(part["text"] for part in parts)
        if not text and isinstance(content, list):  # a refusal is the only other assistant part
            text = "".join(
                p["refusal"]
                for p in content
                if isinstance(p, dict) and isinstance(p.get("refusal"), str)
            )
        if text:
            blocks.append({"type": "text", "text": text})
    for call in calls:
        function = call.get("function")
        function = function if isinstance(function, dict) else {}
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or ""),
                "name": str(function.get("name") or ""),
                "input": _arguments(function.get("arguments")),
                **_cache_control(call),
            }
        )
    return blocks


def thinking_blocks(value: Any) -> list[dict[str, Any]]:
    """An assistant message's `thinking_blocks` (the extension field LiteLLM uses, which the
    gateway adds to answers from Anthropic) as Anthropic content blocks: signed thinking and
    redacted thinking exactly as received; anything else (a thinking block without its
    signature, which Anthropic would reject) is left out."""
    out: list[dict[str, Any]] = []
    for block in value if isinstance(value, list) else ():
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        thinking, signature = block.get("thinking"), block.get("signature")
        if kind == "thinking" and isinstance(thinking, str) and isinstance(signature, str):
            if signature:
                out.append({"type": "thinking", "thinking": thinking, "signature": signature})
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            out.append({"type": "redacted_thinking", "data": block["data"]})
    return out


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


def _is_function_tool(tool: object) -> bool:
    return (
        isinstance(tool, dict)
        and tool.get("type", "function") == "function"
        and isinstance(tool.get("function"), dict)
        and isinstance(tool["function"].get("name"), str)
    )


def _tool(tool: dict[str, Any]) -> dict[str, Any]:
    function = tool["function"]
    # `cache_control` on the tool (LiteLLM's place for it) or on its function.
    out: dict[str, Any] = {"name": function["name"], **_cache_control(function)}
    out.update(_cache_control(tool))
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


def _thinking(body: Mapping[str, Any]) -> tuple[dict[str, Any] | None, bool]:
    """The `thinking` object to send, and whether it was guessed from `reasoning_effort`."""
    passthrough = body.get("thinking")
    if isinstance(passthrough, dict):
        return dict(passthrough), False
    effort = body.get("reasoning_effort")
    budget = THINKING_BUDGETS.get(effort) if isinstance(effort, str) else None
    if budget is None:
        return None, False
    return {"type": "enabled", "budget_tokens": budget}, True


# -- structured output (docs/providers.md, "Structured output") ----------------------------------

# Claude's version in a model name: `claude-sonnet-4-5-20250929` (4, 5), `claude-3-7-sonnet-...`
# (3, 7), `claude-opus-4-20250514` (4, 0; a date is no minor version), Bedrock's
# `anthropic.claude-haiku-4-5-...-v1:0` (4, 5).
_CLAUDE_VERSION = re.compile(r"claude-(?:(?:opus|sonnet|haiku)-)?(\d+)(?:[-.](\d{1,2})(?!\d))?")
_NATIVE_JSON_SINCE = (4, 5)
_STRING_FORMATS = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"}
)


def native_json_outputs(model: str) -> bool:
    """Whether the model takes Anthropic's JSON outputs (`output_config.format`): Claude 4.5
    and later, known by its name. A name that says no version (a proxy's alias) is taken for a
    model without them: the forced tool works on every model."""
    match = _CLAUDE_VERSION.search(model)
    return match is not None and (int(match[1]), int(match[2] or 0)) >= _NATIVE_JSON_SINCE


def _structured_output(
    out: dict[str, Any],
    response_format: Any,
    tools: list[dict[str, Any]],
    choice: dict[str, Any] | None,
    model: str,
    *,
    thinking_on: bool,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """`response_format` the Anthropic way: a JSON schema as `output_config.format` where the
    model has JSON outputs; otherwise (and for `json_object`, which has no schema to give) a
    tool the model must answer with, `JSON_TOOL`, whose input the parsers turn back into the
    answer's text. Returns the tools and tool choice to send."""
    if not isinstance(response_format, dict):
        return tools, choice
    kind = response_format.get("type")
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        spec = spec if isinstance(spec, dict) else {}
        schema = spec.get("schema")
        if not isinstance(schema, dict):
            raise InvalidRequest(
                "response_format.json_schema.schema must be a JSON schema object.",
                param="response_format.json_schema.schema",
            )
        if native_json_outputs(model):
            native = {"type": "json_schema", "schema": native_schema(schema)}
            out["output_config"] = {"format": native}
            return tools, choice
        about = [str(spec[k]) for k in ("name", "description") if isinstance(spec.get(k), str)]
    elif kind == "json_object":
        schema, about = {"type": "object"}, []
    else:
        return tools, choice  # "text", and anything else is not structured output
    description = (
        "Give your final answer by calling this tool: its input is the answer, as JSON that"
        " matches the input schema. Do not answer in text."
    )
    if about:
        description += " The answer: " + ": ".join(about)
    json_tool = {"name": JSON_TOOL, "description": description, "input_schema": schema}
    if choice is not None and choice["type"] == "none":
        tools, choice = [], None  # the client's tools are not to be called: only the answer is
    if thinking_on:
        # Extended thinking refuses a forced tool choice: the description has to do.
        forced: dict[str, Any] = {"type": "auto"}
    elif not tools:
        forced = {"type": "tool", "name": JSON_TOOL}
    else:
        forced = {"type": "any"}  # one of the client's tools, or the answer
    if choice is not None and choice["type"] in ("any", "tool") and not thinking_on:
        forced = choice  # the client forces a tool call of its own
    elif choice is not None and "disable_parallel_tool_use" in choice:
        forced = {**forced, "disable_parallel_tool_use": choice["disable_parallel_tool_use"]}
    return [*tools, json_tool], forced


def native_schema(schema: Any) -> Any:
    """A JSON schema in the subset Anthropic's JSON outputs take (as its SDKs transform one):
    every object closed (`additionalProperties: false`); what the subset lacks (numeric and
    string bounds, array bounds past `minItems` 0 or 1, other string formats, defaults, ...)
    moved into the description, where the model still reads it."""
    if not isinstance(schema, dict):
        return schema
    rest = dict(schema)
    out: dict[str, Any] = {}
    for defs in ("$defs", "definitions"):
        if isinstance(rest.get(defs), dict):
            out[defs] = {name: native_schema(s) for name, s in rest.pop(defs).items()}
    if isinstance(rest.get("$ref"), str):
        out["$ref"] = rest.pop("$ref")
        return out
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(rest.get(key), list):
            out["allOf" if key == "allOf" else "anyOf"] = [native_schema(s) for s in rest.pop(key)]
    enum = rest.get("enum")
    if isinstance(enum, list) and enum and all(_is_primitive(v) for v in enum):
        out["enum"] = rest.pop("enum")
    if "const" in rest and _is_primitive(rest["const"]):
        out["const"] = rest.pop("const")
    kind = rest.pop("type", None)
    if kind is not None and "enum" not in out and "const" not in out:
        out["type"] = kind
    for key in ("description", "title"):
        if isinstance(rest.get(key), str):
            out[key] = rest.pop(key)
    kinds = kind if isinstance(kind, list) else [kind]
    if "object" in kinds or isinstance(rest.get("properties"), dict):
        properties = rest.pop("properties", None)
        properties = properties if isinstance(properties, dict) else {}
        out["properties"] = {name: native_schema(s) for name, s in properties.items()}
        rest.pop("additionalProperties", None)
        out["additionalProperties"] = False
        if isinstance(rest.get("required"), list):
            out["required"] = rest.pop("required")
    if "array" in kinds:
        if "items" in rest:
            out["items"] = native_schema(rest.pop("items"))
        if rest.get("minItems") in (0, 1):
            out["minItems"] = rest.pop("minItems")
    if "string" in kinds and rest.get("format") in _STRING_FORMATS:
        out["format"] = rest.pop("format")
    if rest:
        note = "{" + ", ".join(f"{k}: {orjson.dumps(v).decode()}" for k, v in rest.items()) + "}"
        out["description"] = f"{out['description']}\n\n{note}" if "description" in out else note
    return out


def _is_primitive(value: object) -> bool:
    return value is None or isinstance(value, str | int | float | bool)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


# -- responses -----------------------------------------------------------------------------------


def _int(value: object) -> int:
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
    return STOP_REASONS.get(stop_reason, "stop")


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
        if name == JSON_TOOL:
            return [BlockStart(index, TEXT)]  # structured output: the input is the answer
        return [
            BlockStart(
                index,
                TOOL_CALL,
                id=id if isinstance(id, str) else None,
                name=name if isinstance(name, str) else None,
            )
        ]
    return [BlockStart(index, str(kind), data=block)]


class SignedThinking:
    """The signed thinking of recent Anthropic answers that called tools, by their tool_use ids.

    A client that keeps no `thinking_blocks` (LangChain, a loop that rebuilds the assistant
    message from its text and tool calls) sends such an answer back without them, and with
    thinking on Anthropic refuses that tool turn. Its tool_use ids (Anthropic's, unique) name
    the answer it was, so the request builder can put its thinking back, exactly as received.
    Kept in this process only and bounded (least recently used first out): it covers a tool loop
    that stays on one gateway; the `thinking_blocks` field covers the rest
    (docs/providers.md, "Thinking")."""

    def __init__(self, max_chars: int = 8_000_000) -> None:
        self._entries: OrderedDict[str, tuple[tuple[str, ...], list[dict[str, Any]], int]] = (
            OrderedDict()
        )
        self._chars = 0
        self._max_chars = max_chars

    def remember(self, ids: list[str], blocks: list[dict[str, Any]]) -> None:
        if not ids or not blocks:
            return
        size = sum(len(str(v)) for block in blocks for v in block.values())
        if size > self._max_chars:
            return
        old = self._entries.pop(ids[0], None)
        if old is not None:
            self._chars -= old[2]
        self._entries[ids[0]] = (tuple(ids), blocks, size)
        self._chars += size
        while self._chars > self._max_chars:
            self._chars -= self._entries.popitem(last=False)[1][2]

    def restore(self, ids: list[str]) -> list[dict[str, Any]]:
        """The thinking of the answer whose tool calls had exactly these ids, or none."""
        entry = self._entries.get(ids[0]) if ids else None
        if entry is None or entry[0] != tuple(ids):
            return []
        self._entries.move_to_end(ids[0])
        return [dict(block) for block in entry[1]]


SIGNED_THINKING = SignedThinking()


class AnthropicStreamParser:
    def __init__(self) -> None:
        self._usage: dict[str, Any] = {}
        self._signatures: dict[int, str] = {}
        self._thinking: dict[int, list[str]] = {}  # thinking blocks' text, until they end
        self._signed: list[dict[str, Any]] = []  # this answer's ended thinking blocks, in order
        self._tool_ids: list[str] = []  # its tool calls' ids
        self.done = False  # saw `message_stop`
        self.finished = False  # saw a stop_reason
        self.response_id: str | None = None  # the `message_start`'s message id

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
            if isinstance(message, dict) and isinstance(message.get("id"), str):
                self.response_id = message["id"]
            usage = message.get("usage") if isinstance(message, dict) else None
            if isinstance(usage, dict):
                self._usage = dict(usage)
                # The exact input and cache counts, kept for a turn cut before message_delta
                # brings the whole count (gateway.metering.usage); not a final usage.
                return [Usage({**openai_usage(self._usage), "partial": True})]
            return []
        if kind == "message_delta":
            out: list[StreamEvent] = []
            delta = obj.get("delta")
            reason = delta.get("stop_reason") if isinstance(delta, dict) else None
            if isinstance(reason, str) and reason:
                self.finished = True
                out.append(Finish(_finish(reason, bool(self._tool_ids))))
                SIGNED_THINKING.remember(self._tool_ids, self._signed)
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
            self._note_start(index, block)
            return _start_events(index, block)
        if kind == "content_block_stop":
            signature = self._signatures.pop(index, None)
            thinking = self._thinking.pop(index, None)
            if thinking is not None and signature:
                self._signed.append(
                    {"type": "thinking", "thinking": "".join(thinking), "signature": signature}
                )
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
            if not isinstance(text, str):
                return []
            if field == "thinking" and index in self._thinking:
                self._thinking[index].append(text)
            return [BlockDelta(index, text)]
        if delta_type == "signature_delta":
            signature = delta.get("signature")
            if isinstance(signature, str):
                self._signatures[index] = self._signatures.get(index, "") + signature
        return []  # citations_delta and newer delta types

    def _note_start(self, index: int, block: dict[str, Any]) -> None:
        """What the signed-thinking memo needs of a block that starts."""
        kind = block.get("type")
        if kind == "thinking":
            text = block.get("thinking")
            self._thinking[index] = [text] if isinstance(text, str) and text else []
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            self._signed.append({"type": "redacted_thinking", "data": block["data"]})
        elif kind == "tool_use" and block.get("name") != JSON_TOOL:
            self._tool_ids.append(str(block.get("id") or ""))


def _finish(stop_reason: str, tool_calls: bool) -> str:
    """The finish reason; a `tool_use` stop with no tool call but the structured-output tool
    is an answer, so `stop`."""
    if stop_reason == "tool_use" and not tool_calls:
        return "stop"
    return finish_reason(stop_reason)


def parse_message(obj: dict[str, Any]) -> list[StreamEvent]:
    """A non-streaming Messages response as the same events a stream would give."""
    if obj.get("type") == "error" or isinstance(obj.get("error"), dict):
        return [_failure(obj)]
    out: list[StreamEvent] = []
    signed: list[dict[str, Any]] = []
    tool_ids: list[str] = []
    for index, block in enumerate(obj.get("content") or ()):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        out += _start_events(index, block)
        if kind == "tool_use":
            out.append(BlockDelta(index, orjson.dumps(block.get("input") or {}).decode()))
            if block.get("name") != JSON_TOOL:
                tool_ids.append(str(block.get("id") or ""))
        signature = block.get("signature") if kind == "thinking" else None
        if isinstance(signature, str) and signature and isinstance(block.get("thinking"), str):
            thinking = {"type": "thinking", "thinking": block["thinking"], "signature": signature}
            signed.append(thinking)
        elif kind == "redacted_thinking" and isinstance(block.get("data"), str):
            signed.append({"type": "redacted_thinking", "data": block["data"]})
        out.append(BlockEnd(index, {"signature": signature} if signature else None))
    reason = obj.get("stop_reason")
    if isinstance(reason, str) and reason:
        out.append(Finish(_finish(reason, bool(tool_ids))))
        SIGNED_THINKING.remember(tool_ids, signed)
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
