"""Random hex from a buffer of the OS's randomness: as long as asked, never handed out twice;
sortable ids: their millisecond, then randomness."""

from __future__ import annotations

import pytest

from gateway.conversations import events
from gateway.ids import random_hex


def test_random_hex_is_as_long_as_asked_and_never_repeats() -> None:
    drawn = [random_hex(n) for _ in range(3000) for n in (16, 12, 10, 9)]  # past a 4 KiB buffer
    assert len(set(drawn)) == len(drawn)
    assert [len(d) for d in drawn[:4]] == [32, 24, 20, 18]
    assert all(int(d, 16) >= 0 for d in drawn)
    assert len(random_hex(10_000)) == 20_000  # more than the buffer holds: drawn directly


def test_sortable_ids_begin_with_their_millisecond_and_sort_by_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = iter([1_700_000_000_000_000_000, 1_700_000_000_000_400_000, 1_700_000_000_001_000_000])
    monkeypatch.setattr(events.time, "time_ns", lambda: next(clock))
    first, same_ms, next_ms = (events.sortable_hex() for _ in range(3))
    assert [len(i) for i in (first, same_ms, next_ms)] == [32, 32, 32]
    assert first[:12] == same_ms[:12] == f"{1_700_000_000_000:012x}" and first != same_ms
    assert next_ms[:12] == f"{1_700_000_000_001:012x}" and first < next_ms
