"""The client's side of one streamed answer: its response, its writes, what it received.

The response starts only when the relay has frames to write: its status line and headers then
leave with them in one send. Every write notes which frames it carried, so that when the client
goes away the delivery tracker (gateway.downstream.delivery) can tell how many of them its side
acknowledged: the delivered prefix the turn records.

An explicit cancel (from another connection) is a flag here: the relay checks it after every
write and raises `ClientCancelled`, and the stream then ends cleanly after the last delta.

A client that stops reading without closing is watched for (gateway.downstream.idle_readers): past
`server.client_idle_timeout_s` the relay is told, and ends the stream as for a client gone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol

from aiohttp import web

from gateway import metrics
from gateway.downstream.aiohttp_internals import EventStreamResponse, payload_output_size
from gateway.downstream.delivery import DeliveryTracker
from gateway.downstream.idle_readers import IdleReaderWatch


class Durable(Protocol):
    """Where the turn is written (the Store): made durable before the client has a byte."""

    async def durable_enough(self) -> None: ...


class ClientCancelled(Exception):
    """Raised inside the relay when the client asked, on another connection, to stop."""


class ClientStream:
    def __init__(
        self,
        request: web.Request,
        store: Durable,
        idle_timeout_s: float | None = None,
        on_idle: Callable[[], None] | None = None,
    ) -> None:
        self.request = request
        self.store = store
        self.response: web.StreamResponse | None = None
        self.tracker: DeliveryTracker | None = None
        self.cancel_requested = False
        self._idle_timeout_s = idle_timeout_s
        self._on_idle = on_idle
        self._idle_watch: IdleReaderWatch | None = None

    @property
    def frames_written(self) -> int:
        return self.tracker.frames_written if self.tracker is not None else 0

    async def start(self, headers: dict[str, str]) -> web.StreamResponse:
        response = EventStreamResponse(
            status=200,
            headers={
                **headers,
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            },
        )
        # Before the client has a byte: a crash from here on must not lose this turn.
        await self.store.durable_enough()
        tracker = self.tracker = DeliveryTracker(self.request)
        tracker.begin()
        self.response = response
        metrics.STREAMS.inc()
        await response.prepare(self.request)
        tracker.chunked = response.chunked
        if self._idle_timeout_s is not None and self._on_idle is not None:
            self._idle_watch = IdleReaderWatch(
                self._idle_timeout_s,
                lambda: tracker.progress(payload_output_size(response)),
                self._on_idle,
            )
        return response

    async def write(self, chunks: list[bytes], sizes: list[int], last: bool = False) -> None:
        """Write frames (`sizes` long each, in `chunks` of one or more) in one send, into the
        started response; `last`: they end the body (with the chunked terminator)."""
        response, tracker = self.response, self.tracker
        assert response is not None and tracker is not None, "start() first"
        tracker.before_write(sizes, payload_output_size(response), last)
        data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
        if last:
            await response.write_eof(data)
            tracker.after_write(response.body_length)  # the writer's total, kept by write_eof
        else:
            await response.write(data)
            tracker.after_write(payload_output_size(response))
        if self.cancel_requested:
            raise ClientCancelled()

    async def end_with(self, data: bytes) -> None:
        """A last frame nobody tracks (an error event), then the end of the body."""
        assert self.response is not None
        await self.response.write(data)
        await self.response.write_eof()

    def delivered(self) -> tuple[int, str]:
        """The frames the client's side has, and the level that was measured at."""
        if self.response is None or self.tracker is None:
            return 0, "acked"
        output = payload_output_size(self.response)
        return self.tracker.delivered_frames(output), self.tracker.level

    async def end_cancelled(self, final: bytes, wait_s: float = 2.0) -> tuple[int, str]:
        """Write the cancelled stream's last frame and end the body; then the frames the client
        has, after giving the last ones a moment to be acknowledged."""
        response, tracker = self.response, self.tracker
        assert response is not None
        await response.write(final)
        output = payload_output_size(response)
        await response.write_eof()
        if tracker is None:
            return 0, "acked"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while (done := tracker.delivered_frames(output)) < tracker.frames_written:
            if loop.time() > deadline:
                break
            await asyncio.sleep(0.005)
        return done, tracker.level

    def close(self) -> None:
        # Both hold a bound method of the relay: no cycle outlives the stream.
        self._on_idle = None
        if self._idle_watch is not None:
            self._idle_watch.stop()
            self._idle_watch = None
        if self.tracker is not None:  # made when the response started
            self.tracker.close()
            metrics.STREAMS.dec()
