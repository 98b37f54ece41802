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


# Each `__init__` written out: compiled (gateway.native) it runs as C, where the one the
# decorator writes stays interpreted (~0.25 us an event, several events an answer).


@dataclass(slots=True, init=False)
class BlockStart:
    index: int
    kind: str
    id: str | None  # tool calls
    name: str | None  # tool calls
    data: dict[str, Any] | None  # whatever an unknown kind carries

    def __init__(
        self,
        index: int,
        kind: str,
        id: str | None = None,
        name: str | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        self.index = index
        self.kind = kind
        self.id = id
        self.name = name
        self.data = data


@dataclass(slots=True, init=False)
class BlockDelta:
    index: int
    text: str  # text, reasoning, or a fragment of a tool call's JSON arguments

    def __init__(self, index: int, text: str) -> None:
        self.index = index
        self.text = text


@dataclass(slots=True, init=False)
class BlockEnd:
    """The wire format says the block is complete (or a later block started in another channel)."""

    index: int
    data: dict[str, Any] | None  # e.g. a reasoning signature

    def __init__(self, index: int, data: dict[str, Any] | None = None) -> None:
        self.index = index
        self.data = data


@dataclass(slots=True, init=False)
class Usage:
    usage: dict[str, Any]

    def __init__(self, usage: dict[str, Any]) -> None:
        self.usage = usage


@dataclass(slots=True, init=False)
class Finish:
    reason: str

    def __init__(self, reason: str) -> None:
        self.reason = reason


@dataclass(slots=True, init=False)
class StreamFailure:
    """An error reported inside the stream; the attempt has failed."""

    message: str
    upstream: dict[str, Any]

    def __init__(self, message: str, upstream: dict[str, Any]) -> None:
        self.message = message
        self.upstream = upstream


StreamEvent = BlockStart | BlockDelta | BlockEnd | Usage | Finish | StreamFailure
