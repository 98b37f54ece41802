"""Random hex from a buffer of the OS's randomness: as long as asked, never handed out twice;
sortable ids: their millisecond, then randomness."""

from __future__ import annotations

import os

import pytest

from gateway import ids
from gateway.ids import new_id, random_hex, sortable_hex


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
    monkeypatch.setattr(ids.time, "time_ns", lambda: next(clock))
    first, same_ms, next_ms = (ids.sortable_hex() for _ in range(3))
    assert [len(i) for i in (first, same_ms, next_ms)] == [32, 32, 32]
    assert first[:12] == same_ms[:12] == f"{1_700_000_000_000:012x}" and first != same_ms
    assert next_ms[:12] == f"{1_700_000_000_001:012x}" and first < next_ms


def test_ids_are_unique_and_grow_with_time() -> None:
    ids = [sortable_hex() for _ in range(20_000)]
    assert len(set(ids)) == len(ids)
    stamps = [int(i[:12], 16) for i in ids]
    assert stamps == sorted(stamps)
    assert new_id("conv").startswith("conv_") and len(new_id("conv")) == 5 + 32


def test_a_forked_child_draws_its_own_randomness() -> None:
    sortable_hex()  # the parent's buffer is filled and partly used
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next id's random part, then leave at once
        os.write(write, sortable_hex()[12:].encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    child = os.read(read, 64).decode()
    os.close(read)
    assert len(child) == 20
    assert child != sortable_hex()[12:]  # the parent's next draw is not the child's
