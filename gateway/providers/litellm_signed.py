"""The OpenAI chat chunks the litellm adapter writes for a Claude model, signed thinking and all.

litellm hands Claude's thinking signature (Bedrock's, Vertex AI's) on in `thinking_blocks`, its
own field beside `reasoning_content`: `{"type": "thinking", "thinking": ..., "signature": ...}`
(or `redacted_thinking` with its `data`). Read here, the signature is recorded with its reasoning
block, as an Anthropic deployment's is, so that a history the gateway rebuilds (a Responses
follow-up, a restored conversation) sends it back in `thinking_blocks`, which Claude needs to go
on with a thinking and tool loop. Other chunks read as OpenAI chat.
"""

from __future__ import annotations

from typing import Any

from gateway.providers.openai_chat import ChatStreamParser, parse_completion
from gateway.stream.events import (
    REASONING,
    BlockDelta,
    BlockEnd,
    BlockStart,
    StreamEvent,
)


def _blocks(holder: Any) -> list[dict[str, Any]]:
    """The `thinking_blocks` of a delta or message."""
    blocks = holder.get("thinking_blocks") if isinstance(holder, dict) else None
    return [b for b in blocks if isinstance(b, dict)] if isinstance(blocks, list) else []


class SignedChatParser(ChatStreamParser):
    def __init__(self) -> None:
        super().__init__()
        self._signature = ""  # the open reasoning block's, once a chunk has said it
        self._reasoning: int | None = None  # that block's index

    def chunk(self, obj: dict[str, Any]) -> list[StreamEvent]:
        choices = obj.get("choices")
        first = choices[0] if isinstance(choices, list) and choices else None
        for block in _blocks(first.get("delta") if isinstance(first, dict) else None):
            signature = block.get("signature")
            if isinstance(signature, str) and signature:
                self._signature = signature
        events = super().chunk(obj)
        for event in events:
            if isinstance(event, BlockStart) and event.kind == REASONING:
                self._reasoning = event.index
            elif isinstance(event, BlockEnd) and event.index == self._reasoning:
                if self._signature:
                    event.data = {"signature": self._signature}
                self._signature, self._reasoning = "", None
        return events


def parse_signed_completion(obj: dict[str, Any]) -> list[StreamEvent]:
    """A whole litellm answer for a Claude model: each signed thinking block a reasoning block
    of its own, with its signature, then the rest as OpenAI chat."""
    choices = obj.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    message = first.get("message") if isinstance(first, dict) else None
    thinking = [
        b
        for b in _blocks(message)
        if isinstance(b.get("thinking"), str) and isinstance(b.get("signature"), str)
    ]
    if not thinking or not isinstance(first, dict) or not isinstance(message, dict):
        return parse_completion(obj)
    out: list[StreamEvent] = []
    for index, block in enumerate(thinking):
        out += (
            BlockStart(index, REASONING),
            BlockDelta(index, block["thinking"]),
            BlockEnd(index, {"signature": block["signature"]}),
        )
    rest = {k: v for k, v in message.items() if k not in ("reasoning_content", "thinking_blocks")}
    shift = len(thinking)
    for event in parse_completion({**obj, "choices": [{**first, "message": rest}]}):
        if isinstance(event, BlockStart | BlockDelta | BlockEnd):
            event.index += shift
        out.append(event)
    return out
