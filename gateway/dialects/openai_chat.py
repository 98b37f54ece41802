"""The OpenAI Chat Completions request, as clients send it.

The request is validated by a pydantic model but forwarded as the client's own JSON object, so
fields this gateway does not know (new OpenAI parameters, provider extensions) pass through.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Literal, Required, TypedDict, cast

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from gateway.dialects.chat_message import assistant_message
from gateway.dialects.requests import Shape, check_shape, parse_json_object, validated
from gateway.errors import GatewayError
from gateway.ids import sortable_hex
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


class ChatFunction(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str | None = None
    arguments: str | None = None


class ChatToolCall(BaseModel):
    model_config = ConfigDict(extra="allow")

    id: str | None = None
    type: str | None = None
    function: ChatFunction | None = None


class ChatMessage(BaseModel):
    """The fields the gateway itself reads (to record, compare and count) are checked; a bad
    one used to be recorded as is and fail the request, or a later read, with a 500."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Any = None
    name: str | None = None
    tool_call_id: str | None = None
    tool_calls: list[ChatToolCall] | None = None
    reasoning_content: str | None = None

    @field_validator("content", mode="before")
    @classmethod
    def _content_shape(cls, value: object) -> object:
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, list):
            for i, part in enumerate(value):
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise ValueError(f"content[{i}] must be a content part object with a type")
                if "text" in part and not isinstance(part["text"], str):
                    raise ValueError(f"content[{i}].text must be a string")
            return value
        raise ValueError("content must be a string, an array of content parts or null")


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(description="A model alias from the gateway's config.")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False


class ChatBody(TypedDict, total=False):
    """A chat completion request as the gateway's path reads it: a chat client's own body, or
    the one another dialect's request becomes (each adds its carriers: `AnthropicChatBody`,
    `ResponsesChatBody`, `CompletionsChatBody`). `model`, `messages` and `stream` are checked
    when the request is parsed; the parameters, as typed here, by `check_output_params` before
    anything is reserved. Fields the gateway does not read pass through unnamed."""

    model: Required[str]
    messages: Required[list[dict[str, Any]]]  # OpenAI chat messages
    stream: bool | None
    stream_options: dict[str, Any] | None
    n: int | None
    max_tokens: int | None
    max_completion_tokens: int | None
    temperature: float | None
    top_p: float | None
    stop: str | list[str] | None
    seed: int | None
    user: str | None
    metadata: dict[str, Any] | None
    store: bool | None
    tools: list[dict[str, Any]] | None
    tool_choice: str | dict[str, Any] | None
    parallel_tool_calls: bool | None
    response_format: dict[str, Any] | None
    reasoning_effort: str | None
    service_tier: str | None
    logprobs: bool | None
    top_logprobs: int | None


_ROLES = frozenset(("system", "developer", "user", "assistant", "tool", "function"))
_PLAIN_KEYS = frozenset(("role", "content"))


def parse_chat_request(raw: bytes, shape: Shape | None = None) -> tuple[ChatBody, bool]:
    """The request's body, checked as `ChatCompletionRequest` checks it, and whether it asks
    for a stream."""
    body = parse_json_object(raw)
    if shape is not None:
        check_shape(body, *shape)  # before the messages are validated one by one
    if not _passes_as_is(body):
        return cast(ChatBody, body), bool(validated(ChatCompletionRequest, body).stream)
    return cast(ChatBody, body), body.get("stream") is True


def _passes_as_is(body: dict[str, Any]) -> bool:
    """Whether `ChatCompletionRequest` would take the body and coerce nothing in it, told
    without building the model, which costs in the history's length: the model an exact
    string, `stream` an exact bool if any, and each message either plain (a role and text)
    or taken by `ChatMessage` on its own. False sends the body through the model, for the
    same answer or the error its field path names."""
    stream = body.get("stream")
    messages = body.get("messages")
    if (
        type(body.get("model")) is not str
        or (stream is not None and type(stream) is not bool)
        or type(messages) is not list
        or not messages
    ):
        return False
    for message in messages:
        if type(message) is not dict:
            return False
        role, content = message.get("role"), message.get("content")
        plain = (
            type(role) is str
            and role in _ROLES
            and (content is None or type(content) is str)
            and _PLAIN_KEYS.issuperset(message)
        )
        if not plain:
            try:
                ChatMessage.model_validate(message)
            except ValidationError:
                return False
    return True


