"""The OpenAI Responses API, as clients send it (`POST /v1/responses`).

Why: the Responses API is what the newer OpenAI SDKs and agent frameworks default to, and it is
stateful (`previous_response_id`, `conversation`), which maps onto the gateway's conversations.
Internally the gateway speaks OpenAI Chat Completions bodies and its own stream events, so this
dialect is a set of translations and nothing else (pure, no I/O; the store lookups that turn a
`previous_response_id` into history are the caller's):

- in:  a Responses request -> the request model and its *new* input as OpenAI chat messages
  (`parse_request`), then, with the history the gateway derived, the upstream Chat Completions
  body (`chat_body`); a bad request fails with `InvalidRequest` naming the field;
- out: the gateway's stream events -> Responses SSE events (`ResponsesStreamRenderer`), recorded
  blocks -> Response output items (`output_items`) and the Response object (`response_object`),
  and gateway errors -> OpenAI error objects.

Choices, each checked against the installed `openai` SDK (its event models, strict validation and
its `responses.stream()` accumulator):

- Reasoning is sent as a reasoning *summary* (`response.reasoning_summary_part.added`,
  `response.reasoning_summary_text.delta/.done`, summary_index 0), not as `reasoning_text`:
  stored reasoning items carry `summary: [{"type": "summary_text"}]`, so the stream and a later
  retrieval agree, and summaries are what Responses clients display.
- Text and reasoning items are opened on their first non-empty delta (an empty `content: ""`
  chunk never becomes an empty message); function calls at their start.
- A finish reason of `length` (or `content_filter`) ends the stream with `response.incomplete`
  and `incomplete_details.reason` `max_output_tokens` (or `content_filter`), as OpenAI does.
- A cancel ends the stream with `response.incomplete` whose response has status `cancelled`:
  the SDK's `ResponseStreamEvent` union has no `response.cancelled` event, while `cancelled` is
  a valid `ResponseStatus`. Open items are closed with status `incomplete` first.
- An error ends the stream with `response.failed` (status `failed`). `error.code` is one the
  SDK's `ResponseError` accepts (`rate_limit_exceeded` for a 429, else `server_error`); the
  gateway's own code, type and param are in `error.type`/`error.param`/`error.message`.
- Output item ids are derived from the response id and the item's position
  (`msg_<response hex>_<position>`, likewise `rs_`, `fc_`), so the items of a stream and of the
  same response read back later have the same ids, and an `item_reference` to one names the
  response to read it back from (`response_of_item`; `gateway.conversations.item_refs`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeGuard, cast

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gateway.dialects.chat_message import Blocks
from gateway.dialects.openai_chat import ChatBody
from gateway.dialects.requests import (
    MAX_OUTPUT_TOKENS,
    Shape,
    check_shape,
    parse_json_object,
    validated,
)
from gateway.errors import GatewayError, InvalidRequest, UpstreamStreamError
from gateway.providers.params import RESPONSES_EXTRAS
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

# Finish reason -> `incomplete_details.reason` (a finish reason not listed means completed).
INCOMPLETE_REASONS = {"length": "max_output_tokens", "content_filter": "content_filter"}

# -- requests ------------------------------------------------------------------------------------


class ResponsesTool(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ResponsesReasoning(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    effort: str | None = None
    summary: str | None = None


class ConversationRef(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    id: str = Field(min_length=1)


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)

    model: str = Field(description="A model alias from the gateway's config.")
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    tools: list[ResponsesTool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    previous_response_id: str | None = None
    conversation: str | ConversationRef | None = None
    store: bool = True
    stream: bool | None = None
    max_output_tokens: int | None = Field(None, ge=1, le=MAX_OUTPUT_TOKENS, strict=True)
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, ge=0, le=1)
    reasoning: ResponsesReasoning | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, str] | None = None
    user: str | None = None
    # Accepted, and how the gateway meets them: it adds no optional output data (`include`),
    # never drops context on its own (`truncation: "disabled"`, OpenAI's default), and runs no
    # hosted tools (`max_tool_calls`). It answers in the request, never in the background.
    include: list[str] | None = None
    truncation: Literal["auto", "disabled"] | None = None
    max_tool_calls: int | None = Field(None, ge=1, strict=True)
    background: Literal[False] | None = Field(
        None, description="Background responses are not offered: false or absent."
    )

    # Checked before validation so that a bad value yields one error at the field, not one per
    # union arm (whose names would end up in the `param`).
    @field_validator("input", mode="before")
    @classmethod
    def _input_shape(cls, value: object) -> object:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list):
            for i, item in enumerate(value):
                if not isinstance(item, dict):
                    raise ValueError(f"input[{i}] must be an input item object")
            return value
        raise ValueError("input must be a string or a list of input items")

    @field_validator("tool_choice", mode="before")
    @classmethod
    def _tool_choice_shape(cls, value: object) -> object:
        if value is None or isinstance(value, (str, dict)):
            return value
        raise ValueError("tool_choice must be a string or an object")

    @field_validator("conversation", mode="before")
    @classmethod
    def _conversation_shape(cls, value: object) -> object:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, dict) and isinstance(value.get("id"), str) and value["id"]:
            return value
        raise ValueError("conversation must be a conversation id or an object with an id")

    @property
    def conversation_id(self) -> str | None:
        if isinstance(self.conversation, ConversationRef):
            return self.conversation.id
        return self.conversation or None


def parse_request(
    raw: bytes, shape: Shape | None = None
) -> tuple[ResponsesRequest, list[dict[str, Any]]]:
    """Validate a Responses request; return it and its new input as OpenAI chat messages.

    Input items: messages (roles user, assistant, system, developer; `developer` becomes
    `system`, which every provider takes), `function_call` and `reasoning` items (merged into the
    assistant message they belong to) and `function_call_output` items (`tool` messages).
    `item_reference` items are checked for an id and left out: the caller resolves them from
    the store (`gateway.conversations.item_refs`) and converts the input again with them.
    Refused: other item types (hosted tool calls, ...), file inputs, image file ids, hosted
    tools. `tools` and `tool_choice` are checked here too.
    """
    body = parse_json_object(raw)
    if shape is not None:
        check_shape(body, *shape)  # before the items are validated one by one
    request = validated(ResponsesRequest, body)
    if request.input is None or request.input == []:
        raise InvalidRequest("Missing required parameter: 'input'.", param="input")
    if request.previous_response_id is not None and request.conversation is not None:
        raise InvalidRequest(
            "'previous_response_id' and 'conversation' cannot be used together.",
            param="conversation",
        )
    _tools(request)  # raise now rather than when the upstream body is built
    _tool_choice(request)
    return request, input_messages(request.input)


def item_references(input: str | list[dict[str, Any]] | None) -> list[tuple[str, str]]:
    """The `item_reference` items of an input, as (where, id); 400 for one without an id."""
    if not isinstance(input, list):
        return []
    return [
        (f"input[{i}]", _string(item, "id", f"input[{i}]"))
        for i, item in enumerate(input)
        if item.get("type") == "item_reference"
    ]


def input_messages(
    input: str | list[dict[str, Any]], resolved: Mapping[str, dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Responses input (a string or items) as OpenAI chat messages.

    An `item_reference` is replaced by the item `resolved` has for its id (a message,
    `function_call`, `function_call_output` or `reasoning` item); it is left out when `resolved`
    is None (not resolved yet), and a 400 naming it when `resolved` lacks it."""
    if isinstance(input, str):
        return [{"role": "user", "content": input}]
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(input):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "item_reference":
            item_id = _string(item, "id", where)
            if resolved is None:
                continue
            if item_id not in resolved:
                raise unknown_item(item_id, where)
            item = resolved[item_id]
            kind = item.get("type", "message")
        if kind == "message":
            _message_item(item, where, messages)
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where, empty=True),
                },
            }
            _assistant(messages).setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", where),
                    "content": _output(item.get("output"), f"{where}.output"),
                }
            )
        elif kind == "reasoning":
            text = _reasoning_text(item, where)
            if text:
                message = _assistant(messages)
                message["reasoning_content"] = message.get("reasoning_content", "") + text
        else:
            raise InvalidRequest(
                f"Input items of type {kind!r} are not supported here.", param=f"{where}.type"
            )
    return messages


