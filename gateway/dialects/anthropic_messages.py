"""The Anthropic Messages API, as clients send it (`POST /v1/messages`).

Why: Anthropic SDK clients (and tools built on them) should be able to use the gateway against
any provider. Internally the gateway speaks OpenAI Chat Completions request bodies and its own
stream events, so this dialect is a pair of translations and nothing else (pure, no I/O):

- in:  an Anthropic Messages request body -> the equivalent OpenAI Chat Completions body
  (`parse_request`), validated so that a bad request fails with `InvalidRequest` naming the
  field, as Anthropic's own API would;
- out: the gateway's stream events -> Anthropic's SSE events (`MessagesStreamRenderer`), or
  assembled blocks -> an Anthropic `Message` (`message_body`), and gateway errors -> Anthropic
  error objects (`error_body`).

It is the mirror image of `gateway.providers.anthropic_messages` (the upstream direction) and
shares its tables. A few choices make the output what Anthropic clients expect rather than a
literal transcription of the events:

- Text and thinking blocks are opened on their first non-empty delta, so an OpenAI upstream's
  empty `content: ""` chunk never becomes an empty text block (which an Anthropic client would
  send back next turn, and Anthropic rejects).
- `message_delta` (stop reason and usage) is sent by `done()`, right before `message_stop`, not
  at `Finish`: OpenAI upstreams report usage in a chunk after the finish reason, and the
  Anthropic parser yields `Finish` before `Usage`, so only then is the count known.
- The renderer lives for the whole response: a continuation attempt restarts the gateway's block
  indexes, so a `BlockStart` for an index already seen opens a new content block.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeGuard

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.dialects.openai_chat import ChatBody
from gateway.dialects.requests import (
    MAX_OUTPUT_TOKENS,
    Shape,
    check_shape,
    parse_json_object,
    validated,
)
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    ThreadUnsupported,
    UpstreamStreamError,
)
from gateway.ids import random_hex, sortable_hex
from gateway.providers.anthropic_messages import ERROR_STATUS, STOP_REASONS
from gateway.providers.params import ANTHROPIC_EXTRAS, ANTHROPIC_REQUEST, ClientBody
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import (
    REASONING,
    TEXT,
    TOOL_CALL,
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    StreamEvent,
    Usage,
)

REDACTED_THINKING = "redacted_thinking"  # the kind the upstream Anthropic parser gives it

# OpenAI finish reason -> Anthropic stop reason. A reason that already is an Anthropic one
# (the upstream parser passes unknown ones through) is kept; anything else is `end_turn`.
FINISH_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_ANTHROPIC_STOP_REASONS = frozenset(STOP_REASONS) | {"model_context_window_exceeded"}

# HTTP status -> Anthropic error type (the inverse of the upstream table).
ERROR_TYPES = {status: kind for kind, status in ERROR_STATUS.items()}

# thinking.budget_tokens -> reasoning_effort for providers that take an effort instead.
_EFFORT_CAPS = ((2048, "low"), (8192, "medium"))


# -- requests ------------------------------------------------------------------------------------


class AnthropicTextBlock(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    type: Literal["text"]
    text: str


class AnthropicMessage(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    # `system` inside `messages`: instructions at their place in the history (Claude Code
    # sends its environment so).
    role: Literal["user", "assistant", "system"]
    content: str | list[dict[str, Any]]

    @field_validator("content", mode="before")
    @classmethod
    def _content_shape(cls, value: object) -> object:
        # Checked here so that a bad value yields one error at `content`, not one per union arm.
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            for i, block in enumerate(value):
                if not isinstance(block, dict) or not isinstance(block.get("type"), str):
                    raise ValueError(f"content[{i}] must be a content block object with a type")
            return value
        raise ValueError("content must be a string or a list of content blocks")


class AnthropicTool(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    type: str | None = None  # absent or "custom"; Anthropic's server tools have their own
    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class AnthropicToolChoice(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class AnthropicThinking(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    type: str  # enabled, disabled, adaptive, ... (newer types pass through)
    budget_tokens: int | None = Field(None, ge=1024, strict=True)


class AnthropicMetadata(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    user_id: str | None = None


class AnthropicRequest(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    model: str = Field(description="A model alias from the gateway's config.")
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=MAX_OUTPUT_TOKENS, strict=True)
    system: str | list[AnthropicTextBlock] | None = None
    stream: bool | None = None
    temperature: float | None = Field(None, ge=0, le=1)
    top_p: float | None = Field(None, ge=0, le=1)
    top_k: int | None = Field(None, ge=0, strict=True)
    stop_sequences: list[str] | None = None
    tools: list[AnthropicTool] | None = None
    tool_choice: AnthropicToolChoice | None = None
    thinking: AnthropicThinking | None = None
    metadata: AnthropicMetadata | None = None

    @field_validator("system", mode="before")
    @classmethod
    def _system_shape(cls, value: object) -> object:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list):
            for i, block in enumerate(value):
                if not (
                    isinstance(block, dict)
                    and block.get("type") == "text"
                    and isinstance(block.get("text"), str)
                ):
                    raise ValueError(f"system[{i}] must be a text block")
            return value
        raise ValueError("system must be a string or a list of text blocks")


class AnthropicChatBody(ChatBody, total=False):
    """A Messages request as the chat body it becomes, with what only an Anthropic deployment
    takes beside it (gateway.providers.params)."""

    top_k: int  # Anthropic's own parameter, refused by name by the other wires
    thinking: dict[str, Any]  # as the client sent it: the Anthropic adapter sends it unchanged
    anthropic_extras: dict[str, Any]  # ANTHROPIC_EXTRAS
    anthropic_request: ClientBody  # ANTHROPIC_REQUEST
    anthropic_headers: dict[str, str]  # ANTHROPIC_HEADERS (set by the handler)


def parse_request(
    raw: bytes, shape: Shape | None = None
) -> tuple[AnthropicChatBody, AnthropicRequest]:
    """Validate a Messages request; return the equivalent OpenAI chat body and the request.

    `top_k` rides along for an Anthropic upstream (refused by name by the others,
    gateway.providers.params), `output_config.format` becomes `response_format` and
    `service_tier` goes in OpenAI's names. Any other top-level field (`container`,
    `context_management`, `mcp_servers`, the rest of `output_config`, ...: Anthropic's own
    features) is carried by name for Anthropic deployments and refused by name by the others
    (`ANTHROPIC_EXTRAS`), never dropped without a word; the client's body itself rides along
    too, for an Anthropic deployment to be sent as it came (`ANTHROPIC_REQUEST`).
    `cache_control` (on system, content and tool_result blocks, tool_use
    blocks and tools), a tool result's `is_error`, and signed and redacted thinking ride in the
    OpenAI body as the extensions the Anthropic upstream adapter reads back (`cache_control` on
    parts, messages and tools; `is_error` on a tool message; an assistant message's
    `thinking_blocks`), and are left out for an OpenAI upstream. Content the gateway cannot
    carry (documents, file references, server tools and their blocks) is refused. So is
    `thread` (message threads, for every deployment: `ThreadUnsupported`), in the shape the
    SDKs take as "resend with the whole history".
    """
    body = parse_json_object(raw)
    if shape is not None:
        check_shape(body, *shape)  # before the messages are validated one by one
    request = validated(AnthropicRequest, body)
    if body.get("thread") is not None:
        raise ThreadUnsupported(
            "'thread' is not supported: this gateway keeps the conversation itself; send the"
            " whole history without 'thread'.",
            param="thread",
        )
    out = to_openai_body(request)
    extras = anthropic_extras(request.model_extra or {})
    if extras:
        out[ANTHROPIC_EXTRAS] = extras
    out[ANTHROPIC_REQUEST] = ClientBody(body, out["messages"])
    return out, request


def anthropic_extras(extra: dict[str, Any]) -> dict[str, Any]:
    """The request's top-level fields that only Anthropic's API has, by name: those outside
    the model but the ones translated (`service_tier`, `output_config.format`)."""
    out = {name: value for name, value in extra.items() if name not in _CARRIED_EXTRAS}
    config = extra.get("output_config")
    if isinstance(config, dict) and (rest := {k: v for k, v in config.items() if k != "format"}):
        out["output_config"] = rest
    return out


# Top-level fields outside the model that are carried (in `to_openai_body`), or handled by
# `parse_request` (`thread`: refused unless null, which asks for nothing).
_CARRIED_EXTRAS = frozenset({"output_config", "service_tier", "thread"})


def to_openai_body(request: AnthropicRequest) -> AnthropicChatBody:
    messages: list[dict[str, Any]] = []
    system = _system(request.system)
    if system is not None:
        messages.append({"role": "system", "content": system})
    for i, message in enumerate(request.messages):
        if message.role == "user":
            messages += _user_messages(message.content, f"messages[{i}].content")
        elif message.role == "system":
            messages.append(_system_message(message.content, f"messages[{i}].content"))
        else:
            messages.append(_assistant_message(message.content, f"messages[{i}].content"))

    out: AnthropicChatBody = {
        "model": request.model,
        "messages": messages,
        "max_tokens": request.max_tokens,
    }
    if request.temperature is not None:
        out["temperature"] = request.temperature
    if request.top_p is not None:
        out["top_p"] = request.top_p
    if request.stop_sequences:
        out["stop"] = list(request.stop_sequences)
    if request.tools:
        out["tools"] = [_tool(tool, f"tools[{i}]") for i, tool in enumerate(request.tools)]
        choice = request.tool_choice
        if choice is not None:
            out["tool_choice"] = _tool_choice(choice)
            if choice.disable_parallel_tool_use and choice.type != "none":
                out["parallel_tool_calls"] = False
    thinking = request.thinking
    if thinking is not None and thinking.type != "disabled":
        if thinking.type == "enabled":
            if thinking.budget_tokens is None:
                raise InvalidRequest(
                    "Missing required parameter: 'thinking.budget_tokens'.",
                    param="thinking.budget_tokens",
                )
            out["reasoning_effort"] = reasoning_effort(thinking.budget_tokens)
        # Passed on as given: the Anthropic upstream adapter sends it unchanged.
        out["thinking"] = thinking.model_dump(exclude_none=True)
    response_format = _output_format(request.model_extra or {})
    if response_format is not None:
        out["response_format"] = response_format
    tier = (request.model_extra or {}).get("service_tier")
    if tier is not None:
        # Anthropic's tiers in OpenAI's names (each adapter maps them back, or refuses).
        if tier not in _SERVICE_TIERS:
            raise InvalidRequest(
                "'service_tier' must be 'auto' or 'standard_only'.", param="service_tier"
            )
        out["service_tier"] = _SERVICE_TIERS[tier]
    if request.top_k is not None:
        # Anthropic's own parameter: its upstream takes it, others refuse it by name
        # (gateway.providers.params), rather than its being lost.
        out["top_k"] = request.top_k
    if request.metadata is not None and request.metadata.user_id:
        out["user"] = request.metadata.user_id
    extra = request.metadata.model_extra if request.metadata is not None else None
    if extra and "conversation_id" in extra:
        # The gateway's own key (gateway.pipeline.turn): never sent upstream.
        out["metadata"] = {"conversation_id": extra["conversation_id"]}
    if request.stream is not None:
        out["stream"] = request.stream
    return out


_SERVICE_TIERS = {"auto": "auto", "standard_only": "default"}


def _output_format(extra: dict[str, Any]) -> dict[str, Any] | None:
    """Anthropic's structured output (`output_config.format`, a JSON schema) as OpenAI's
    `response_format`, which every upstream adapter maps to its own (gateway/providers)."""
    config = extra.get("output_config")
    if config is None:
        return None
    fmt = config.get("format") if isinstance(config, dict) else None
    if fmt is None:
        return None
    schema = fmt.get("schema") if isinstance(fmt, dict) else None
    if not (
        isinstance(fmt, dict) and fmt.get("type") == "json_schema" and isinstance(schema, dict)
    ):
        raise InvalidRequest(
            '\'output_config.format\' must be {"type": "json_schema", "schema": {...}}.',
            param="output_config.format",
        )
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}


def reasoning_effort(budget_tokens: int) -> str:
    for cap, effort in _EFFORT_CAPS:
        if budget_tokens <= cap:
            return effort
    return "high"


def _system(system: str | list[AnthropicTextBlock] | None) -> str | list[dict[str, Any]] | None:
    if isinstance(system, list):
        parts = [
            {"type": "text", "text": block.text, **_cache_control(block.model_extra or {})}
            for block in system
        ]
        return _content(parts) if parts else None
    return system or None


def _system_message(content: str | list[dict[str, Any]], param: str) -> dict[str, Any]:
    """A `system` message of the history: text blocks only, as the top-level `system`."""
    if isinstance(content, str):
        return {"role": "system", "content": content}
    parts = []
    for j, block in enumerate(content):
        if block["type"] != "text":
            raise _unsupported(block["type"], f"{param}[{j}]")
        parts.append(
            {"type": "text", "text": _text(block, f"{param}[{j}]"), **_cache_control(block)}
        )
    return {"role": "system", "content": _content(parts) if parts else ""}


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A lone text part as a plain string (what every OpenAI-compatible server accepts),
    unless it carries more than its text (`cache_control`)."""
    if len(parts) == 1 and parts[0]["type"] == "text" and "cache_control" not in parts[0]:
        text: str = parts[0]["text"]
        return text
    return parts


