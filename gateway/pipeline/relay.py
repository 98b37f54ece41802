"""The data path of one chat completion, top to bottom.

    plan: the alias's deployments in strategy order, then its fallback aliases'
      -> attempt: open the upstream; until the first content chunk nothing is sent to the
         client, so a failure up to then is retried (backoff with jitter, Retry-After within
         a cap, bounded attempts and time) on the next deployment of the plan
      -> relay: decode upstream SSE frames into the gateway's stream events; forward each
         frame's bytes unchanged when the upstream speaks the client's dialect, else render
         the events in the client's dialect; note which events each written frame carried
      -> track delivery: the kernel's acknowledged-byte count says which frames the client has
      -> record: the finalisation rules of contract section 3 (gateway.conversations.recorder)

When the client goes away, aiohttp cancels the handler (`handler_cancellation=True`) wherever it
is waiting: on the upstream's headers, on the next upstream chunk, or on a write (or a write
raises ConnectionError first). `client_gone` then runs without awaiting anything: it closes the
upstream connection at once and records the delivered prefix.

Upstream timeouts live here, not in aiohttp: time to first token (until the first content
chunk), the idle gap between chunks (paused while a slow client holds up a write), and total.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway import metrics
from gateway.continuation import continuation_body
from gateway.conversations.recorder import Attempt, Segment, TurnRecorder
from gateway.dialects.base import Dialect, StreamRenderer
from gateway.errors import (
    Conflict,
    GatewayError,
    UpstreamError,
    UpstreamIncompleteStream,
    UpstreamProtocolError,
    UpstreamStreamError,
    UpstreamTimeout,
)
from gateway.providers.base import UpstreamResponse
from gateway.providers.openai_chat import ChatStreamParser
from gateway.providers.wire import (
    StreamParser,
    parse_body,
    stream_parser,
)
from gateway.retry import RetryPlan
from gateway.routing import Alias, Deployment
from gateway.stream.assembler import BlockAssembler
from gateway.stream.delivery import DeliveryTracker
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
from gateway.upstream import credentials, redact_error

log = logging.getLogger(__name__)

_MAX_BODY = 64 * 1024 * 1024


@dataclass
class ChatCall:
    request: web.Request
    body: dict[str, Any]
    stream: bool
    alias: Alias
    plan: list[Deployment]
    turn: TurnRecorder
    headers: dict[str, str]  # response headers decided before the upstream call
    cancel_reason: Callable[[], str]  # "client_disconnect", or "shutdown" while draining
    spawn: Callable[[Coroutine[Any, Any, None]], None]  # run work past the request's end
    # Explicit cancel (POST /v1/chat/completions/{request_id}/cancel) reaches the relay here.
    cancels: dict[str, tuple[str | None, Callable[[], bool]]]
    request_id: str
    team_id: str | None
    dialect: Dialect  # the client's: how answers, errors and cancels are rendered


class _EventStream(web.StreamResponse):
    # The relay starts a response only when it has frames to write at once: its status line
    # and headers then leave with them in one send, not in a send of their own.
    _send_headers_immediately = False


class _ClientCancelled(Exception):
    """Raised inside the relay when the client asked, on another connection, to stop."""


async def run_chat(call: ChatCall) -> web.StreamResponse:
    relay = _Relay(call)
    entry = (call.team_id, relay.cancel)
    registered = call.cancels.setdefault(call.request_id, entry) is entry
    try:
        return await relay.run()
    except _ClientCancelled:
        return await relay.cancelled()
    except asyncio.CancelledError:
        relay.client_gone(call.cancel_reason())
        raise
    except ConnectionError:
        # A write found the client gone before aiohttp cancelled the handler. Upstream faults
        # never arrive here: the provider adapters map them to UpstreamError.
        relay.client_gone(call.cancel_reason())
        return relay.response or web.Response(status=499)
    except GatewayError as error:
        error.headers.update(call.headers)
        raise
    except BaseException:
        # A bug must not leave the turn open: record it as an error, then let it surface.
        relay.crashed()
        raise
    finally:
        if registered:
            call.cancels.pop(call.request_id, None)
        relay.close()


def _is_content(event: StreamEvent) -> bool:
    """The first of these ends the hold: from then on the client has bytes, retries are over."""
    if isinstance(event, BlockDelta):
        return event.text != ""
    if isinstance(event, BlockStart):
        return event.kind not in (TEXT, REASONING)  # a tool call's start carries its name
    return isinstance(event, Finish)


class _Relay:
    def __init__(self, call: ChatCall) -> None:
        self.call = call
        self.turn = call.turn
        self.attempt: Attempt | None = None
        self.deployment: Deployment | None = None
        self.upstream: UpstreamResponse | None = None
        self.response: web.StreamResponse | None = None
        self.tracker: DeliveryTracker | None = None
        self.timer: asyncio.Timeout | None = None
        self.holding = True  # nothing reaches the client before the first content chunk
        self.loop = asyncio.get_running_loop()
        self.decoder: SSEDecoder | None = None
        self.parser: StreamParser | None = None
        # continue_on_failure: earlier attempts whose frames reached the client, and how many.
        self.segments: list[Segment] = []
        self.cancel_requested = False
        # One per response: a continuation keeps rendering the same client stream.
        self.renderer: StreamRenderer = call.dialect.renderer(call.body)
        # The stream's relay state, for `_take`: whether bytes pass unchanged, what waits for
        # the next write (byte strings, and the size of each frame in them), the last frame.
        self.passthrough = False
        self.held: list[bytes] = []
        self.sizes: list[int] = []
        self.terminator = b""

    # -- attempts ----------------------------------------------------------------------------

    async def run(self) -> web.StreamResponse:
        plan = RetryPlan(self.call.alias, self.call.plan)
        continuing = self.call.alias.config.continue_on_failure and self.call.stream
        while (deployment := await plan.next()) is not None:
            try:
                return await self._attempt(deployment)
            except UpstreamError as error:
                plan.failed(deployment, error)
                if self.response is None:
                    continue
                sent = self._frames_sent_by_attempt()
                if continuing and sent and error.retryable:
                    # Continue the answer elsewhere, after what the client already has.
                    assert self.attempt is not None
                    self.segments.append((self.attempt, sent))
                    self.attempt = None
                    continue
                if not (continuing and not sent):
                    break  # bytes reached the client: no retry can take them back
        last = plan.last_error
        assert last is not None, "no deployment was tried"
        self.turn.failed(last)
        if self.response is not None:
            await self._write_error_frame(last)
            return self.response
        last.headers["X-Gateway-Attempts"] = str(len(self.turn.attempts))
        raise last

    def _frames_sent_by_attempt(self) -> int:
        written = self.tracker.frames_written if self.tracker is not None else 0
        return written - sum(n for _, n in self.segments)

    def _body(self, deployment: Deployment) -> dict[str, Any]:
        """The request for this attempt: the client's, or a continuation of what was sent."""
        if not self.segments:
            return self.call.body
        return continuation_body(self.call.body, self.segments, deployment.provider.wire)

    async def _attempt(self, deployment: Deployment) -> web.StreamResponse:
        self.deployment = deployment
        attempt = self.attempt = self.turn.new_attempt(deployment.route)
        health = deployment.health
        timeouts = deployment.config.timeouts
        start = self.loop.time()
        self._first_deadline = start + timeouts.first_token_s
        self._total_deadline = start + timeouts.total_s
        self._idle_s = timeouts.idle_s
        health.acquire()
        try:
            try:
                async with asyncio.timeout_at(self._deadline()) as self.timer:
                    self.upstream = await deployment.provider.chat(
                        self._body(deployment), stream=self.call.stream
                    )
                    if self.call.stream:
                        response = await self._relay_stream(deployment)
                    else:
                        response = await self._relay_body(deployment)
            except TimeoutError:
                if self.cancel_requested:
                    raise _ClientCancelled() from None
                raise self._timeout_error() from None
        except UpstreamError as error:
            if self.upstream is not None:
                self.upstream.close()
                self.upstream = None
            config = deployment.config
            redact_error(error, [config.api_key or "", *credentials(config.extra_headers)])
            self.turn.attempt_failed(
                attempt, error, aborted_finish=isinstance(error, UpstreamIncompleteStream)
            )
            metrics.ATTEMPTS.labels(deployment.name, error.label).inc()
            if error.retryable:
                health.failed(error.label)
            log.warning(
                "deployment %s failed: %s (%s)", deployment.name, error.message, error.label
            )
            raise
        finally:
            self.timer = None
            health.release()
        health.succeeded(attempt.first_token_ms)
        metrics.ATTEMPTS.labels(deployment.name, "ok").inc()
        if attempt.first_token_ms is not None:
            metrics.FIRST_TOKEN.labels(deployment.name).observe(attempt.first_token_ms / 1000)
        return response

    def _deadline(self) -> float:
        phase = self._first_deadline if self.holding else self.loop.time() + self._idle_s
        return min(phase, self._total_deadline)

    def _timeout_error(self) -> UpstreamTimeout:
        if self.loop.time() >= self._total_deadline:
            return UpstreamTimeout("the upstream request exceeded its total timeout", phase="total")
        if self.holding:
            return UpstreamTimeout(
                "the upstream sent no content before the first-token timeout", phase="first_token"
            )
        return UpstreamTimeout("the upstream sent nothing within the idle timeout", phase="idle")

    def _headers(self, deployment: Deployment) -> dict[str, str]:
        return {
            **self.call.headers,
            "X-Gateway-Deployment": deployment.name,
            "X-Gateway-Attempts": str(len(self.turn.attempts)),
        }

    # -- streaming ---------------------------------------------------------------------------

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
        held, sizes = self.held, self.sizes = [], []  # to write: byte strings, frame sizes
        self.terminator = b""  # the stream's last frame: sent once the turn is durably recorded
        received, started = attempt.log, attempt.started  # (not `log`: that is the logger)
        while not parser.done:
            if self.cancel_requested:
                raise _ClientCancelled()
            timer.reschedule(self._deadline())
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
                span, pieces = split
                at = written = 0  # where this piece starts in the span; what went to `held`
                for piece in pieces:
                    size = len(piece) + 2
                    if piece[:6] == b"data: " and (delta := text_delta(piece[6:])) is not None:
                        received.delta(delta[0], delta[1], received_ms)
                        received.mark()
                        sizes.append(size)
                        at += size
                        if self.holding and delta[1]:
                            self._first_content(attempt)
                        continue
                    if at > written:
                        held.append(span[written:at])
                    frame = decoder.frame(span[at : at + size])
                    at = written = at + size
                    if (failure := self._take(frame, received_ms)) is not None:
                        break
                else:
                    if at > written:
                        held.append(span[written:at])
            if held and not self.holding:
                # Written before a failure in the same read too, so that what the client sees
                # does not depend on how the upstream's bytes were split into reads.
                await self._write(deployment, held, sizes)
                held, sizes = self.held, self.sizes = [], []
            if failure is not None:
                raise UpstreamStreamError(failure.message, upstream=failure.upstream)
            if not chunk:
                break
        upstream.close()
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
            self.timer.reschedule(None)  # a slow client is not an idle upstream
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

    # -- non-streaming -------------------------------------------------------------------------

    async def _relay_body(self, deployment: Deployment) -> web.StreamResponse:
        upstream, attempt, timer = self.upstream, self.attempt, self.timer
        assert upstream is not None and attempt is not None and timer is not None
        self.holding = False  # the headers came: from here on, gaps are idle time
        parts: list[bytes] = []
        size = 0
        while True:
            timer.reschedule(self._deadline())
            chunk = await upstream.read()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
            if size > _MAX_BODY:
                raise UpstreamProtocolError(f"the upstream response exceeded {_MAX_BODY} bytes")
        self.upstream = None
        raw = b"".join(parts)
        try:
            obj = orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise UpstreamProtocolError(
                f"the upstream answered with invalid JSON: {raw[:200]!r}"
            ) from None
        if not isinstance(obj, dict):
            raise UpstreamProtocolError("the upstream answer is not a JSON object")
        events = parse_body(deployment.provider.wire, obj)
        attempt.add(events)
        attempt.first_token_ms = (time.monotonic() - attempt.started) * 1000
        if events and isinstance(events[0], StreamFailure):
            raise UpstreamStreamError(events[0].message, upstream=events[0].upstream)
        if not any(isinstance(e, Finish) for e in events):
            raise UpstreamIncompleteStream("the upstream answer has no finish_reason")
        if deployment.provider.wire != self.call.dialect.wire:
            raw = self.call.dialect.body(
                str(self.call.body.get("model")), BlockAssembler.of(events)
            )
        self.turn.completed(attempt)
        await self.turn.store.durable_enough()  # durable before the client has its answer
        return web.Response(
            body=raw, content_type="application/json", headers=self._headers(deployment)
        )

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
            upstream.close()
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
            self.timer.reschedule(self.loop.time())
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
