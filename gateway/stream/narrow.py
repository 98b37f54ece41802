"""Integer sequences kept narrow: a byte an item while every item fits in one, then 2 bytes,
then 4, then 8 (a long stream keeps a few per chunk, and 100,000 int objects would be
megabytes)."""

from __future__ import annotations

from array import array
from typing import TypeAlias

Items: TypeAlias = "bytearray | array[int]"

# The widths an item may take, narrowest first: typecode, bytes, the first value it cannot hold.
_WIDTHS = (("H", 2, 2**16), ("I", 4, 2**32), ("Q", 8, 2**64))


def widened(items: Items, values: list[int]) -> array[int]:
    """`items` and then `values`, in the narrowest items of 2, 4 or 8 bytes that hold all of
    them and are no narrower than `items` (a provider's frame with its SSE and chunk framing is
    often 200-350 bytes, past a byte but far from 2 bytes' 65,535; 2**32 is never reached in
    practice, but not a reason to fail). For when appending `values` to `items` raised
    ValueError (a byte too small) or OverflowError (wider items too small)."""
    top = max(values)
    held = getattr(items, "itemsize", 1)
    code = next(c for c, size, limit in _WIDTHS if top < limit and size >= held)
    wider = array(code, iter(items))  # (from a bytearray: its items, not bytes)
    wider.extend(values)
    return wider