def _cache_control(block: dict[str, Any]) -> dict[str, Any]:
    """A block's `cache_control`, kept for the Anthropic upstream (the OpenAI-dialect extension
    puts it where Anthropic does: on the part, the tool result's message, the tool)."""
    value = block.get("cache_control")
    return {"cache_control": value} if isinstance(value, dict) else {}


def _text(block: dict[str, Any], param: str, field: str = "text") -> str:
    text = block.get(field)
    if not isinstance(text, str):
        raise InvalidRequest(f"'{param}.{field}' must be a string.", param=f"{param}.{field}")
    return text


def _unsupported(kind: object, param: str) -> InvalidRequest:
    return InvalidRequest(
        f"Content blocks of type {kind!r} are not supported here.",
        param=f"{param}.type",
    )


def _user_messages(content: str | list[dict[str, Any]], param: str) -> list[dict[str, Any]]:
    """One user turn: its tool results as `tool` messages first, then the rest as `user`."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    tools: list[dict[str, Any]] = []
    images: list[dict[str, Any]] = []  # from tool results: OpenAI tool messages take text only
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where), **_cache_control(block)})
        elif kind == "image":
            parts.append({**_image(block, where), **_cache_control(block)})
        elif kind == "tool_result":
            tools.append(_tool_result(block, where, images))
        else:
            raise _unsupported(kind, where)
    out = tools
    if images or parts or not tools:
        out.append({"role": "user", "content": _content(images + parts) if images or parts else ""})
    return out


def _tool_result(block: dict[str, Any], param: str, images: list[dict[str, Any]]) -> dict[str, Any]:
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise InvalidRequest(
            f"'{param}.tool_use_id' must be a non-empty string.", param=f"{param}.tool_use_id"
        )
    content = block.get("content")
    text: str | list[dict[str, Any]] = ""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts: list[dict[str, Any]] = []
        for k, item in enumerate(content):
            where = f"{param}.content[{k}]"
            kind = item.get("type") if isinstance(item, dict) else None
            if kind == "text":
                parts.append({"type": "text", "text": _text(item, where), **_cache_control(item)})
            elif kind == "image":
                images.append({**_image(item, where), **_cache_control(item)})
            else:
                raise _unsupported(kind, where)
        text = _content(parts) if parts else ""
    elif content is not None:
        raise InvalidRequest(
            f"'{param}.content' must be a string or a list of content blocks.",
            param=f"{param}.content",
        )
    message: dict[str, Any] = {"role": "tool", "tool_call_id": tool_use_id, "content": text}
    message.update(_cache_control(block))
    if block.get("is_error") is True:
        message["is_error"] = True  # carried for an Anthropic upstream, like `cache_control`
    return message


def _image(block: dict[str, Any], param: str) -> dict[str, Any]:
    source = block.get("source")
    source = source if isinstance(source, dict) else {}
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if isinstance(media, str) and isinstance(data, str):
            return {"type": "image_url", "image_url": {"url": f"data:{media};base64,{data}"}}
        raise InvalidRequest(
            "A base64 image source needs string 'media_type' and 'data'.", param=f"{param}.source"
        )
    if kind == "url":
        url = source.get("url")
        if isinstance(url, str) and url:
            return {"type": "image_url", "image_url": {"url": url}}
        raise InvalidRequest("A url image source needs a 'url'.", param=f"{param}.source.url")
    raise InvalidRequest(
        f"Image sources of type {kind!r} are not supported; use base64 or url.",
        param=f"{param}.source.type",
    )


def _assistant_message(content: str | list[dict[str, Any]], param: str) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    parts: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    reasoning: list[str] = []
    thinking: list[dict[str, Any]] = []  # signed and redacted, for an Anthropic upstream
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = block["type"]
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where), **_cache_control(block)})
        elif kind == "tool_use":
            calls.append({**_tool_call(block, where), **_cache_control(block)})
        elif kind == "thinking":
            text = _text(block, where, "thinking")
            reasoning.append(text)
            signature = block.get("signature")
            if isinstance(signature, str) and signature:
                thinking.append({"type": "thinking", "thinking": text, "signature": signature})
        elif kind == REDACTED_THINKING:
            data = block.get("data")
            if isinstance(data, str):  # opaque to every other provider
                thinking.append({"type": REDACTED_THINKING, "data": data})
        else:
            raise _unsupported(kind, where)
    out: dict[str, Any] = {
        "role": "assistant",
        "content": _content(parts) if parts else (None if calls else ""),
    }
    if reasoning:
        out["reasoning_content"] = "".join(reasoning)
    if thinking:
        out["thinking_blocks"] = thinking
    if calls:
        out["tool_calls"] = calls
    return out


def _tool_call(block: dict[str, Any], param: str) -> dict[str, Any]:
    id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(id, str) or not id:
        raise InvalidRequest(f"'{param}.id' must be a non-empty string.", param=f"{param}.id")
    if not isinstance(name, str) or not name:
        raise InvalidRequest(f"'{param}.name' must be a non-empty string.", param=f"{param}.name")
    if not isinstance(arguments, dict):
        raise InvalidRequest(f"'{param}.input' must be an object.", param=f"{param}.input")
    return {
        "id": id,
        "type": "function",
        "function": {"name": name, "arguments": orjson.dumps(arguments).decode()},
    }


def _tool(tool: AnthropicTool, param: str) -> dict[str, Any]:
    if tool.type not in (None, "custom"):
        raise InvalidRequest(
            f"Server tools ({tool.type!r}) are not supported by this gateway.",
            param=f"{param}.type",
        )
    if tool.input_schema is None:
        raise InvalidRequest(
            f"Missing required parameter: '{param}.input_schema'.", param=f"{param}.input_schema"
        )
    function: dict[str, Any] = {"name": tool.name}
    if tool.description is not None:
        function["description"] = tool.description
    function["parameters"] = tool.input_schema
    return {"type": "function", "function": function, **_cache_control(tool.model_extra or {})}


def _tool_choice(choice: AnthropicToolChoice) -> str | dict[str, Any]:
    if choice.type == "tool":
        if not choice.name:
            raise InvalidRequest(
                "Missing required parameter: 'tool_choice.name'.", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": choice.name}}
    return {"auto": "auto", "any": "required", "none": "none"}[choice.type]


# -- responses -----------------------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _message_id() -> str:
    return f"msg_{sortable_hex()}"


def _tool_use_id() -> str:
    return f"toolu_{random_hex(12)}"


def stop_reason(finish_reason: str | None) -> str | None:
    """The Anthropic stop reason for a gateway (OpenAI-style) finish reason."""
    if finish_reason is None:
        return None
    if finish_reason in FINISH_REASONS:
        return FINISH_REASONS[finish_reason]
    return finish_reason if finish_reason in _ANTHROPIC_STOP_REASONS else "end_turn"


def anthropic_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """OpenAI-style usage in Anthropic's names.

    Anthropic counts cache reads and cache writes apart from `input_tokens`, OpenAI inside
    `prompt_tokens`. Writes have no OpenAI field: they come from an Anthropic upstream's own
    report (`provider_usage`), or litellm's `prompt_tokens_details.cache_creation_tokens`.
    """
    cached: object = None
    written: object = None
    provider = usage.get("provider_usage")
    provider = provider if isinstance(provider, dict) else {}
    if "prompt_tokens" not in usage and _is_int(usage.get("input_tokens")):
        prompt, completion = usage["input_tokens"], usage.get("output_tokens")
    else:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        details = usage.get("prompt_tokens_details")
        details = details if isinstance(details, dict) else {}
        cached = details.get("cached_tokens")
        written = provider.get("cache_creation_input_tokens")
        if not _is_int(written):
            written = details.get("cache_creation_tokens")
    input_tokens = prompt if _is_int(prompt) else 0
    cached_tokens = cached if _is_int(cached) else 0
    written_tokens = written if _is_int(written) else 0
    out: dict[str, Any] = {
        "input_tokens": max(input_tokens - cached_tokens - written_tokens, 0),
        "output_tokens": completion if _is_int(completion) else 0,
    }
    if written_tokens or "cache_creation_input_tokens" in provider:
        out["cache_creation_input_tokens"] = written_tokens
    if cached_tokens or "cache_read_input_tokens" in provider:
        out["cache_read_input_tokens"] = cached_tokens
    if isinstance(provider.get("cache_creation"), dict):
        out["cache_creation"] = provider["cache_creation"]  # the 5-minute and 1-hour split
    details = usage.get("completion_tokens_details")
    reasoning = details.get("reasoning_tokens") if isinstance(details, dict) else None
    if _is_int(reasoning) and reasoning:
        out["output_tokens_details"] = {"thinking_tokens": reasoning}
    return out


def error_type(error: GatewayError) -> str:
    """The Anthropic error `type` for a gateway error, chosen by HTTP status."""
    status = error.status
    if isinstance(error, UpstreamStreamError):
        if error.type in ERROR_STATUS:  # an Anthropic upstream's own in-stream error
            return error.type
        if error.upstream_status is not None:
            status = error.upstream_status
    if status in ERROR_TYPES:
        return ERROR_TYPES[status]
    return "invalid_request_error" if 400 <= status < 500 else "api_error"


def error_body(error: GatewayError) -> dict[str, Any]:
    """An Anthropic error object, for an HTTP error response or a stream's `error` event."""
    inner: dict[str, Any] = {"type": error_type(error), "message": error.message}
    if error.details is not None:
        inner["details"] = error.details
    return {"type": "error", "error": inner}


