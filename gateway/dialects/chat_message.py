"""An answer's blocks (`stream.assembler`) as one OpenAI chat assistant message: how a recorded
answer enters model history, and how a non-streaming answer is rendered for a chat client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# An answer's blocks: as stored (`storage.records.ContentBlock`), or as the assembler makes them.
Blocks = Sequence[Mapping[str, Any]]


def assistant_message(blocks: Blocks) -> dict[str, Any]:
    """An `assistant/message` payload's blocks as one OpenAI chat assistant message."""
    text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
    reasoning = "".join(b.get("text", "") for b in blocks if b.get("type") == "reasoning")
    calls = [
        {
            "id": b.get("id"),
            "type": "function",
            "function": {"name": b.get("name"), "arguments": b.get("arguments", "")},
        }
        for b in blocks
        if b.get("type") == "tool_call"
    ]
    message: dict[str, Any] = {
        "role": "assistant",
        "content": text if (text or not calls) else None,
    }
    if reasoning:
        message["reasoning_content"] = reasoning
    thinking = thinking_blocks(blocks)
    if thinking:
        message["thinking_blocks"] = thinking
    if calls:
        message["tool_calls"] = calls
    return message


def thinking_blocks(blocks: Blocks) -> list[dict[str, Any]]:
    """The answer's signed thinking, as Anthropic must get it back in a later turn (with its
    tool calls, docs/providers.md "Thinking"): each reasoning block that carries a `signature`
    and each `redacted_thinking` block, in stream order, in the `thinking_blocks` shape LiteLLM
    uses. None for an answer that has neither (any provider but Anthropic)."""
    out: list[dict[str, Any]] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "reasoning" and isinstance(block.get("signature"), str) and block["signature"]:
            out.append(
                {
                    "type": "thinking",
                    "thinking": block.get("text", ""),
                    "signature": block["signature"],
                }
            )
        elif kind == "redacted_thinking":
            data = block.get("data")
            data = data.get("data") if isinstance(data, dict) else data
            if isinstance(data, str):
                out.append({"type": "redacted_thinking", "data": data})
    return out
