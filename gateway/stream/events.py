"""The gateway's own stream events: what every upstream wire format is parsed into.

A block is one unit of assistant output (`text`, `reasoning`, `tool_call`, or a kind the gateway
does not know). Indexes are assigned by the wire-format parser in first-seen order and are
unique within one attempt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

TEXT = "text"
REASONING = "reasoning"
TOOL_CALL = "tool_call"
KNOWN_KINDS = frozenset({TEXT, REASONING, TOOL_CALL})

# What one upstream frame was, as every wire-format parser reports it next to its events.
FrameKind = Literal["data", "done", "comment", "usage_only", "error"]


@dataclass(slots=True)
class BlockStart:
    index: int
    kind: str
    id: str | None = None  # tool calls
    name: str | None = None  # tool calls
    data: dict[str, Any] | None = None  # whatever an unknown kind carries


@dataclass(slots=True)
class BlockDelta:
    index: int
    text: str  # text, reasoning, or a fragment of a tool call's JSON arguments


@dataclass(slots=True)
class BlockEnd:
    """The wire format says the block is complete (or a later block started in another channel)."""

    index: int
    data: dict[str, Any] | None = None  # e.g. a reasoning signature


@dataclass(slots=True)
class Usage:
    usage: dict[str, Any]


@dataclass(slots=True)
class Finish:
    reason: str


@dataclass(slots=True)
class StreamFailure:
    """An error reported inside the stream; the attempt has failed."""

    message: str
    upstream: dict[str, Any]


StreamEvent = BlockStart | BlockDelta | BlockEnd | Usage | Finish | StreamFailure
