"""Ids: unique, growing with time, and never shared with a forked worker."""

from __future__ import annotations

import os

from gateway.conversations.events import new_id, sortable_hex


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
