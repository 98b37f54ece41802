"""A few at a time per key: one key's burst of heavy work queues behind itself, never in front
of another key's.

A key's semaphore exists while some of its work holds or awaits it, so an idle key costs
nothing and the table never grows with keys that came once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class KeyLanes:
    def __init__(self) -> None:
        # key -> (its semaphore, how many hold or await it)
        self._lanes: dict[str, tuple[asyncio.Semaphore, int]] = {}

    @asynccontextmanager
    async def hold(
        self, key: str, width: int, wait_s: float | None = None, hold_s: float | None = None
    ) -> AsyncIterator[None]:
        """One of `width` places of `key`'s lane, awaited in order of arrival (`TimeoutError`
        after `wait_s`), and given up at the end or after `hold_s`, whichever comes first."""
        lane, users = self._lanes.get(key) or (asyncio.Semaphore(width), 0)
        self._lanes[key] = (lane, users + 1)
        try:
            async with asyncio.timeout(wait_s):
                await lane.acquire()
            place = _Place(lane)
            timer = None
            if hold_s is not None:
                timer = asyncio.get_running_loop().call_later(hold_s, place.give_up)
            try:
                yield
            finally:
                place.give_up()
                if timer is not None:
                    timer.cancel()
        finally:
            lane, users = self._lanes[key]
            if users == 1:
                del self._lanes[key]
            else:
                self._lanes[key] = (lane, users - 1)

    def __len__(self) -> int:
        return len(self._lanes)


class _Place:
    """A place held in a lane, given back once."""

    __slots__ = ("_lane",)

    def __init__(self, lane: asyncio.Semaphore) -> None:
        self._lane: asyncio.Semaphore | None = lane

    def give_up(self) -> None:
        if self._lane is not None:
            self._lane.release()
            self._lane = None
