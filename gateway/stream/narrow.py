"""Integer sequences kept narrow: a byte an item while every item fits in one, then 4 bytes,
then 8 (a long stream keeps a few per chunk, and 100,000 int objects would be megabytes)."""

from __future__ import annotations

from array import array
from typing import TypeAlias

Items: TypeAlias = "bytearray | array[int]"


def widened(items: Items, values: list[int]) -> array[int]:
    """`items` and then `values`, as 4-byte items where all of them fit in 4 bytes, else as
    8-byte items (past 2**32: never in practice, but not a reason to fail). For when appending
    `values` to `items` raised ValueError (a byte too small) or OverflowError."""
    wide = max(values) >= 2**32 or getattr(items, "typecode", "I") == "Q"
    wider = array("Q" if wide else "I", iter(items))  # (from a bytearray: its items, not bytes)
    wider.extend(values)
    return wider
