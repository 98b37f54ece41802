"""Streams whose client stopped reading without closing (`server.client_idle_timeout_s`).

Some frameworks stop consuming a stream and leave its HTTP response open (LlamaIndex
`astream_chat` then `aclose()`, smolagents `generate_stream` then `close()`, an exception in
Haystack's streaming callback): the server sees no disconnect. Once the client's receive window
is full its kernel acknowledges nothing more, and the stream would wait on it for as long as
the connection lives, its turn open. So a stream is watched while it runs: when the client's
side has taken none of what was written for the timeout (acknowledged bytes, or at the "sent"
level bytes handed to the kernel, do not move while more was written), `on_idle` is called
once. A reader that is only slow moves them, and a stream waiting on its upstream with
everything acknowledged has nothing outstanding: neither is idle.

The watch looks a few times per timeout, on the event loop's timer, not per write: a stream
costs one `TCP_INFO` read per look.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

LOOKS_PER_TIMEOUT = 4  # an idle client is noticed within 1 + 1/LOOKS_PER_TIMEOUT timeouts


class IdleReaderWatch:
    def __init__(
        self,
        timeout_s: float,
        progress: Callable[[], tuple[int, bool]],
        on_idle: Callable[[], None],
    ) -> None:
        """`progress`: how far the client's side has got, and whether more was written than
        that (DeliveryTracker.progress)."""
        self._loop = asyncio.get_running_loop()
        self._timeout = timeout_s
        self._every = timeout_s / LOOKS_PER_TIMEOUT
        self._progress = progress
        self._on_idle = on_idle
        self._at = -1
        self._since = self._loop.time()
        self._handle: asyncio.TimerHandle | None = self._loop.call_later(self._every, self._look)

    def _look(self) -> None:
        now = self._loop.time()
        at, outstanding = self._progress()
        if at != self._at or not outstanding:
            self._at, self._since = at, now
        elif now - self._since >= self._timeout:
            self._handle = None
            self._on_idle()
            return
        self._handle = self._loop.call_later(self._every, self._look)

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
