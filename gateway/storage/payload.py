"""An event payload encoded when the store writes it, not when the turn appends it.

A long stream's payload is mostly its compact stream, whose long runs (`dt`, `parts`) are
read back out of the attempt's log in batches. Encoding that up front would hold the whole
JSON (1.4 MiB for a 100,000-chunk answer of 0.48 MiB of text) from the turn's end until the
write, beside the database's own copies of it. A `DeferredPayload` is the payload dict with those
runs left as values that write their own JSON (`write_json(out)`); `encode()` makes the JSON
then, into one growing buffer, byte for byte what `orjson.dumps` makes of the same payload with
those values as plain lists. SQLite binds it through an adapter (`gateway.storage.sqlite`), so
the buffer is let go of as soon as SQLite has copied it, before SQLite builds its row.

What a deferred value reads must not change until the payload is written (the attempt's log
only grows), and it is read on the store's thread: no buffer exports that a growing array on
the event loop's thread could trip over.
"""

from __future__ import annotations

from typing import Any, Protocol

import orjson


class WritesJSON(Protocol):
    def write_json(self, out: bytearray) -> None:
        """Append this value's JSON to `out`."""


class DeferredPayload(dict[str, Any]):
    """A payload dict holding `WritesJSON` values somewhere inside (dicts and lists)."""

    __slots__ = ()

    def encode(self) -> bytearray:
        out = bytearray()
        _write(out, self)
        return out


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
