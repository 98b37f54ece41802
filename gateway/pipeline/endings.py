"""How a relay ends other than by finishing: the client gone (and the upstream drained for its
usage), a crash, an explicit cancel from another connection; and closing up, however it ended."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

from gateway import metrics
from gateway.conversations.recorder import Attempt, Segment, TurnRecorder
from gateway.dialects.base import StreamRenderer
from gateway.errors import Conflict, GatewayError
from gateway.http.delivery import DeliveryTracker
from gateway.pipeline.deadline import Deadline
from gateway.providers.base import UpstreamResponse
from gateway.providers.wire import StreamParser
from gateway.routing.router import Deployment
from gateway.stream.sse import SSEDecoder, SSEFrameTooLarge

if TYPE_CHECKING:
    from gateway.pipeline.relay import ChatCall

log = logging.getLogger("gateway.pipeline")  # one logger for the whole data path


class _ClientCancelled(Exception):
    """Raised inside the relay when the client asked, on another connection, to stop."""


class _Endings:
    """`_Relay`'s endings. No state of its own: it uses the relay's (relay.py)."""

    call: ChatCall
    turn: TurnRecorder
    attempt: Attempt | None
    deployment: Deployment | None
    upstream: UpstreamResponse | None
    response: web.StreamResponse | None
    tracker: DeliveryTracker | None
    timer: Deadline | None
    loop: asyncio.AbstractEventLoop
    decoder: SSEDecoder | None
    parser: StreamParser | None
    segments: list[Segment]
    cancel_requested: bool
    renderer: StreamRenderer
    # The streaming relay's (stream.py): an explicit cancel may end a stream not yet started.
    _start_response: Callable[[Deployment], Awaitable[web.StreamResponse]]

    # -- endings ---------------------------------------------------------------------------

    def client_gone(self, reason: str) -> None:
        upstream, self.upstream = self.upstream, None
        if self.turn.ended:
            if upstream is not None:
                upstream.close()
            return
        delivered = 0
        level = "acked"
        if self.response is not None and self.tracker is not None:
            writer = self.response._payload_writer
            delivered = self.tracker.delivered_frames(writer.output_size if writer else 0)
            level = self.tracker.level
        prior = self._split_delivery(delivered)
        delivered -= sum(n for _, n in prior)
        attempt = self.attempt
        if attempt is None and prior:  # between a failed segment and its continuation
            attempt, delivered = prior.pop()
        drain = self.call.alias.config.on_client_disconnect == "drain"
        if drain and upstream is not None and self.parser is not None and reason != "shutdown":
            # Keep reading only to learn the provider's usage; history gets the delivered part.
            self.call.spawn(self._drain(upstream, delivered, level, reason, prior))
            return
        if upstream is not None:
            upstream.close()
        self.turn.interrupted(attempt, delivered, level, reason, prior)

    def _split_delivery(self, delivered: int) -> list[Segment]:
        """How many of each earlier segment's frames are among the first `delivered`."""
        prior: list[Segment] = []
        for earlier, sent in self.segments:
            prior.append((earlier, min(sent, delivered)))
            delivered -= prior[-1][1]
        return prior

    async def _drain(
        self,
        upstream: UpstreamResponse,
        delivered: int,
        level: str,
        reason: str,
        prior: list[Segment],
    ) -> None:
        decoder, parser, attempt = self.decoder, self.parser, self.attempt
        assert decoder is not None and parser is not None and attempt is not None
        try:
            async with asyncio.timeout(self.call.alias.config.drain_timeout_s):
                while not parser.done:
                    chunk = await upstream.read()
                    for frame in decoder.feed(chunk) if chunk else decoder.flush():
                        if frame.complete:
                            attempt.add(parser.feed(frame)[0])
                    if not chunk:
                        break
        except (TimeoutError, GatewayError, SSEFrameTooLarge) as exc:
            log.info("draining %s stopped early: %s", attempt.route["deployment"], exc)
        finally:
            upstream.close(keep_alive=parser.done)  # drained to its end: reusable
            self.turn.interrupted(attempt, delivered, level, reason, prior)

    def crashed(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        if not self.turn.ended:
            log.exception("the chat pipeline failed unexpectedly")
            self.turn.failed(GatewayError("internal error in the gateway"))

    # -- explicit cancel ---------------------------------------------------------------------

    def cancel(self) -> bool:
        """Stop this request from another connection; False when it has already ended."""
        if self.turn.ended or self.cancel_requested:
            return False
        self.cancel_requested = True
        if self.timer is not None:
            # Expire the attempt's deadline now: whatever the relay awaits on the upstream
            # (headers or the next chunk) is interrupted, and it checks the flag after writes.
            self.timer.expire()
        return True

    async def cancelled(self) -> web.StreamResponse:
        """End the client's stream cleanly after its last delta and record what it received."""
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        attempt = self.attempt
        if not self.call.stream:
            self.turn.interrupted(attempt, 0, "acked", "client_cancel")
            error = Conflict("The request was cancelled.", code="request_cancelled")
            error.headers.update(self.call.headers)
            raise error
        deployment = self.deployment
        assert deployment is not None
        response = self.response or await self._start_response(deployment)
        final = self.renderer.cancelled()
        writer = response._payload_writer  # write_eof() lets go of it
        assert writer is not None
        await response.write(final)
        await response.write_eof()
        delivered, level = await self._acknowledged(writer.output_size)
        prior = self._split_delivery(delivered)
        current = delivered - sum(n for _, n in prior)
        if attempt is None and prior:
            attempt, current = prior.pop()
        self.turn.interrupted(attempt, current, level, "client_cancel", prior)
        return response

    async def _acknowledged(self, output_size: int, wait_s: float = 2.0) -> tuple[int, str]:
        """Frames the client has, after giving the last ones a moment to be acknowledged."""
        tracker = self.tracker
        if tracker is None:
            return 0, "acked"
        deadline = self.loop.time() + wait_s
        while (done := tracker.delivered_frames(output_size)) < tracker.frames_written:
            if self.loop.time() > deadline:
                break
            await asyncio.sleep(0.005)
        return done, tracker.level

    def close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        if self.tracker is not None:  # made when the stream's response started
            self.tracker.close()
            metrics.STREAMS.dec()