def unknown_item(item_id: str, where: str) -> InvalidRequest:
    """The error for an `item_reference` to an item this key cannot read back."""
    return InvalidRequest(
        f"Item with id '{item_id}' not found: an item_reference must name an item this gateway"
        " issued (in a stored response, or in the request's conversation) that this key's team"
        " can read.",
        param=f"{where}.id",
        code="item_not_found",
    )


def _string(item: dict[str, Any], key: str, where: str, *, empty: bool = False) -> str:
    value = item.get(key)
    if not isinstance(value, str) or (not value and not empty):
        what = "a string" if empty else "a non-empty string"
        raise InvalidRequest(f"'{where}.{key}' must be {what}.", param=f"{where}.{key}")
    return value


def _assistant(messages: list[dict[str, Any]]) -> dict[str, Any]:
    """The assistant message that assistant-side items are merged into (a new one if needed)."""
    if messages and messages[-1]["role"] == "assistant":
        return messages[-1]
    message: dict[str, Any] = {"role": "assistant", "content": None}
    messages.append(message)
    return message


def _message_item(item: dict[str, Any], where: str, messages: list[dict[str, Any]]) -> None:
    role = item.get("role")
    if role not in ("user", "assistant", "system", "developer"):
        raise InvalidRequest(
            f"'{where}.role' must be one of 'user', 'assistant', 'system', 'developer'.",
            param=f"{where}.role",
        )
    content = item.get("content")
    if isinstance(content, str):
        parts: list[dict[str, Any]] = [{"type": "text", "text": content}]
    elif isinstance(content, list):
        parts = [_part(part, f"{where}.content[{j}]", role) for j, part in enumerate(content)]
    else:
        raise InvalidRequest(
            f"'{where}.content' must be a string or a list of content parts.",
            param=f"{where}.content",
        )
    if role == "assistant":
        message = _assistant(messages)
        text = "".join(part["text"] for part in parts)
        message["content"] = (message["content"] or "") + text
        return
    if role != "user":
        text = "".join(part["text"] for part in parts)
        messages.append({"role": "system", "content": text})
        return
    messages.append({"role": "user", "content": _content(parts)})


