"""Narrow integer sequences widen to 2, 4, then 8 bytes an item, keeping every item."""

from __future__ import annotations

from array import array

from gateway.stream.narrow import widened


def test_items_widen_only_as_far_as_the_new_values_need() -> None:
    assert widened(bytearray(b"\x01\xff"), [256]) == array("H", [1, 255, 256])
    assert widened(bytearray(b"\x01"), [65_536]) == array("I", [1, 65_536])
    assert widened(bytearray(b"\x01"), [2**40]) == array("Q", [1, 2**40])
    assert widened(array("H", [7]), [65_536]) == array("I", [7, 65_536])
    assert widened(array("I", [7]), [2**40]) == array("Q", [7, 2**40])
    # Several at once (a write of many frames), from bytes: their items, not their bytes.
    assert widened(bytearray(b"\x01\x02\x03\x04"), [300, 5]) == array("H", [1, 2, 3, 4, 300, 5])


def test_items_never_narrow() -> None:
    # A small value arriving where wider items already are keeps their width.
    assert widened(array("I", [70_000]), [2]).typecode == "I"
    assert widened(array("Q", [1]), [2]) == array("Q", [1, 2])


def test_the_widths_are_2_4_and_8_bytes() -> None:
    for values, size in (([256], 2), ([65_536], 4), ([2**32], 8)):
        assert widened(bytearray(), values).itemsize == size
