"""OpenAI's legacy Completions API, as clients send it (`POST /v1/completions`).

A prompt and its continuation, recorded as a turn like any chat: the prompt is the turn's user
message, the completion its assistant message (interrupted at what was delivered, if the client
left). The request becomes a chat body for the gateway's path (limits, the conversation,
routing), with the client's own body beside it:

- a deployment that serves `/completions` itself (OpenAI-compatible, Azure) is sent the client's
  body and its bytes come back unchanged (gateway.providers.openai_completions);
- any other (Anthropic, litellm's, the demo) gets the chat translation, a user message, and its
  answer is rendered here as `text_completion` chunks or a whole `text_completion`.

The parameters chat has no form for (`suffix`, `echo`, `best_of`, `logprobs`, a count here) are
carried by name for the first kind and refused by name by the second (400
`unsupported_parameter`, or dropped with `drop_params`). One prompt a request: a list of several,
or of token ids, is a 400 (the gateway records each prompt as the text a user sent).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, cast

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gateway.dialects.openai_chat import (
    CANCELLED_FINISH,
    ChatBody,
    ChatChunkRenderer,
    OpenAIChat,
    chat_usage,
    include_usage,
)
from gateway.dialects.requests import Shape, check_shape, parse_json_object, validated
from gateway.errors import InvalidRequest
from gateway.ids import sortable_hex
from gateway.providers.params import COMPLETIONS_EXTRAS, COMPLETIONS_REQUEST, ClientBody
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import TEXT, BlockDelta, BlockStart, Finish, StreamEvent, Usage

# Completions parameters with no chat form, and the values of theirs that ask for nothing.
COMPLETIONS_ONLY: dict[str, tuple[object, ...]] = {
    "suffix": (None, ""),
    "echo": (None, False),
    "best_of": (None, 1),
    "logprobs": (None,),
}


class CompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(description="A model alias from the gateway's config.")
    prompt: Any = None
    stream: bool | None = False


class CompletionsChatBody(ChatBody, total=False):
    """A Completions request as the chat body it becomes, with what only a deployment serving
    `/completions` itself takes beside it (gateway.providers.params)."""

    completions_extras: dict[str, Any]  # COMPLETIONS_EXTRAS
    completions_request: ClientBody  # COMPLETIONS_REQUEST


def parse_request(
    raw: bytes, shape: Shape | None = None
) -> tuple[CompletionsChatBody, CompletionRequest]:
    """Validate a Completions request; return the chat body it becomes and the request."""
    body = parse_json_object(raw)
    request = validated(CompletionRequest, body)
    messages: list[dict[str, Any]] = [{"role": "user", "content": _prompt(body.get("prompt"))}]
    # The client's parameters but the prompt, as chat's (its `model` checked above).
    chat = cast(
        CompletionsChatBody,
        {k: v for k, v in body.items() if k != "prompt" and k not in COMPLETIONS_ONLY},
    )
    chat["messages"] = messages
    extras = {
        name: body[name]
        for name, no_op in COMPLETIONS_ONLY.items()
        if name in body and body[name] not in no_op
    }
    if extras:
        chat[COMPLETIONS_EXTRAS] = extras
    if shape is not None:
        check_shape(chat, *shape)
    chat[COMPLETIONS_REQUEST] = ClientBody(body, messages)
    return chat, request


def _prompt(prompt: object) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if prompt is None:
        raise InvalidRequest("Missing required parameter: 'prompt'.", param="prompt")
    raise InvalidRequest(
        "'prompt' must be a string (or a list of one string): the gateway records each prompt"
        " as the text a user sent, so several prompts, or token ids, take a request each.",
        param="prompt",
    )


def completion_id() -> str:
    return f"cmpl-{sortable_hex()}"


class CompletionChunkRenderer:
    """The gateway's stream events as `text_completion` chunks: text alone (Completions has no
    reasoning or tool calls), one chunk per delta, so delivery stays per delta."""

    def __init__(self, model: str, *, include_usage: bool) -> None:
        self.response_id = completion_id()
        self._base = {
            "id": self.response_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
        }
        self._include_usage = include_usage
        self.price: Callable[[dict[str, Any]], float | None] | None = None
        self._kinds: dict[int, str] = {}

    def _chunk(self, text: str, finish: str | None = None) -> bytes:
        choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": finish}
        return b"data: " + orjson.dumps({**self._base, "choices": [choice]}) + b"\n\n"

    def render(self, events: list[StreamEvent]) -> bytes:
        out: list[bytes] = []
        for event in events:
            if isinstance(event, BlockStart):
                self._kinds[event.index] = event.kind
            elif isinstance(event, BlockDelta):
                if self._kinds.get(event.index, TEXT) == TEXT and event.text:
                    out.append(self._chunk(event.text))
            elif isinstance(event, Finish):
                out.append(self._chunk("", event.reason))
            elif isinstance(event, Usage) and self._include_usage and "partial" not in event.usage:
                body = {**self._base, "choices": [], "usage": chat_usage(event.usage, self.price)}
                out.append(b"data: " + orjson.dumps(body) + b"\n\n")
        return b"".join(out)

    def track(self, events: list[StreamEvent]) -> None:
        pass  # a cancel's final chunk stands alone

    # A stream's end, a failure and a shutdown are framed as in chat.
    done = staticmethod(ChatChunkRenderer.done)
    error = staticmethod(ChatChunkRenderer.error)
    shutdown = staticmethod(ChatChunkRenderer.shutdown)

    def cancelled(self) -> bytes:
        return self._chunk("", CANCELLED_FINISH) + self.done()


def completion_body(model: str, assembler: BlockAssembler, response_id: str) -> bytes:
    """A whole `text_completion` built from assembled blocks (their text)."""
    text = "".join(b.text for b in assembler.blocks() if b.kind == TEXT)
    usage = chat_usage(assembler.usage or {})
    choice = {"text": text, "index": 0, "logprobs": None, "finish_reason": assembler.finish_reason}
    return orjson.dumps(
        {
            "id": response_id,
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": usage or None,
        }
    )


class OpenAICompletions(OpenAIChat):
    """The legacy Completions dialect; a `/completions` upstream's bytes pass unchanged.
    Errors are chat's."""

    name = "openai.completions"
    wire = "openai_completions"

    def renderer(self, body: Mapping[str, object]) -> CompletionChunkRenderer:  # type: ignore[override]
        return CompletionChunkRenderer(str(body.get("model")), include_usage=include_usage(body))

    def body(self, model: str, assembler: BlockAssembler, response_id: str) -> bytes:
        return completion_body(model, assembler, response_id)


OPENAI_COMPLETIONS = OpenAICompletions()
