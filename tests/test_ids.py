"""Random hex from a buffer of the OS's randomness: as long as asked, never handed out twice."""

from __future__ import annotations

from gateway.ids import random_hex


def test_random_hex_is_as_long_as_asked_and_never_repeats() -> None:
    drawn = [random_hex(n) for _ in range(3000) for n in (16, 12, 10, 9)]  # past a 4 KiB buffer
    assert len(set(drawn)) == len(drawn)
    assert [len(d) for d in drawn[:4]] == [32, 24, 20, 18]
    assert all(int(d, 16) >= 0 for d in drawn)
    assert len(random_hex(10_000)) == 20_000  # more than the buffer holds: drawn directly