# The finish reason of the last chunk of a stream stopped by an explicit cancel.
CANCELLED_FINISH = "cancelled"
REDACTED_THINKING = "redacted_thinking"  # the block kind Anthropic's redacted thinking gets


class ChatChunkRenderer:
    """The gateway's stream events as OpenAI chat completion chunks.

    Used when the upstream speaks another wire format (an OpenAI-compatible upstream's own
    bytes are relayed unchanged instead). One chunk per delta, so delivery stays per delta.
    """

    def __init__(self, model: str, *, include_usage: bool) -> None:
        self.response_id = completion_id()
        self._base = {
            "id": self.response_id,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": model,
        }
        self._include_usage = include_usage
        self.price: Callable[[dict[str, Any]], float | None] | None = None
        self._kinds: dict[int, str] = {}
        self._tools: dict[int, int] = {}  # block index -> position in tool_calls
        self._reasoning: dict[int, list[str]] = {}  # reasoning blocks' text, until they end
        self._thinking_blocks = 0  # `thinking_blocks` entries sent
        self._role_sent = False

    def _chunk(self, delta: dict[str, Any], finish: str | None = None) -> bytes:
        if not self._role_sent:
            delta = {"role": "assistant", **delta}
            self._role_sent = True
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**self._base, "choices": [choice]}) + b"\n\n"

    def render(self, events: list[StreamEvent]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if isinstance(event, BlockStart):
                self._kinds[event.index] = event.kind
                if event.kind == REASONING:
                    self._reasoning[event.index] = []
                elif event.kind == REDACTED_THINKING:
                    data = (event.data or {}).get("data")
                    if isinstance(data, str):
                        out.append(self._thinking({"type": REDACTED_THINKING, "data": data}))
                elif event.kind == TOOL_CALL:
                    position = self._tools[event.index] = len(self._tools)
                    call = {
                        "index": position,
                        "id": event.id,
                        "type": "function",
                        "function": {"name": event.name, "arguments": ""},
                    }
                    out.append(self._chunk({"tool_calls": [call]}))
            elif isinstance(event, BlockDelta):
                kind = self._kinds.get(event.index, TEXT)
                if kind == TEXT:
                    out.append(self._chunk({"content": event.text}))
                elif kind == REASONING:
                    self._reasoning.get(event.index, []).append(event.text)
                    out.append(self._chunk({"reasoning_content": event.text}))
                elif kind == TOOL_CALL:
                    call = {
                        "index": self._tools[event.index],
                        "function": {"arguments": event.text},
                    }
                    out.append(self._chunk({"tool_calls": [call]}))
            elif isinstance(event, BlockEnd):
                parts = self._reasoning.pop(event.index, None)
                signature = (event.data or {}).get("signature")
                if parts is not None and isinstance(signature, str) and signature:
                    thinking = "".join(parts)
                    block = {"type": "thinking", "thinking": thinking, "signature": signature}
                    out.append(self._thinking(block))
            elif isinstance(event, Finish):
                out.append(self._chunk({}, event.reason))
            elif isinstance(event, Usage) and self._include_usage and "partial" not in event.usage:
                body = {**self._base, "choices": [], "usage": chat_usage(event.usage, self.price)}
                out.append(b"data: " + orjson.dumps(body) + b"\n\n")
        return b"".join(out)

    def _thinking(self, block: dict[str, Any]) -> bytes:
        """A signed thinking block, whole, once it has ended: `thinking_blocks` (LiteLLM's
        field) beside `reasoning_content`, for the client to send back with the message (its
        `index` lets the openai SDK's stream accumulator collect them)."""
        index = self._thinking_blocks
        self._thinking_blocks += 1
        return self._chunk({"thinking_blocks": [{"index": index, **block}]})

    def track(self, events: list[StreamEvent]) -> None:
        pass  # chat chunks need no closing: a cancel's final chunk stands alone

    @staticmethod
    def done() -> bytes:
        return b"data: [DONE]\n\n"

    @staticmethod
    def error(error: GatewayError) -> bytes:
        # The OpenAI SDKs raise APIError on a data event carrying `error`; no [DONE] follows.
        return b"data: " + orjson.dumps(error.to_openai()) + b"\n\n"

    def cancelled(self) -> bytes:
        return self.render([Finish(CANCELLED_FINISH)]) + self.done()

    @staticmethod
    def shutdown(message: str) -> bytes:
        """The in-stream error event `error()` writes, of type and code `shutdown`."""
        error = {"message": message, "type": "shutdown", "code": "shutdown", "param": None}
        return b"data: " + orjson.dumps({"error": error}) + b"\n\n"


def chat_usage(
    usage: dict[str, Any], price: Callable[[dict[str, Any]], float | None] | None = None
) -> dict[str, Any]:
    """The gateway's usage as a chat completion reports it: OpenAI's fields (cache reads in
    `prompt_tokens_details.cached_tokens`, inside `prompt_tokens`), the provider's own report
    left out. Tokens written to Anthropic's cache (counted in `prompt_tokens` too) have no
    OpenAI field; they are added as `cache_creation_input_tokens`, as LiteLLM reports them.
    With `price`, what the usage costs, as `cost_usd` (a field the SDKs keep as an extra)."""
    out = {k: v for k, v in usage.items() if k != "provider_usage"}
    provider = usage.get("provider_usage")
    written = provider.get("cache_creation_input_tokens") if isinstance(provider, dict) else None
    if isinstance(written, int) and not isinstance(written, bool) and written:
        out["cache_creation_input_tokens"] = written
    if price is not None and (cost := price(usage)) is not None:
        out["cost_usd"] = cost
    return out


def usage_chunk_with_cost(frame: bytes, cost: float) -> bytes:
    """An upstream's usage chunk (relayed unchanged otherwise) with `usage.cost_usd` added;
    the frame as it was if it is not one."""
    try:
        chunk = orjson.loads(frame.partition(b"data:")[2])
    except orjson.JSONDecodeError:
        return frame
    usage = chunk.get("usage") if isinstance(chunk, dict) else None
    if not isinstance(usage, dict):
        return frame
    usage["cost_usd"] = cost
    return b"data: " + orjson.dumps(chunk) + b"\n\n"


def completion_id() -> str:
    return f"chatcmpl-{sortable_hex()}"


def completion_body(model: str, assembler: BlockAssembler, response_id: str | None = None) -> bytes:
    """A non-streaming chat completion built from assembled blocks."""
    blocks = [b.to_content() for b in assembler.blocks()]
    message = assistant_message(blocks)
    usage = chat_usage(assembler.usage or {})
    return orjson.dumps(
        {
            "id": response_id or completion_id(),
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": assembler.finish_reason,
                }
            ],
            "usage": usage or None,
        }
    )


def include_usage(body: Mapping[str, object]) -> bool:
    """Whether the client asked for the stream's usage chunk (`stream_options.include_usage`)."""
    options = body.get("stream_options")
    return isinstance(options, dict) and bool(options.get("include_usage"))


class OpenAIChat:
    """The OpenAI Chat Completions dialect; OpenAI-compatible upstream bytes pass unchanged."""

    name = "openai.chat"
    wire = "openai_chat"

    def renderer(self, body: Mapping[str, object]) -> ChatChunkRenderer:
        return ChatChunkRenderer(str(body.get("model")), include_usage=include_usage(body))

    def body(self, model: str, assembler: BlockAssembler, response_id: str) -> bytes:
        return completion_body(model, assembler, response_id)

    def error_body(self, error: GatewayError) -> dict[str, Any]:
        return error.to_openai()


OPENAI_CHAT = OpenAIChat()