def _part(part: Any, where: str, role: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": _string(part, "text", where, empty=True)}
    if kind == "refusal" and role == "assistant":
        return {"type": "text", "text": _string(part, "refusal", where, empty=True)}
    if kind == "input_image" and role == "user":
        url = part.get("image_url")
        if not isinstance(url, str) or not url:
            raise InvalidRequest(
                f"'{where}.image_url' must be a URL or a data URL (file ids are not supported).",
                param=f"{where}.image_url",
            )
        image: dict[str, Any] = {"url": url}
        if isinstance(part.get("detail"), str):
            image["detail"] = part["detail"]
        return {"type": "image_url", "image_url": image}
    raise InvalidRequest(
        f"Content parts of type {kind!r} are not supported here.", param=f"{where}.type"
    )


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """A lone text part as a plain string (what every OpenAI-compatible server accepts)."""
    if len(parts) == 1 and parts[0]["type"] == "text":
        text: str = parts[0]["text"]
        return text
    return parts


def _output(output: object, where: str) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, list):  # a list of input_text parts
        texts = []
        for j, part in enumerate(output):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text"):
                raise InvalidRequest(
                    "Only text is supported in a function call output.", param=f"{where}[{j}]"
                )
            texts.append(_string(part, "text", f"{where}[{j}]", empty=True))
        return "".join(texts)
    raise InvalidRequest(f"'{where}' must be a string.", param=where)


def _reasoning_text(item: dict[str, Any], where: str) -> str:
    summary = item.get("summary")
    if summary is None:
        return ""
    if not isinstance(summary, list):
        raise InvalidRequest(f"'{where}.summary' must be a list.", param=f"{where}.summary")
    return "".join(
        _string(part, "text", f"{where}.summary[{j}]", empty=True)
        for j, part in enumerate(summary)
        if isinstance(part, dict)
    )


def _tools(request: ResponsesRequest) -> list[dict[str, Any]]:
    """The function tools, in chat form; the others (hosted tools: `web_search`, a
    `namespace` of functions, ...) are `hosted_tools`."""
    out = []
    for i, tool in enumerate(request.tools or []):
        if tool.type != "function":
            continue
        if not tool.name:
            raise InvalidRequest(
                f"Missing required parameter: 'tools[{i}].name'.", param=f"tools[{i}].name"
            )
        function: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            function["description"] = tool.description
        function["parameters"] = (
            tool.parameters if tool.parameters is not None else {"type": "object", "properties": {}}
        )
        if tool.strict is not None:
            function["strict"] = tool.strict
        out.append({"type": "function", "function": function})
    return out


