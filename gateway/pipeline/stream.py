"""The streaming relay, the hot path: upstream SSE frames in, the client's frames out.

Until the first content chunk everything is held (a failure up to then is retried on the next
deployment); from then on each read's frames go to the client in one write, and the delivery
tracker notes which frames each write carried.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from gateway import metrics
from gateway.conversations.recorder import Attempt, Segment, TurnRecorder
from gateway.dialects.base import StreamRenderer
from gateway.errors import (
    GatewayError,
    UpstreamIncompleteStream,
    UpstreamProtocolError,
    UpstreamStreamError,
)
from gateway.http.delivery import DeliveryTracker
from gateway.pipeline.deadline import Deadline
from gateway.pipeline.endings import _ClientCancelled
from gateway.providers.base import UpstreamResponse
from gateway.providers.openai_chat import ChatStreamParser
from gateway.providers.wire import StreamParser, stream_parser
from gateway.routing.router import Deployment
from gateway.stream.events import (
    REASONING,
    TEXT,
    BlockDelta,
    BlockStart,
    Finish,
    StreamEvent,
    StreamFailure,
)
from gateway.stream.sse import SSEDecoder, SSEFrame, SSEFrameTooLarge

if TYPE_CHECKING:
    from gateway.pipeline.relay import ChatCall


class _EventStream(web.StreamResponse):
    # The relay starts a response only when it has frames to write at once: its status line
    # and headers then leave with them in one send, not in a send of their own.
    _send_headers_immediately = False


def _is_content(event: StreamEvent) -> bool:
    """The first of these ends the hold: from then on the client has bytes, retries are over."""
    if isinstance(event, BlockDelta):
        return event.text != ""
    if isinstance(event, BlockStart):
        return event.kind not in (TEXT, REASONING)  # a tool call's start carries its name
    return isinstance(event, Finish)


class _StreamRelay:
    """`_Relay`'s streaming phase. No state of its own: it uses the relay's (relay.py)."""

    call: ChatCall
    turn: TurnRecorder
    attempt: Attempt | None
    upstream: UpstreamResponse | None
    response: web.StreamResponse | None
    tracker: DeliveryTracker | None
    timer: Deadline | None
    holding: bool
    decoder: SSEDecoder | None
    parser: StreamParser | None
    segments: list[Segment]
    cancel_requested: bool
    renderer: StreamRenderer
    passthrough: bool
    held: list[bytes]
    sizes: list[int]
    terminator: bytes
    # The attempt's (relay.py): its deadline as of now, its response headers.
    _deadline: Callable[[], float]
    _headers: Callable[[Deployment], dict[str, str]]

    async def _relay_stream(self, deployment: Deployment) -> web.StreamResponse:
        upstream, attempt, timer = self.upstream, self.attempt, self.timer
        assert upstream is not None and attempt is not None and timer is not None
        decoder = self.decoder = SSEDecoder()
        parser = self.parser = stream_parser(deployment.provider.wire)
        # The upstream speaks the client's dialect: relay its bytes unchanged.
        self.passthrough = deployment.provider.wire == self.call.dialect.wire
        # Chat chunks relayed unchanged: most are one more piece of the open text, read
        # without events (the chat renderer tracks nothing, so no events are needed for it).
        text_delta = (
            parser.text_delta if self.passthrough and isinstance(parser, ChatStreamParser) else None
        )
        self.holding = True
        held: list[bytes] = []  # to write: byte strings, and the size of each frame in them
        sizes: list[int] = []
        self.held, self.sizes = held, sizes
        self.terminator = b""  # the stream's last frame: sent once the turn is durably recorded
        started = attempt.started
        while not parser.done:
            if self.cancel_requested:
                raise _ClientCancelled()
            timer.set(self._deadline())
            try:
                chunk = await upstream.read()
            except UpstreamProtocolError:
                if not parser.finished:
                    raise
                # Cut after the finish_reason (before its usage or [DONE]): the client has the
                # whole answer, so the turn is complete, as a clean end there would be.
                chunk = b""
            try:
                split = decoder.split(chunk) if text_delta is not None and chunk else None
                frames = (
                    () if split is not None else decoder.feed(chunk) if chunk else decoder.flush()
                )
            except SSEFrameTooLarge as exc:
                raise UpstreamProtocolError(str(exc)) from None
            failure: StreamFailure | None = None
            # The frames of a read arrive as one.
            received_ms = (time.monotonic() - started) * 1000.0
            for frame in frames:
                if frame.complete and (failure := self._take(frame, received_ms)) is not None:
                    break
            if split is not None:
                assert text_delta is not None
                failure = self._take_split(*split, text_delta, received_ms)
            if held and not self.holding:
                # Written before a failure in the same read too, so that what the client sees
                # does not depend on how the upstream's bytes were split into reads.
                await self._write(deployment, held, sizes)
                held, sizes = self.held, self.sizes = [], []
            if failure is not None:
                raise UpstreamStreamError(failure.message, upstream=failure.upstream)
            if not chunk:
                break
        # Not held through the turn's recording: the last read (a long stream's can be large).
        chunk, split, frames = b"", None, ()
        upstream.close(keep_alive=True)  # the stream's end: its connection may be reused
        self.upstream = None
        if not parser.finished:
            raise UpstreamIncompleteStream("the upstream stream ended without a finish_reason")
        terminator = self.terminator
        if not self.passthrough and not parser.done:
            terminator = self.renderer.done()
        if held:
            await self._write(deployment, held, sizes)
        self.turn.completed(attempt, self.segments)
        # Committed (or spooled) before the client sees the end: a crash from here on loses
        # no turn the client saw complete.
        await self.turn.store.durable_enough()
        if terminator:
            attempt.frame_written()
            await self._write(deployment, [terminator], [len(terminator)], last=True)
        if self.response is None:  # an upstream that finished without a single frame
            await self._start_response(deployment)
        assert self.response is not None
        await self.response.write_eof()  # done already when the terminator ended the body
        return self.response

    def _take_split(
        self,
        span: bytes,
        pieces: list[bytes],
        text_delta: Callable[[bytes], tuple[int, str] | None],
        received_ms: float,
    ) -> StreamFailure | None:
        """A read's frames as `SSEDecoder.split` gives them, relayed unchanged. A run of frames
        that are each one more piece of the open text is logged in one call and held as one
        slice of the span; any other frame goes through `_take`. Returns the failure a frame
        reports, if any (the frames after it are not taken)."""
        decoder = self.decoder
        assert self.attempt is not None and decoder is not None
        received, held, sizes = self.attempt.log, self.held, self.sizes
        at = written = 0  # where the next piece starts in the span; what went to `held`
        i, n = 0, len(pieces)
        while i < n:
            texts: list[str] = []
            index, start = 0, i
            while i < n:
                piece = pieces[i]
                if piece[:6] != b"data: " or (delta := text_delta(piece[6:])) is None:
                    break
                index = delta[0]
                texts.append(delta[1])
                i += 1
            if texts:
                received.text_frames(index, texts, received_ms)
                run = [len(p) + 2 for p in pieces[start:i]]
                sizes += run
                at += sum(run)
                if self.holding and any(texts):
                    self._first_content(self.attempt)
                if i == n:
                    break
            if at > written:
                held.append(span[written:at])
            size = len(pieces[i]) + 2
            frame = decoder.frame(span[at : at + size])
            at = written = at + size
            i += 1
            if (failure := self._take(frame, received_ms)) is not None:
                return failure
        if at > written:
            held.append(span[written:at])
        return None

    def _take(self, frame: SSEFrame, received_ms: float) -> StreamFailure | None:
        """One complete upstream frame: its events logged, its bytes (or their rendering in
        the client's dialect) held for the next write. Returns the failure it reports, if any."""
        assert self.parser is not None and self.attempt is not None
        events, kind = self.parser.feed(frame)
        received = self.attempt.log
        received.add(events, received_ms)
        if kind == "error":
            return events[0]  # type: ignore[return-value]
        if self.holding and any(_is_content(e) for e in events):
            self._first_content(self.attempt)
        if self.passthrough:
            if kind == "usage_only" and self.upstream is not None and self.upstream.usage_injected:
                return None
            self.renderer.track(events)
            if kind == "done":
                self.terminator = frame.raw
                return None
            data = frame.raw
        else:
            data = self.renderer.render(events)
            if kind == "done":
                self.terminator = self.renderer.done()
            if not data:
                return None
        self.held.append(data)
        self.sizes.append(len(data))
        received.mark()
        return None

    def _first_content(self, attempt: Attempt) -> None:
        """The hold ends: from here on what arrives goes to the client, retries are over."""
        self.holding = False
        attempt.first_token_ms = (time.monotonic() - attempt.started) * 1000

    async def _start_response(self, deployment: Deployment) -> web.StreamResponse:
        response = _EventStream(
            status=200,
            headers={
                **self._headers(deployment),
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
            },
        )
        # Before the client has a byte: a crash from here on must not lose this turn.
        self.turn.store.journal_pending()
        self.tracker = DeliveryTracker(self.call.request)
        self.tracker.begin()
        self.response = response
        metrics.STREAMS.inc()
        await response.prepare(self.call.request)
        self.tracker.chunked = response.chunked
        return response

    async def _write(
        self, deployment: Deployment, chunks: list[bytes], sizes: list[int], last: bool = False
    ) -> None:
        """Write frames (`sizes` long each, in `chunks` of one or more) in one send; `last`:
        they end the body (with the chunked terminator)."""
        if self.timer is not None:
            self.timer.set(None)  # a slow client is not an idle upstream
        response = self.response or await self._start_response(deployment)
        tracker = self.tracker
        assert tracker is not None
        writer = response._payload_writer
        assert writer is not None
        tracker.before_write(sizes, writer.output_size, last)
        data = b"".join(chunks) if len(chunks) > 1 else chunks[0]
        await (response.write_eof(data) if last else response.write(data))
        tracker.after_write(writer.output_size)
        if self.cancel_requested:
            raise _ClientCancelled()

    async def _write_error_frame(self, error: GatewayError) -> None:
        assert self.response is not None
        await self.response.write(self.renderer.error(error))
        await self.response.write_eof()