def _sse(obj: dict[str, Any]) -> bytes:
    """One SSE event; its name is the JSON object's `type`, as in Anthropic's streams."""
    name: str = obj["type"]
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


@dataclass(slots=True)
class _Block:
    kind: str
    id: str | None = None
    name: str | None = None
    data: dict[str, Any] | None = None
    position: int | None = None  # the Anthropic content index, once content_block_start is sent
    closed: bool = False


_RENDERED_KINDS = frozenset({TEXT, REASONING, TOOL_CALL, REDACTED_THINKING})


class MessagesStreamRenderer:
    """The gateway's stream events as Anthropic Messages SSE events.

    Events map onto `content_block_*` events, with the gateway's block indexes renumbered 0, 1,
    2, ... in the order blocks are first sent. Unknown kinds are left out (`redacted_thinking`
    from an Anthropic upstream is sent as such). `StreamFailure` is left to the caller, which
    ends the stream with `error()`.

    `cancelled()` ends a stream stopped by an explicit cancel with `stop_reason: "end_turn"` and
    an extra `"cancelled": true` beside it in the `message_delta`'s `delta`. Anthropic has no
    cancel, and no stop reason says so: an unknown `stop_reason` fails the Python SDK's strict
    response validation (`StopReason` is a Literal), while its models take unknown fields
    (`extra="allow"`, with or without strict validation) and its stream accumulator only reads
    the fields it knows, so clients accept the stream and the flag is there for those who look.
    """

    # Its usage is in its own events, without a cost.
    price: Callable[[dict[str, Any]], float | None] | None = None

    def __init__(self, model: str) -> None:
        self._model = model
        self.response_id = _message_id()
        self._blocks: dict[int, _Block] = {}  # gateway block index -> block
        self._next_position = 0
        self._started = False  # message_start sent
        self._ended = False  # message_stop or an error sent
        self._finish: str | None = None  # the stop reason, once Finish came
        self._usage: dict[str, Any] | None = None

    # -- public ----------------------------------------------------------------------------

    def render(self, events: list[StreamEvent]) -> bytes:
        if self._ended:
            return b""
        out = [self._message_start()]
        for event in events:
            out += self._event(event)
        return b"".join(out)

    def track(self, events: list[StreamEvent]) -> None:
        """Follow events whose bytes reached the client by another way (an Anthropic upstream's
        frames relayed unchanged), so that `cancelled()` still closes the right blocks."""
        self.render(events)

    def done(self) -> bytes:
        """The end of a finished stream: `message_delta` with the stop reason and usage,
        then `message_stop`."""
        if self._ended:
            return b""
        return self._end(self._finish or "end_turn", cancelled=False)

    def error(self, error: GatewayError) -> bytes:
        """An `error` event (Anthropic SDKs raise on it); nothing follows it."""
        self._ended = True
        return _sse(error_body(error))

    def cancelled(self) -> bytes:
        if self._ended:
            return b""
        return self._end(self._finish or "end_turn", cancelled=True)

    def shutdown(self, message: str) -> bytes:
        """An `error` event of type `shutdown`, as `error()` writes one; nothing follows it."""
        self._ended = True
        return _sse({"type": "error", "error": {"type": "shutdown", "message": message}})

    # -- internals ---------------------------------------------------------------------------

    def _message_start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": self.response_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _sse({"type": "message_start", "message": message})

    def _end(self, reason: str, *, cancelled: bool) -> bytes:
        out = [self._message_start(), *self._close_all()]
        delta: dict[str, Any] = {"stop_reason": reason, "stop_sequence": None}
        if cancelled:
            delta["cancelled"] = True
        usage: dict[str, Any] = dict(self._usage) if self._usage else {"output_tokens": 0}
        out.append(_sse({"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(_sse({"type": "message_stop"}))
        self._ended = True
        return b"".join(out)

    def _event(self, event: StreamEvent) -> list[bytes]:
        if isinstance(event, BlockStart):
            return self._block_start(event)
        if isinstance(event, BlockDelta):
            return self._block_delta(event)
        if isinstance(event, BlockEnd):
            block = self._blocks.get(event.index)
            if block is None or block.closed:
                return []
            signature = (event.data or {}).get("signature")
            if block.kind == REASONING and isinstance(signature, str) and signature:
                out = self._open(block)  # a thinking block whose text was withheld
                out.append(self._delta(block, {"type": "signature_delta", "signature": signature}))
                return out + self._close(block)
            return self._close(block)
        if isinstance(event, Usage):
            self._usage = anthropic_usage(event.usage)
        elif isinstance(event, Finish):
            self._finish = stop_reason(event.reason)
            return self._close_all()
        return []

    def _block_start(self, event: BlockStart) -> list[bytes]:
        out: list[bytes] = []
        previous = self._blocks.get(event.index)
        if previous is not None:  # a continuation attempt: its indexes start again at 0
            out += self._close(previous)
        block = self._blocks[event.index] = _Block(event.kind, event.id, event.name, event.data)
        if block.kind in (TOOL_CALL, REDACTED_THINKING):
            out += self._open(block)  # text and thinking wait for their first character
        return out

    def _block_delta(self, event: BlockDelta) -> list[bytes]:
        block = self._blocks.get(event.index)
        if block is None:  # a delta without a start: a text block by default
            block = self._blocks[event.index] = _Block(TEXT)
        if block.closed or not event.text or block.kind not in (TEXT, REASONING, TOOL_CALL):
            return []
        out = self._open(block)
        if block.kind == TEXT:
            delta = {"type": "text_delta", "text": event.text}
        elif block.kind == REASONING:
            delta = {"type": "thinking_delta", "thinking": event.text}
        else:
            delta = {"type": "input_json_delta", "partial_json": event.text}
        out.append(self._delta(block, delta))
        return out

    def _open(self, block: _Block) -> list[bytes]:
        if block.position is not None or block.closed or block.kind not in _RENDERED_KINDS:
            return []
        content: dict[str, Any]
        if block.kind == TEXT:
            content = {"type": "text", "text": ""}
        elif block.kind == REASONING:
            content = {"type": "thinking", "thinking": "", "signature": ""}
        elif block.kind == TOOL_CALL:
            content = {
                "type": "tool_use",
                "id": block.id or _tool_use_id(),
                "name": block.name or "",
                "input": {},
            }
        else:
            data = (block.data or {}).get("data")
            if not isinstance(data, str):
                return []
            content = {"type": REDACTED_THINKING, "data": data}
        block.position = self._next_position
        self._next_position += 1
        start = {"type": "content_block_start", "index": block.position, "content_block": content}
        return [_sse(start)]

    def _delta(self, block: _Block, delta: dict[str, Any]) -> bytes:
        return _sse({"type": "content_block_delta", "index": block.position, "delta": delta})

    def _close(self, block: _Block) -> list[bytes]:
        if block.closed:
            return []
        block.closed = True
        if block.position is None:
            return []
        return [_sse({"type": "content_block_stop", "index": block.position})]

    def _close_all(self) -> list[bytes]:
        out: list[bytes] = []
        for block in sorted(self._blocks.values(), key=_position):
            out += self._close(block)
        return out


def _position(block: _Block) -> int:
    return -1 if block.position is None else block.position


def message_body(
    model: str,
    assembler: BlockAssembler,
    usage: dict[str, Any] | None = None,
    response_id: str | None = None,
) -> bytes:
    """A non-streaming Anthropic Message built from assembled blocks.

    `usage` (OpenAI-style) defaults to the assembler's. A thinking block always carries a
    `signature` (empty when the upstream gave none): Anthropic's `ThinkingBlock` requires one.
    """
    content: list[dict[str, Any]] = []
    for block in assembler.blocks():
        if block.kind == TEXT:
            content.append({"type": "text", "text": block.text})
        elif block.kind == REASONING:
            signature = (block.data or {}).get("signature")
            content.append(
                {
                    "type": "thinking",
                    "thinking": block.text,
                    "signature": signature if isinstance(signature, str) else "",
                }
            )
        elif block.kind == TOOL_CALL:
            content.append(
                {
                    "type": "tool_use",
                    "id": block.id or _tool_use_id(),
                    "name": block.name or "",
                    "input": _arguments(block.text),
                }
            )
        elif block.kind == REDACTED_THINKING:
            data = (block.data or {}).get("data")
            if isinstance(data, str):
                content.append({"type": REDACTED_THINKING, "data": data})
    if usage is None:
        usage = assembler.usage
    return orjson.dumps(
        {
            "id": response_id or _message_id(),
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": stop_reason(assembler.finish_reason),
            "stop_sequence": None,
            "usage": anthropic_usage(usage) if usage else {"input_tokens": 0, "output_tokens": 0},
        }
    )


def _arguments(text: str) -> dict[str, Any]:
    try:
        parsed = orjson.loads(text) if text else None
    except orjson.JSONDecodeError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


class AnthropicMessages:
    """The dialect as the pipeline takes it (`gateway.dialects.base.Dialect`)."""

    name = "anthropic.messages"
    wire = "anthropic"  # an Anthropic upstream's bytes are relayed unchanged

    def renderer(self, body: Mapping[str, object]) -> MessagesStreamRenderer:
        return MessagesStreamRenderer(str(body.get("model")))

    def body(self, model: str, assembler: BlockAssembler, response_id: str) -> bytes:
        return message_body(model, assembler, response_id=response_id)

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)


ANTHROPIC_MESSAGES = AnthropicMessages()