def hosted_tools(request: ResponsesRequest) -> dict[str, Any]:
    """The tools that are no function, by their place (`tools[4]`), as the client sent them:
    carried for a deployment that speaks the Responses API itself, refused by name (or
    dropped, with `drop_params`) by any other."""
    return {
        f"tools[{i}]": tool.model_dump(exclude_none=True)
        for i, tool in enumerate(request.tools or [])
        if tool.type != "function"
    }


def _tool_choice(request: ResponsesRequest) -> str | dict[str, Any] | None:
    choice = request.tool_choice
    if choice is None or choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidRequest(
                "Missing required parameter: 'tool_choice.name'.", param="tool_choice.name"
            )
        return {"type": "function", "function": {"name": name}}
    raise InvalidRequest(
        "'tool_choice' must be 'auto', 'none', 'required' or a function choice.",
        param="tool_choice",
    )


def _response_format(text: dict[str, Any] | None) -> dict[str, Any] | None:
    fmt = (text or {}).get("format")
    if not isinstance(fmt, dict) or fmt.get("type") in (None, "text"):
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "description", "schema", "strict") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise InvalidRequest(f"Unsupported text format {fmt.get('type')!r}.", param="text.format.type")


# Responses parameters the Chat Completions API has under the same name and meaning.
_SAME_IN_CHAT = ("service_tier", "prompt_cache_key", "prompt_cache_retention", "safety_identifier")


def _chat_params(request: ResponsesRequest) -> dict[str, Any]:
    """The request's parameters as Chat Completions ones (each adapter then gives them its wire's
    form, or refuses them: gateway.providers.params)."""
    out: dict[str, Any] = {}
    extra = request.model_extra or {}
    if request.max_output_tokens is not None:
        # What OpenAI's chat API takes for every model (o-series and gpt-5 refuse `max_tokens`);
        # the Anthropic and litellm adapters read it as their own `max_tokens`.
        out["max_completion_tokens"] = request.max_output_tokens
    for name in _SAME_IN_CHAT:
        if extra.get(name) is not None:
            out[name] = extra[name]
    if extra.get("top_logprobs") is not None:
        out["logprobs"] = True  # chat returns top logprobs only with logprobs on
        out["top_logprobs"] = extra["top_logprobs"]
    verbosity = (request.text or {}).get("verbosity")
    if verbosity is not None:
        out["verbosity"] = verbosity
    # Its `conversation_id` is the gateway's own, taken out before the upstream call.
    own = {k: v for k, v in (request.metadata or {}).items() if k != "conversation_id"}
    if request.metadata:
        out["metadata"] = request.metadata
    # `store` as the client said it; with metadata, which OpenAI keeps only on a stored
    # completion, the Responses default (stored) too. The gateway stores the response either way.
    if "store" in request.model_fields_set or own:
        out["store"] = request.store
    return out


class ResponsesChatBody(ChatBody, total=False):
    """A Responses request as the chat body it becomes, with the tools only a deployment
    speaking the Responses API takes beside it (gateway.providers.params)."""

    responses_extras: dict[str, Any]  # RESPONSES_EXTRAS


def chat_body(
    request: ResponsesRequest, history: list[dict[str, Any]], new_messages: list[dict[str, Any]]
) -> ResponsesChatBody:
    """The OpenAI Chat Completions body for the upstream.

    `instructions` lead as a system message (they are per request: a previous response's
    instructions are not carried over, as in OpenAI's API), then `history` (the gateway's, in
    chat shape), then the request's new messages.
    """
    messages: list[dict[str, Any]] = []
    if request.instructions:
        messages.append({"role": "system", "content": request.instructions})
    messages += history
    messages += new_messages
    # The parameters are chat's, some of them by names only this dialect passes on.
    out = cast(
        ResponsesChatBody, {"model": request.model, "messages": messages, **_chat_params(request)}
    )
    tools = _tools(request)
    hosted = hosted_tools(request)
    if hosted:
        out[RESPONSES_EXTRAS] = hosted
    if tools or hosted:
        if tools:
            out["tools"] = tools
        choice = _tool_choice(request)
        if choice is not None:
            out["tool_choice"] = choice
        if request.parallel_tool_calls is not None:
            out["parallel_tool_calls"] = request.parallel_tool_calls
    if request.temperature is not None:
        out["temperature"] = request.temperature
    if request.top_p is not None:
        out["top_p"] = request.top_p
    if request.reasoning is not None and request.reasoning.effort:
        out["reasoning_effort"] = request.reasoning.effort
    response_format = _response_format(request.text)
    if response_format is not None:
        out["response_format"] = response_format
    if request.user:
        out["user"] = request.user
    if request.stream is not None:
        out["stream"] = request.stream
    return out


