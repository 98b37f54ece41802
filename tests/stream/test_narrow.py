"""Narrow integer sequences widen to 4, then 8 bytes an item, keeping every item."""

from __future__ import annotations

from array import array

from gateway.stream.narrow import widened


def test_lengths_widen_to_4_then_8_bytes() -> None:
    assert widened(bytearray(b"\x01\xff"), [256]) == array("I", [1, 255, 256])
    assert widened(bytearray(b"\x01"), [2**40]) == array("Q", [1, 2**40])
    assert widened(array("I", [7]), [2**40]) == array("Q", [7, 2**40])
    # Several at once (a write of many frames), from bytes: their items, not their bytes.
    assert widened(bytearray(b"\x01\x02\x03\x04"), [300, 5]) == array("I", [1, 2, 3, 4, 300, 5])
    assert widened(array("Q", [1]), [2]) == array("Q", [1, 2])
