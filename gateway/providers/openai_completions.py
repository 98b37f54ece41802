"""OpenAI's legacy Completions API upstream (`POST /completions`: gpt-3.5-turbo-instruct, vLLM,
TGI, llama.cpp, base and code models): its wire format, and the view of a deployment that
serves it.

Pure where it parses: a `text_completion` chunk (`choices[].text`) is read as the chat chunk it
stands for (`delta.content`), so the chat parser draws the one text block and its finish, and
usage, errors and `[DONE]` are read exactly as in chat. Only the first choice is assembled.

`NativeCompletions` is a deployment's provider as /v1/completions sees it: an OpenAI-compatible
or Azure deployment (which has `completions`) is sent the client's own body, and its bytes go
back unchanged (its wire is the dialect's). A deployment without one is left as it is: it gets
the chat translation, and the answer is rendered as completions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import orjson

from gateway.errors import UpstreamProtocolError
from gateway.providers.base import UpstreamResponse
from gateway.providers.openai_chat import ChatStreamParser, parse_completion
from gateway.providers.params import (
    COMPLETIONS_EXTRAS,
    COMPLETIONS_REQUEST,
    EXTRAS,
    PRIVATE,
    ClientBody,
)
from gateway.stream.events import FrameKind, StreamEvent
from gateway.stream.sse import SSEFrame

OPENAI_COMPLETIONS = "openai_completions"


def _as_chat(obj: dict[str, Any]) -> dict[str, Any]:
    """A text_completion object (chunk or whole) as the chat chunk it stands for."""
    choices = obj.get("choices")
    if not isinstance(choices, list):
        return obj
    chat = []
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        text = choice.get("text")
        delta = {"content": text} if isinstance(text, str) else {}
        chat.append(
            {
                "index": choice.get("index", 0),
                "delta": delta,
                "finish_reason": choice.get("finish_reason"),
            }
        )
    return {**obj, "choices": chat}


class CompletionsStreamParser:
    """SSE frames of a streamed `/completions` answer -> the gateway's stream events."""

    def __init__(self) -> None:
        self._chat = ChatStreamParser()
        self.response_id: str | None = None
        self.done = False  # saw `data: [DONE]`
        self.finished = False  # saw a finish_reason

    def feed(self, frame: SSEFrame) -> tuple[list[StreamEvent], FrameKind]:
        out = self._feed(frame)
        self.done, self.finished = self._chat.done, self._chat.finished
        return out

    def _feed(self, frame: SSEFrame) -> tuple[list[StreamEvent], FrameKind]:
        data = frame.data
        if data is None or data.strip() == "[DONE]":
            return self._chat.feed(frame)
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError(f"invalid JSON in a stream chunk: {data[:200]!r}") from None
        if not isinstance(obj, dict):
            raise UpstreamProtocolError(f"a stream chunk is not a JSON object: {data[:200]!r}")
        if self.response_id is None and isinstance(obj.get("id"), str):
            self.response_id = obj["id"]
        chat = orjson.dumps(_as_chat(obj)).decode()
        return self._chat.feed(SSEFrame(frame.raw, frame.event, chat, frame.id, frame.complete))


def parse_text_completion(obj: dict[str, Any]) -> list[StreamEvent]:
    """A whole `text_completion` as the events a stream would give."""
    chat = _as_chat(obj)
    choices = chat.get("choices")
    if isinstance(choices, list):
        chat["choices"] = [
            {"index": c["index"], "message": c["delta"], "finish_reason": c["finish_reason"]}
            for c in choices
        ]
    return parse_completion(chat)


class NativeCompletions:
    """A deployment's provider serving `/completions` itself (one that has `completions`)."""

    wire = OPENAI_COMPLETIONS

    def __init__(self, provider: Any) -> None:
        self._provider = provider

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamResponse:
        raw = body.get(COMPLETIONS_REQUEST)
        client = raw.current(body) if isinstance(raw, ClientBody) else None
        if client is None:  # the gateway changed the history (a continuation): its text
            client = {
                **{k: v for k, v in body.items() if k not in ("messages", *PRIVATE, *EXTRAS)},
                **(body.get(COMPLETIONS_EXTRAS) or {}),
                "prompt": prompt_of(body.get("messages") or []),
            }
        response: UpstreamResponse = await self._provider.completions(client, stream=stream)
        return response


def completions_view(deployment: Any) -> Any:
    """The deployment as /v1/completions routes to it: one whose provider serves the legacy
    `/completions` itself (an OpenAI-compatible or Azure chat deployment) speaks it; any
    other is left as it is, to be sent the chat translation."""
    provider = deployment.provider
    if getattr(provider, "wire", None) == "openai_chat" and hasattr(provider, "completions"):
        return replace(deployment, provider=NativeCompletions(provider))
    return deployment


def prompt_of(messages: list[Any]) -> str:
    """The prompt a chat history stands for: its messages' text, one after the other (the
    prompt, then what the answer had said before a continuation)."""
    parts = []
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts += [p["text"] for p in content if isinstance(p, dict) and "text" in p]
    return "".join(parts)