# -- responses -----------------------------------------------------------------------------------


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(value: object) -> int:
    return value if _is_int(value) else 0


def responses_usage(usage: dict[str, Any]) -> dict[str, Any]:
    """Gateway (OpenAI chat style) usage in the Responses API's names.

    Usage already in Responses (or Anthropic) names (`input_tokens`, no `prompt_tokens`) is
    completed, not renamed.
    """
    if "prompt_tokens" in usage or "input_tokens" not in usage:
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        in_details = usage.get("prompt_tokens_details")
        out_details = usage.get("completion_tokens_details")
    else:
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        in_details = usage.get("input_tokens_details")
        out_details = usage.get("output_tokens_details")
    in_details = in_details if isinstance(in_details, dict) else {}
    out_details = out_details if isinstance(out_details, dict) else {}
    input_tokens, output_tokens = _int(prompt), _int(completion)
    total = usage.get("total_tokens")
    # Tokens written to the cache (inside input_tokens): an Anthropic upstream's own count.
    provider = usage.get("provider_usage")
    written = _int(in_details.get("cache_write_tokens")) or (
        _int(provider.get("cache_creation_input_tokens")) if isinstance(provider, dict) else 0
    )
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {
            "cached_tokens": _int(in_details.get("cached_tokens")),
            "cache_write_tokens": written,
        },
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": _int(out_details.get("reasoning_tokens"))},
        "total_tokens": total if _is_int(total) else input_tokens + output_tokens,
    }


_RESPONSE_ID = re.compile(r"resp_([0-9a-f]{32})")  # as made in gateway.http.responses
_RESPONSE_ITEM_ID = re.compile(r"(?:msg|rs|fc)_([0-9a-f]{32})_[0-9]+")


def _item_id(prefix: str, seed: str, position: int) -> str:
    """An output item's id: the response's own hex and the position when `seed` is a response
    id (so the id leads back to its response), else a digest of both."""
    if (match := _RESPONSE_ID.fullmatch(seed)) is not None:
        return f"{prefix}_{match[1]}_{position}"
    digest = hashlib.sha256(f"{seed}:{position}".encode()).hexdigest()[:40]
    return f"{prefix}_{digest}"


def response_of_item(item_id: str) -> str | None:
    """The id of the response whose output item `item_id` is, if it is one (`_item_id`)."""
    match = _RESPONSE_ITEM_ID.fullmatch(item_id)
    return f"resp_{match[1]}" if match is not None else None


def _message_item_out(item_id: str, text: str, status: str) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "message",
        "status": status,
        "role": "assistant",
        "content": [_text_part(text)] if status != "in_progress" else [],
    }


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "annotations": [], "logprobs": [], "text": text}


def _reasoning_item_out(item_id: str, text: str, status: str) -> dict[str, Any]:
    summary = [{"type": "summary_text", "text": text}] if status != "in_progress" else []
    return {"id": item_id, "type": "reasoning", "status": status, "summary": summary}


def _function_item_out(
    item_id: str, call_id: str, name: str, arguments: str, status: str
) -> dict[str, Any]:
    return {
        "id": item_id,
        "type": "function_call",
        "status": status,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
    }


def output_items(
    blocks: Blocks, *, status: str, response_id: str | None = None
) -> list[dict[str, Any]]:
    """Recorded assistant blocks as Responses output items, each with the given status.

    Ids derive from `response_id` (the streamed ids, when it is the response's) or, without it,
    from the blocks themselves; either way they are the same every time. Blocks of other kinds
    are left out.
    """
    seed = (
        response_id if response_id is not None else hashlib.sha256(orjson.dumps(blocks)).hexdigest()
    )
    out: list[dict[str, Any]] = []
    for block in blocks:
        kind, position = block.get("type"), len(out)
        if kind == TEXT:
            item_id = _item_id("msg", seed, position)
            out.append(_message_item_out(item_id, str(block.get("text") or ""), status))
        elif kind == REASONING:
            item_id = _item_id("rs", seed, position)
            out.append(_reasoning_item_out(item_id, str(block.get("text") or ""), status))
        elif kind == TOOL_CALL:
            call_id = block.get("id") or _item_id("call", seed, position)
            out.append(
                _function_item_out(
                    _item_id("fc", seed, position),
                    str(call_id),
                    str(block.get("name") or ""),
                    str(block.get("arguments") or ""),
                    status,
                )
            )
    return out


