"""Whether a request's objects are freed by reference counting alone, as its handler returns:
the cyclic collector off while a test serves requests, and a wait for weakly held objects to
go. A reference cycle keeps them (then never, with the collector off)."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any


@contextmanager
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


async def all_freed(refs: Sequence[weakref.ref[Any]], timeout_s: float = 5) -> None:
    """Until each object is freed; an AssertionError naming what still holds those that are
    not after `timeout_s`."""
    assert refs, "nothing was watched"
    try:
        async with asyncio.timeout(timeout_s):
            while any(ref() is not None for ref in refs):
                await asyncio.sleep(0.001)
    except TimeoutError:
        alive = [kept for ref in refs if (kept := ref()) is not None]
        held = {type(kept).__name__: [_name(h) for h in gc.get_referrers(kept) if h is not alive]
                for kept in alive}  # fmt: skip
        raise AssertionError(f"outlived its request, held by: {held}") from None


def _name(referrer: object) -> str:
    code = getattr(referrer, "f_code", None)  # a frame: its function's
    return code.co_name if code is not None else type(referrer).__name__
