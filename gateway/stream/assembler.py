"""BlockAssembler: stream events in, assistant blocks out (docs/recording.md, "The assembled
stream")."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.storage.records import ContentBlock
from gateway.stream.events import (
    KNOWN_KINDS,
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


@dataclass(slots=True)
class Block:
    index: int
    kind: str
    parts: list[str] = field(default_factory=list)
    closed: bool = False
    id: str | None = None
    name: str | None = None
    data: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        return "".join(self.parts)

    def to_content(self) -> ContentBlock:
        """The block as stored in an `assistant/message` payload."""
        if self.kind == TOOL_CALL:
            return {"type": TOOL_CALL, "id": self.id, "name": self.name, "arguments": self.text}
        if self.kind in KNOWN_KINDS:
            out: ContentBlock = {"type": self.kind, "text": self.text}
            if self.data:
                # What the provider attached (a thinking block's `signature`): stored beside it.
                out.update(self.data)  # type: ignore[typeddict-item]
            return out
        return {"type": self.kind, "data": self.data, "text": self.text}


class BlockAssembler:
    def __init__(self) -> None:
        self._blocks: dict[int, Block] = {}  # insertion order = first-seen order
        self.finish_reason: str | None = None
        self.usage: dict[str, Any] | None = None

    @classmethod
    def of(cls, events: Iterable[StreamEvent]) -> BlockAssembler:
        assembler = cls()
        for event in events:
            assembler.feed(event)
        return assembler

    def feed(self, event: StreamEvent) -> None:
        if isinstance(event, BlockDelta):
            block = self._blocks.get(event.index)
            if block is None:
                # A delta without a start: a text block by default.
                block = self._blocks[event.index] = Block(event.index, TEXT)
            if not block.closed:  # deltas after an authoritative end are ignored
                block.parts.append(event.text)
        elif isinstance(event, BlockStart):
            if event.index not in self._blocks:
                self._blocks[event.index] = Block(
                    event.index, event.kind, id=event.id, name=event.name, data=event.data
                )
        elif isinstance(event, BlockEnd):
            block = self._blocks.get(event.index)
            if block is not None and not block.closed:
                block.closed = True
                if event.data:
                    block.data = {**(block.data or {}), **event.data}
        elif isinstance(event, Finish):
            self.finish_reason = event.reason
            for block in self._blocks.values():
                block.closed = True
        elif isinstance(event, Usage):
            self.usage = event.usage

    def blocks(self) -> list[Block]:
        """Every block of a completed answer, empty text/reasoning blocks left out."""
        return [b for b in self._blocks.values() if b.kind not in (TEXT, REASONING) or b.text != ""]

    def interrupted_blocks(self) -> list[Block]:
        """What an interrupted answer keeps (docs/recording.md, "The assembled stream").

        Closed and unclosed text and reasoning blocks whose content is not only white space, in
        stream order; tool calls whose arguments are complete; closed blocks of unknown kinds.
        A tool call cut inside its arguments is left out (no client can have run it), and so
        are empty blocks and unclosed unknown blocks.
        """
        kept = []
        for block in self._blocks.values():
            if block.kind in (TEXT, REASONING):
                text = block.text
                if text and not text.isspace():  # (strip() would copy a long answer)
                    kept.append(block)
            elif block.kind == TOOL_CALL:
                if block.closed or _whole_json(block.text):
                    kept.append(block)
            elif block.closed:
                kept.append(block)
        return kept


def _whole_json(arguments: str) -> bool:
    """Arguments that are a whole JSON object: nothing the stream could add keeps them valid,
    so a client that stopped reading there has the whole call (OpenAI chat closes a call only
    with the next block or the finish, which a stop can cut off)."""
    if not arguments.rstrip().endswith("}"):
        return False
    try:
        return isinstance(orjson.loads(arguments), dict)
    except orjson.JSONDecodeError:
        return False
