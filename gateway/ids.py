"""Random ids, from the OS's generator a page at a time.

Every request makes several (its request id, a turn's, its events' uids, a completion's): a
getrandom call each was a measurable part of a request, so the bytes are fetched 4 KiB at a
time and handed out in order.
"""

from __future__ import annotations

import os

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