def response_object(
    id: str,
    request: ResponsesRequest,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    created_at: int,
    previous_response_id: str | None,
    conversation_id: str | None,
) -> dict[str, Any]:
    """The Response object (as OpenAI's wire shape; `output_text` is an SDK property, left out).

    `usage` is the gateway's (OpenAI chat style) or already in Responses shape.
    """
    reasoning = request.reasoning
    return {
        "id": id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": request.instructions,
        "max_output_tokens": request.max_output_tokens,
        "max_tool_calls": None,
        "model": request.model,
        "output": output,
        "parallel_tool_calls": (
            request.parallel_tool_calls if request.parallel_tool_calls is not None else True
        ),
        "previous_response_id": previous_response_id,
        "conversation": {"id": conversation_id} if conversation_id else None,
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": reasoning.summary if reasoning else None,
        },
        "store": request.store,
        "temperature": request.temperature,
        "text": request.text if request.text is not None else {"format": {"type": "text"}},
        "tool_choice": request.tool_choice if request.tool_choice is not None else "auto",
        "tools": [
            {
                "type": "function",
                "name": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
                "strict": tool.strict,
            }
            if tool.type == "function"
            else tool.model_dump(exclude_none=True)
            for tool in request.tools or []
        ],
        "top_p": request.top_p,
        "truncation": "disabled",
        "usage": responses_usage(usage) if usage else None,
        "user": request.user,
        "metadata": dict(request.metadata) if request.metadata else {},
    }


def error_code(error: GatewayError) -> str:
    """A `ResponseError.code` the SDK accepts: only rate limits are told apart."""
    status = error.status
    if isinstance(error, UpstreamStreamError) and error.upstream_status is not None:
        status = error.upstream_status
    return (
        "rate_limit_exceeded"
        if status == 429 or error.code == "rate_limit_exceeded"
        else ("server_error")
    )


def response_error(error: GatewayError) -> dict[str, Any]:
    """The Response's `error` for a failed response."""
    return {
        "code": error_code(error),
        "message": f"{error.message} [{error.code}]",
        "type": error.type,
        "param": error.param,
    }


def error_body(error: GatewayError) -> dict[str, Any]:
    """An OpenAI error object, for an HTTP error response."""
    return error.to_openai()


@dataclass(slots=True)
class _Item:
    kind: str
    call_id: str | None = None
    name: str | None = None
    parts: list[str] = field(default_factory=list)
    id: str = ""
    position: int | None = None  # the output index, once output_item.added is sent
    status: str = "in_progress"

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def to_output(self) -> dict[str, Any]:
        if self.kind == TEXT:
            return _message_item_out(self.id, self.text, self.status)
        if self.kind == REASONING:
            return _reasoning_item_out(self.id, self.text, self.status)
        return _function_item_out(
            self.id, self.call_id or "", self.name or "", self.text, self.status
        )


