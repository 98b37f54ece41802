"""Random ids, from the OS's generator a page at a time.

Every request makes several (its request id, a turn's, its events' uids, a completion's): a
getrandom call each was a measurable part of a request, so the bytes are fetched 4 KiB at a
time and handed out in order.
"""

from __future__ import annotations

import os

_ENTROPY_BYTES = 4096


class _Entropy:
    """The page being handed out (an object's attributes: compiled, they are read as C fields,
    where module globals are dictionary lookups)."""

    def __init__(self) -> None:
        self.page = b""
        self.at = _ENTROPY_BYTES


_entropy = _Entropy()


def random_hex(n: int) -> str:
    """`n` random bytes as hex (`os.urandom(n).hex()`, from a buffer)."""
    entropy = _entropy
    start = entropy.at
    if start + n > _ENTROPY_BYTES:
        if n > _ENTROPY_BYTES:
            return os.urandom(n).hex()
        entropy.page, start = os.urandom(_ENTROPY_BYTES), 0
    entropy.at = start + n
    return entropy.page[start : start + n].hex()


def _forget_entropy() -> None:
    # A forked worker must not hand out the ids its parent's buffer still holds.
    _entropy.at = _ENTROPY_BYTES


os.register_at_fork(after_in_child=_forget_entropy)
