"""An event payload encoded when the store writes it, not when the turn appends it.

A long stream's payload is mostly its compact stream, whose long runs (`dt`, `parts`) are
read back out of the attempt's log in batches. Encoding that up front would hold the whole
JSON (1.4 MiB for a 100,000-chunk answer of 0.48 MiB of text) from the turn's end until the
write, beside the database's own copies of it. A `DeferredPayload` is the payload dict with those
runs left as values that write their own JSON (`write_json(out)`); `encode()` makes the JSON
then, into one growing buffer, byte for byte what `orjson.dumps` makes of the same payload with
those values as plain lists. `write()` makes the same bytes without ever holding them whole,
handing them on a piece at a time: SQLite writes them so into a blob of their own
(`gateway.storage.sqlite`), as binding them whole would cost three copies on the way.

What a deferred value reads must not change until the payload is written (the attempt's log
only grows), and it is read on the store's thread: no buffer exports that a growing array on
the event loop's thread could trip over.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import orjson


class WritesJSON(Protocol):
    def write_json(self, out: bytearray) -> None:
        """Append this value's JSON to `out` (appending only: `out` may pass on and drop what
        it holds between two appends)."""


# How much of a payload's JSON `write()` holds before handing it on.
PIECE = 64 * 1024


class DeferredPayload(dict[str, Any]):
    """A payload dict holding `WritesJSON` values somewhere inside (dicts and lists)."""

    __slots__ = ()

    def encode(self) -> bytearray:
        out = bytearray()
        _write(out, self)
        return out

    def write(self, give: Callable[[bytearray], object], piece: int | None = None) -> int:
        """Hand the JSON to `give` in pieces of about `piece` bytes (each buffer reused once
        `give` returns), never holding the whole of it; the number of bytes handed on. The
        same bytes as `encode()`, so a first pass can size what a second one writes."""
        out = _Spill(give, piece or PIECE)
        _write(out, self)
        out.hand_on()
        return out.total

    def size(self) -> int:
        """The length of its JSON, without holding it."""
        return self.write(_ignore)


def _ignore(_: bytearray) -> None:
    pass


class _Spill(bytearray):
    """A buffer that hands what it holds to `give` whenever that reaches `piece` bytes."""

    def __init__(self, give: Callable[[bytearray], object], piece: int) -> None:
        super().__init__()
        self._give = give
        self._piece = piece
        self.total = 0

    def __iadd__(self, data: Any) -> _Spill:  # type: ignore[misc]
        bytearray.__iadd__(self, data)
        if len(self) >= self._piece:
            self.hand_on()
        return self

    def hand_on(self) -> None:
        if self:
            self._give(self)
            self.total += len(self)
            del self[:]


def _write(out: bytearray, value: Any) -> None:
    if isinstance(value, dict):
        sep = b"{"
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError("a payload's keys are strings")
            out += sep
            out += orjson.dumps(key)
            out += b":"
            _write(out, item)
            sep = b","
        out += b"}" if value else b"{}"
    elif isinstance(value, list | tuple):
        sep = b"["
        for item in value:
            out += sep
            _write(out, item)
            sep = b","
        out += b"]" if value else b"[]"
    elif hasattr(value, "write_json"):
        value.write_json(out)
    else:
        out += orjson.dumps(value)


def encoded(payload: dict[str, Any]) -> bytes | bytearray:
    """A payload's JSON: what the store writes for it."""
    if isinstance(payload, DeferredPayload):
        return payload.encode()
    return orjson.dumps(payload)


def as_bytes(payload: bytes | bytearray | DeferredPayload) -> bytes | bytearray:
    """A row's payload that is not text yet, as its JSON's UTF-8 bytes."""
    return payload.encode() if isinstance(payload, DeferredPayload) else payload


def as_text(payload: bytes | bytearray | str | DeferredPayload) -> str:
    """A row's payload as the JSON text it stands for (for the spool, and PostgreSQL)."""
    if isinstance(payload, str):
        return payload
    if isinstance(payload, DeferredPayload):
        payload = payload.encode()
    return payload.decode()