class ResponsesStreamRenderer:
    """The gateway's stream events as Responses API SSE events.

    `response` is the initial Response object (`response_object(..., status="in_progress")`);
    its id seeds the item ids and it is the base of every lifecycle event's response. Gateway
    block indexes become output indexes 0, 1, 2, ... in the order items are first sent; a
    continuation attempt's `BlockStart` for an index already seen opens a new item.
    `StreamFailure` is left to the caller, which ends the stream with `error()`.
    """

    # Its usage is in its own events, without a cost.
    price: Callable[[dict[str, Any]], float | None] | None = None

    def __init__(self, response: dict[str, Any]) -> None:
        self._response = response
        self._seed = self.response_id = str(response.get("id"))
        self._items: dict[int, _Item] = {}  # gateway block index -> item
        self._output: list[_Item] = []  # items sent, in output order
        self._sequence = 0
        self._started = False
        self._ended = False
        self._finish: str | None = None
        self._usage: dict[str, Any] | None = None

    # -- public ----------------------------------------------------------------------------

    def render(self, events: list[StreamEvent]) -> bytes:
        if self._ended:
            return b""
        out = self._start()
        for event in events:
            out += self._event(event)
        return b"".join(out)

    def track(self, events: list[StreamEvent]) -> None:
        """Nothing to follow: no upstream speaks this wire format, so nothing is relayed."""

    def done(self) -> bytes:
        """Close open items; `response.completed`, or `response.incomplete` after `length`."""
        if self._ended:
            return b""
        reason = INCOMPLETE_REASONS.get(self._finish or "")
        item_status = "incomplete" if reason else "completed"
        out = self._start() + self._close_all(item_status)
        if reason:
            response = self.snapshot("incomplete", incomplete_details={"reason": reason})
            out.append(self._sse("response.incomplete", {"response": response}))
        else:
            out.append(self._sse("response.completed", {"response": self.snapshot("completed")}))
        self._ended = True
        return b"".join(out)

    def error(self, error: GatewayError) -> bytes:
        """`response.failed` with the error; open items are reported `incomplete`, not closed."""
        return self._failed(response_error(error))

    def shutdown(self, message: str) -> bytes:
        """`response.failed`, as `error()` writes it, with an error of code `shutdown`."""
        return self._failed(
            {"code": "shutdown", "message": message, "type": "shutdown", "param": None}
        )

    def cancelled(self) -> bytes:
        """Close open items as `incomplete`; `response.incomplete` with status `cancelled`."""
        if self._ended:
            return b""
        out = self._start() + self._close_all("incomplete")
        out.append(self._sse("response.incomplete", {"response": self.snapshot("cancelled")}))
        self._ended = True
        return b"".join(out)

    def snapshot(
        self,
        status: str,
        *,
        error: dict[str, Any] | None = None,
        incomplete_details: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The Response as it stands: the items sent so far, the usage reported so far."""
        return {
            **self._response,
            "status": status,
            "output": [item.to_output() for item in self._output],
            "usage": responses_usage(self._usage) if self._usage else None,
            "error": error,
            "incomplete_details": incomplete_details,
        }

    @property
    def blocks(self) -> list[dict[str, Any]]:
        """The items sent so far as recorded content blocks (`output_items`' input)."""
        out: list[dict[str, Any]] = []
        for item in self._output:
            if item.kind == TOOL_CALL:
                out.append(
                    {
                        "type": TOOL_CALL,
                        "id": item.call_id,
                        "name": item.name,
                        "arguments": item.text,
                    }
                )
            else:
                out.append({"type": item.kind, "text": item.text})
        return out

    # -- internals ---------------------------------------------------------------------------

    def _failed(self, error: dict[str, Any]) -> bytes:
        if self._ended:
            return b""
        out = self._start()
        for item in self._output:
            if item.status == "in_progress":
                item.status = "incomplete"
        response = self.snapshot("failed", error=error)
        out.append(self._sse("response.failed", {"response": response}))
        self._ended = True
        return b"".join(out)

    def _sse(self, kind: str, fields: dict[str, Any]) -> bytes:
        obj = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"

    def _start(self) -> list[bytes]:
        if self._started:
            return []
        self._started = True
        response = {**self._response, "status": "in_progress", "output": [], "usage": None}
        return [
            self._sse("response.created", {"response": response}),
            self._sse("response.in_progress", {"response": response}),
        ]

    def _event(self, event: StreamEvent) -> list[bytes]:
        if isinstance(event, BlockStart):
            out: list[bytes] = []
            previous = self._items.get(event.index)
            if previous is not None:  # a continuation attempt: its indexes start again at 0
                out += self._close(previous, "completed")
            item = self._items[event.index] = _Item(event.kind, event.id, event.name)
            if item.kind == TOOL_CALL:
                out += self._open(item)  # text and reasoning wait for their first character
            return out
        if isinstance(event, BlockDelta):
            return self._delta(event)
        if isinstance(event, BlockEnd):
            ended = self._items.get(event.index)
            return self._close(ended, "completed") if ended is not None else []
        if isinstance(event, Usage):
            self._usage = event.usage
        elif isinstance(event, Finish):
            self._finish = event.reason
            return self._close_all(
                "incomplete" if event.reason in INCOMPLETE_REASONS else "completed"
            )
        return []

    def _delta(self, event: BlockDelta) -> list[bytes]:
        item = self._items.get(event.index)
        if item is None:  # a delta without a start: a text block by default
            item = self._items[event.index] = _Item(TEXT)
        if item.status != "in_progress" or not event.text:
            return []
        if item.kind not in (TEXT, REASONING, TOOL_CALL):
            return []
        out = self._open(item)
        item.parts.append(event.text)
        where: dict[str, Any] = {"item_id": item.id, "output_index": item.position}
        fields: dict[str, Any]
        if item.kind == TEXT:
            fields = {**where, "content_index": 0, "delta": event.text, "logprobs": []}
            out.append(self._sse("response.output_text.delta", fields))
        elif item.kind == REASONING:
            fields = {**where, "summary_index": 0, "delta": event.text}
            out.append(self._sse("response.reasoning_summary_text.delta", fields))
        else:
            out.append(
                self._sse("response.function_call_arguments.delta", {**where, "delta": event.text})
            )
        return out

    def _open(self, item: _Item) -> list[bytes]:
        if item.position is not None or item.kind not in (TEXT, REASONING, TOOL_CALL):
            return []
        position = item.position = len(self._output)
        self._output.append(item)
        prefix = {TEXT: "msg", REASONING: "rs", TOOL_CALL: "fc"}[item.kind]
        item.id = _item_id(prefix, self._seed, position)
        if item.kind == TOOL_CALL and not item.call_id:
            item.call_id = _item_id("call", self._seed, position)
        added = {"output_index": position, "item": item.to_output()}
        out = [self._sse("response.output_item.added", added)]
        where = {"item_id": item.id, "output_index": position}
        if item.kind == TEXT:
            part = {**where, "content_index": 0, "part": _text_part("")}
            out.append(self._sse("response.content_part.added", part))
        elif item.kind == REASONING:
            part = {**where, "summary_index": 0, "part": {"type": "summary_text", "text": ""}}
            out.append(self._sse("response.reasoning_summary_part.added", part))
        return out

    def _close(self, item: _Item, status: str) -> list[bytes]:
        if item.status != "in_progress":
            return []
        item.status = status
        if item.position is None:
            return []
        where = {"item_id": item.id, "output_index": item.position}
        text = item.text
        out: list[bytes] = []
        if item.kind == TEXT:
            fields = {**where, "content_index": 0, "text": text, "logprobs": []}
            out.append(self._sse("response.output_text.done", fields))
            part = {**where, "content_index": 0, "part": _text_part(text)}
            out.append(self._sse("response.content_part.done", part))
        elif item.kind == REASONING:
            out.append(
                self._sse(
                    "response.reasoning_summary_text.done",
                    {**where, "summary_index": 0, "text": text},
                )
            )
            part = {**where, "summary_index": 0, "part": {"type": "summary_text", "text": text}}
            out.append(self._sse("response.reasoning_summary_part.done", part))
        else:
            out.append(
                self._sse("response.function_call_arguments.done", {**where, "arguments": text})
            )
        done = {"output_index": item.position, "item": item.to_output()}
        out.append(self._sse("response.output_item.done", done))
        return out

    def _close_all(self, status: str) -> list[bytes]:
        out: list[bytes] = []
        for item in list(self._output):
            out += self._close(item, status)
        for item in self._items.values():  # never sent: just mark them
            if item.position is None:
                item.status = status
        return out


def response_body(response: dict[str, Any], assembler: BlockAssembler) -> bytes:
    """A non-streaming Response built from assembled blocks, on the initial response object."""
    reason = INCOMPLETE_REASONS.get(assembler.finish_reason or "")
    status = "incomplete" if reason else "completed"
    blocks = [block.to_content() for block in assembler.blocks()]
    usage = assembler.usage
    return orjson.dumps(
        {
            **response,
            "status": status,
            "output": output_items(blocks, status=status, response_id=str(response.get("id"))),
            "usage": responses_usage(usage) if usage else None,
            "error": None,
            "incomplete_details": {"reason": reason} if reason else None,
        }
    )


class Responses:
    """The dialect as the pipeline takes it (`gateway.dialects.base.Dialect`), one per request.

    It is built with the request's initial Response object (id, model, options), which both
    the stream and the whole answer are rendered on.
    """

    name = "openai.responses"
    # Never relayed unchanged, not even from a native Responses upstream: its events carry the
    # upstream's response ids, and clients must see the gateway's to continue a conversation.
    wire = "none"

    def __init__(self, response: dict[str, Any]) -> None:
        self.response = response

    def renderer(self, body: Mapping[str, object]) -> ResponsesStreamRenderer:
        return ResponsesStreamRenderer(self.response)

    def body(self, model: str, assembler: BlockAssembler, response_id: str) -> bytes:
        """The Response JSON; `model` and `response_id` are ignored: the Response names the
        model asked for, and has its id (the renderer's `response_id` too)."""
        return response_body(self.response, assembler)

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error_body(error)
