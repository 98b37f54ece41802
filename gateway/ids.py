"""Random ids, from the OS's generator a page at a time.

Every request makes several (its request id, a turn's, its events' uids, a completion's): a
getrandom call each was a measurable part of a request, so the bytes are fetched 4 KiB at a
time and handed out in order.
"""

from __future__ import annotations

import os
import time

_ENTROPY_BYTES = 4096
_entropy = b""
_entropy_at = _ENTROPY_BYTES


def random_hex(n: int) -> str:
    """`n` random bytes as hex (`os.urandom(n).hex()`, from a buffer)."""
    global _entropy, _entropy_at
    if _entropy_at + n > _ENTROPY_BYTES:
        if n > _ENTROPY_BYTES:
            return os.urandom(n).hex()
        _entropy, _entropy_at = os.urandom(_ENTROPY_BYTES), 0
    start = _entropy_at
    _entropy_at += n
    return _entropy[start : start + n].hex()


def _forget_entropy() -> None:
    # A forked worker must not hand out the ids its parent's buffer still holds.
    global _entropy_at
    _entropy_at = _ENTROPY_BYTES


os.register_at_fork(after_in_child=_forget_entropy)


def sortable_hex() -> str:
    """32 hex digits: the time in milliseconds, then 80 random bits.

    Ids that grow with time land at the right edge of the store's indexes, so a turn's inserts
    touch a few index pages instead of one random page per index and row (which the write-ahead
    log then writes whole); 80 random bits keep them as unguessable as any id needs to be.
    """
    global _ms, _ms_hex
    ms = time.time_ns() // 1_000_000
    if ms != _ms:  # a request makes five ids, in the same millisecond: formatted once
        _ms, _ms_hex = ms, f"{ms:012x}"
    return _ms_hex + random_hex(10)


_ms, _ms_hex = -1, ""


def new_id(prefix: str) -> str:
    return f"{prefix}_{sortable_hex()}"
