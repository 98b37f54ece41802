"""One turn's relay: its attempts, the answer relayed to the client, and every way it ends.

    attempts: the alias's plan, tried in order (gateway.routing.retry); until the first
      content chunk nothing reaches the client, so a failure up to then moves on to the next
      deployment, and each attempt runs under its deadlines (gateway.pipeline.deadline)
    -> stream: upstream SSE frames decoded into the gateway's stream events and logged for
      the turn; each read's frames written to the client in one send, unchanged when the
      upstream speaks the client's dialect, else rendered in it; the delivery tracker notes
      which frames each write carried (gateway.downstream.client)
    -> or body: a non-streaming answer read whole and answered at once
    -> endings: finished, the client gone (its delivered prefix recorded, and the upstream
      drained for its usage where configured), an explicit cancel from another connection,
      a provider fault with no deployment left, or a crash in the gateway itself

When the client goes away, aiohttp cancels the handler wherever it is waiting (on the
upstream's headers, on its next chunk, or on a write), or a write raises ConnectionError first.
`client_gone` then runs without awaiting anything: it closes the upstream connection at once
and records the delivered prefix.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway import logs, metrics
from gateway.context import Gateway
from gateway.conversations.recorder import Attempt, Segment, TurnRecorder
from gateway.dialects.base import Dialect
from gateway.dialects.openai_chat import usage_chunk_with_cost
from gateway.downstream.client import ClientCancelled, ClientStream
from gateway.errors import (
    Conflict,
    GatewayError,
    ServiceUnavailable,
    UpstreamError,
    UpstreamIncompleteStream,
    UpstreamProtocolError,
    UpstreamStreamError,
)
from gateway.metering.choices import OtherChoices, other_choices
from gateway.metering.usage import cost_header
from gateway.pipeline.body import read_json
from gateway.pipeline.continuation import continuation_body
from gateway.pipeline.deadline import AttemptClock, watchdog
from gateway.providers.base import UpstreamResponse
from gateway.providers.openai_chat import ChatStreamParser
from gateway.providers.params import (
    dropped_header,
    openai_form,
    takes_openai_only,
    without,
)
from gateway.providers.wire import OPENAI_CHAT, StreamParser, parse_body, stream_parser
from gateway.routing.retry import RetryPlan
from gateway.routing.router import Alias, Deployment
from gateway.scrub import credentials, scrub_error
from gateway.storage.records import Checkpoint, ContentBlock
from gateway.stream.assembler import BlockAssembler
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
from gateway.tracing import TurnTrace

log = logging.getLogger("gateway.pipeline")  # one logger for the whole data path

SHUTDOWN_MESSAGE = "The gateway is shutting down; the answer was cut here."
# A stream cut at shutdown: how long its client may take to acknowledge what it was sent,
# before the turn records what it has (the process must exit soon after).
SHUTDOWN_ACK_S = 0.2


def _is_content(event: StreamEvent) -> bool:
    """The first of these ends the hold: from then on the client has bytes, retries are over."""
    if isinstance(event, BlockDelta):
        return event.text != ""
    if isinstance(event, BlockStart):
        return event.kind not in (TEXT, REASONING)  # a tool call's start carries its name
    return isinstance(event, Finish)


class Relay:
    def __init__(
        self,
        gateway: Gateway,
        request: web.Request,
        turn: TurnRecorder,
        *,
        body: dict[str, Any],
        stream: bool,
        alias: Alias,
        plan: list[Deployment],
        headers: dict[str, str],
        dialect: Dialect,
        dropped: dict[str, list[str]] | None = None,
        trace: TurnTrace | None = None,
    ) -> None:
        self.gateway = gateway
        self.turn = turn
        self.body = body
        self.stream = stream
        self.alias = alias
        self.plan = plan
        self.headers = headers  # response headers decided before the upstream call
        self.dialect = dialect
        self.client = ClientStream(
            request, turn.store, gateway.config.server.client_idle_timeout_s, self.client_idle
        )
        # One per response: a continuation keeps rendering the same client stream.
        self.renderer = dialect.renderer(body)
        if gateway.meter is not None:
            self.renderer.price = self._usage_cost
        # The attempt under way: its record, deployment, open upstream answer and deadlines.
        self.attempt: Attempt | None = None
        self.deployment: Deployment | None = None
        self.upstream: UpstreamResponse | None = None
        self.clock: AttemptClock | None = None
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task(self.loop)
        assert task is not None, "the relay runs in its request's task"
        self.task = task  # what an attempt's deadline cancels
        self.stopping = False  # cut at the shutdown deadline (shut_down)
        self.watchdog = watchdog(self.loop)
        # continue_on_failure: earlier attempts whose frames reached the client, and how many.
        self.segments: list[Segment] = []
        # The stream's state: its decoder and parser, whether bytes pass unchanged, what waits
        # for the next write (byte strings, and the size of each frame in them), the last frame.
        self.decoder: SSEDecoder | None = None
        self.parser: StreamParser | None = None
        self.passthrough = False
        self.held: list[bytes] = []
        self.sizes: list[int] = []
        self.terminator = b""
        # drop_params: the parameters each deployment of the plan leaves out, by its name
        # (gateway.providers.params.check_plan, run before the turn began).
        self.dropped: dict[str, list[str]] = dropped or {}
        self.trace = trace  # the turn's spans, when tracing is configured (gateway.tracing)
        self.checkpointed = 0  # the delivered frames of the last checkpoint (none before one)
        self.idle = False  # ended because its client stopped reading (client_idle)

    async def serve(self, cancel_key: str, team_id: str | None) -> web.StreamResponse:
        """Run the turn to its end, however it ends; cancellable meanwhile by `cancel_key`."""
        cancels = self.gateway.cancels
        key = (team_id, cancel_key)
        registered = cancels.setdefault(key, self) is self
        running = self.gateway.running
        running.add(self)
        try:
            return await self.run()
        except ClientCancelled:
            return await self.cancelled()
        except asyncio.CancelledError:
            self.client_gone(self._gone_reason())
            raise
        except ConnectionError:
            # A write found the client gone before aiohttp cancelled the handler. Upstream
            # faults never arrive here: the provider adapters map them to UpstreamError.
            self.client_gone(self._gone_reason())
            return self.client.response or web.Response(status=499)
        except GatewayError as error:
            error.headers.update(self.headers)
            if not self.turn.ended:  # refused before or by an adapter, never sent upstream
                if not self.turn.attempts:
                    self.turn.meter = None  # no upstream call: its reservation is released
                self.turn.failed(error)
            raise
        except BaseException:
            # A bug must not leave the turn open: record it as an error, then let it surface.
            self.crashed()
            raise
        finally:
            running.discard(self)
            if registered:
                cancels.pop(key, None)
            self.close()

    # -- attempts ----------------------------------------------------------------------------

    async def run(self) -> web.StreamResponse:
        plan = RetryPlan(self.alias, self.plan)
        continuing = self.alias.config.continue_on_failure and self.stream
        while (deployment := await plan.next()) is not None:
            if self.stopping:  # cut between two attempts
                raise ClientCancelled()
            try:
                return await self._attempt(deployment)
            except UpstreamError as error:
                plan.failed(deployment, error)
                if self.client.response is None:
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
        if self.client.response is not None:
            await self.client.end_with(self.renderer.error(last))
            return self.client.response
        last.headers["X-Gateway-Attempts"] = str(len(self.turn.attempts))
        last.retries_spent = True  # the plan has run out: a client retry would only repeat it
        raise last

    def _frames_sent_by_attempt(self) -> int:
        return self.client.frames_written - sum(n for _, n in self.segments)

    def _delivered_by_attempt(self) -> tuple[int, str]:
        """The frames of the attempt under way that the client's side has, as of now."""
        delivered, level = self.client.delivered()
        delivered = max(0, delivered - sum(n for _, n in self.segments))
        attempt = self.attempt
        if attempt is not None and (others := other_choices(attempt.id_from)) is not None:
            others.delivered_frames = delivered  # n > 1
        return delivered, level

    def _request_body(self, deployment: Deployment) -> dict[str, Any]:
        """The request for this attempt: the client's, or a continuation of what was sent."""
        body = without(self.body, self.dropped.get(deployment.name, ()))  # drop_params
        if self.dialect.wire != OPENAI_CHAT and takes_openai_only(deployment):
            body = openai_form(body)  # the translation's carriers are not OpenAI's
        if not self.segments:
            return body
        return continuation_body(body, self.segments, deployment.provider.wire)

    async def _attempt(self, deployment: Deployment) -> web.StreamResponse:
        self.deployment = deployment
        attempt = self.attempt = self.turn.new_attempt(deployment.route)
        recorded = self.gateway.config.conversations
        attempts = self.turn.attempts
        if len(attempts) > 1:  # the caps are the turn's: what the attempts before kept counts
            attempt.log.cap(*attempts[-2].log.left())
        else:
            attempt.log.cap(recorded.record_max_text_chars, recorded.record_max_tool_argument_chars)
        if self.trace is not None:
            self.trace.attempt(attempt, deployment)  # its span, named in the upstream request
        health = deployment.health
        timeouts = deployment.config.timeouts
        health.acquire()
        try:
            timer = self.watchdog.watch(self.task)
            clock = self.clock = AttemptClock(
                timer,
                self.loop,
                first_token_s=timeouts.first_token_s,
                idle_s=timeouts.idle_s,
                total_s=timeouts.total_s,
            )
            try:
                clock.arm()
                self.upstream = await deployment.provider.chat(
                    self._request_body(deployment), stream=self.stream
                )
                if self.stream:
                    response = await self._relay_stream(deployment)
                else:
                    response = await self._relay_body(deployment)
            except (TimeoutError, asyncio.CancelledError) as exc:
                if isinstance(exc, asyncio.CancelledError) and not timer.took_back():
                    raise  # not the deadline's: the client went away, the server stops
                if self.client.cancel_requested:
                    raise ClientCancelled() from None
                raise clock.timeout_error() from None
        except UpstreamError as error:
            if self.upstream is not None:
                self.upstream.close()
                self.upstream = None
            # Before the error is recorded, logged, retried or rendered to the client: no
            # configured secret or key-shaped token in it, nor this deployment's own key.
            config = deployment.config
            scrub_error(error, [config.api_key or "", *credentials(config.extra_headers)])
            delivered, level = self._delivered_by_attempt()
            self.turn.attempt_failed(
                attempt,
                error,
                aborted_finish=isinstance(error, UpstreamIncompleteStream),
                delivered=delivered,
                level=level,
            )
            metrics.ATTEMPTS.labels(deployment.name, error.label).inc()
            if error.retryable:
                health.failed(error.label)
            log.warning(
                "deployment %s failed: %s (%s)", deployment.name, error.message, error.label
            )
            raise
        finally:
            if self.clock is not None:
                self.clock.timer.close()
                self.clock = None
            health.release()
        health.succeeded(attempt.first_token_ms)
        metrics.ATTEMPTS.labels(deployment.name, "ok").inc()
        if attempt.first_token_ms is not None:
            metrics.FIRST_TOKEN.labels(deployment.name).observe(attempt.first_token_ms / 1000)
        return response

    def _headers(self, deployment: Deployment) -> dict[str, str]:
        dropped = self.dropped.get(deployment.name)
        return {
            **self.headers,
            **({"X-Gateway-Dropped-Params": dropped_header(dropped)} if dropped else {}),
            "X-Gateway-Deployment": deployment.name,
            "X-Gateway-Attempts": str(len(self.turn.attempts)),
        }

    # -- a non-streaming answer ----------------------------------------------------------------

    async def _relay_body(self, deployment: Deployment) -> web.StreamResponse:
        upstream, attempt, clock = self.upstream, self.attempt, self.clock
        assert upstream is not None and attempt is not None and clock is not None
        raw, obj = await read_json(upstream, clock)
        self.upstream = None
        events = parse_body(deployment.provider.wire, obj)
        if isinstance(upstream_id := obj.get("id"), str):
            attempt.upstream_id = upstream_id
        attempt.add(events)
        attempt.whole = events
        attempt.first_token_ms = (time.monotonic() - attempt.started) * 1000
        if events and isinstance(events[0], StreamFailure):
            raise UpstreamStreamError(events[0].message, upstream=events[0].upstream)
        if Finish not in map(type, events):
            raise UpstreamIncompleteStream("the upstream answer has no finish_reason")
        if deployment.provider.wire != self.dialect.wire:
            self.turn.response_id = self.renderer.response_id
            raw = self.dialect.body(
                str(self.body.get("model")), BlockAssembler.of(events), self.turn.response_id
            )
        elif isinstance(answer_id := obj.get("id"), str):
            self.turn.response_id = answer_id
        # Recorded with the other answers of this loop iteration (conversations/turn_ends.py), and
        # durable before the client has its answer.
        await self.gateway.turn_ends.completed(self.turn, attempt)
        await self.turn.store.durable_enough()
        headers = self._headers(deployment)
        metered = self.turn.metered
        if metered is not None and (cost := metered["cost_usd"]) is not None:
            headers["X-Gateway-Cost-USD"] = cost_header(cost)
        return web.Response(body=raw, content_type="application/json", headers=headers)

    # -- a stream: the hot path ----------------------------------------------------------------

    async def _relay_stream(self, deployment: Deployment) -> web.StreamResponse:
        upstream, attempt, clock = self.upstream, self.attempt, self.clock
        assert upstream is not None and attempt is not None and clock is not None
        decoder = self.decoder = SSEDecoder()
        parser = self.parser = stream_parser(deployment.provider.wire)
        attempt.id_from = parser  # the upstream's id for its answer, once a frame says it
        # The upstream speaks the client's dialect: relay its bytes unchanged.
        self.passthrough = deployment.provider.wire == self.dialect.wire
        if self.body.get("n") not in (None, 1) and isinstance(parser, ChatStreamParser):
            # n > 1: the choices after the first are metered too (once per attempt, never
            # per chunk; the parser hands them over only on its general way).
            parser.others = OtherChoices(attempt.log, self.passthrough)
        # Chat chunks relayed unchanged: most are one more piece of the open text, read
        # without events (the chat renderer tracks nothing, so no events are needed for it).
        text_run = (
            parser.text_run if self.passthrough and isinstance(parser, ChatStreamParser) else None
        )
        held: list[bytes] = []  # to write: byte strings, and the size of each frame in them
        sizes: list[int] = []
        self.held, self.sizes = held, sizes
        self.terminator = b""  # the stream's last frame: sent once the turn is durably recorded
        started = attempt.started
        while not parser.done:
            if self.client.cancel_requested:
                raise ClientCancelled()
            clock.arm()
            try:
                chunk = await upstream.read()
            except UpstreamProtocolError:
                if not parser.finished:
                    raise
                # Cut after the finish_reason (before its usage or [DONE]): the client has the
                # whole answer, so the turn is complete, as a clean end there would be.
                chunk = b""
            try:
                split = decoder.split(chunk) if text_run is not None and chunk else None
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
                assert text_run is not None
                failure = self._take_split(*split, text_run, received_ms)
            if held and not clock.holding:
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
        response = self.client.response
        if response is None:  # an upstream that finished without a single frame
            response = await self.client.start(self._headers(deployment))
        await response.write_eof()  # done already when the terminator ended the body
        return response

    def _take_split(
        self,
        span: bytes,
        pieces: list[bytes],
        text_run: Callable[[list[bytes], int], tuple[int, list[str], int]],
        received_ms: float,
    ) -> StreamFailure | None:
        """A read's frames as `SSEDecoder.split` gives them, relayed unchanged. A run of frames
        that are each one more piece of the open text is logged in one call and held as one
        slice of the span; any other frame goes through `_take`. Returns the failure a frame
        reports, if any (the frames after it are not taken)."""
        decoder, attempt, clock = self.decoder, self.attempt, self.clock
        assert attempt is not None and decoder is not None and clock is not None
        received, held, sizes = attempt.log, self.held, self.sizes
        at = written = 0  # where the next piece starts in the span; what went to `held`
        i, n = 0, len(pieces)
        while i < n:
            start = i
            index, texts, i = text_run(pieces, i)
            if texts:
                received.text_frames(index, texts, received_ms)
                run = [len(p) + 2 for p in pieces[start:i]]
                sizes += run
                at += sum(run)
                if clock.holding and any(texts):
                    self._first_content(attempt, clock)
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
        parser, attempt, clock = self.parser, self.attempt, self.clock
        assert parser is not None and attempt is not None and clock is not None
        events, kind = parser.feed(frame)
        received = attempt.log
        received.add(events, received_ms)
        if kind == "error":
            return events[0]  # type: ignore[return-value]
        if clock.holding and any(_is_content(e) for e in events):
            self._first_content(attempt, clock)
        if self.passthrough:
            data = frame.raw
            if kind == "usage_only" and self.upstream is not None:
                if self.upstream.usage_injected:
                    return None
                price, usage = self.renderer.price, attempt.usage
                if price is not None and usage is not None and (cost := price(usage)) is not None:
                    data = usage_chunk_with_cost(data, cost)
            self.renderer.track(events)
            if kind == "done":
                self.terminator = frame.raw
                return None
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

    def _usage_cost(self, usage: dict[str, Any]) -> float | None:
        """What the attempt under way's usage report costs."""
        meter, attempt = self.gateway.meter, self.attempt
        if meter is None or attempt is None:
            return None
        return meter.cost_of(attempt.route, usage)

    @staticmethod
    def _first_content(attempt: Attempt, clock: AttemptClock) -> None:
        """The hold ends: from here on what arrives goes to the client, retries are over."""
        clock.holding = False
        attempt.first_token_ms = (time.monotonic() - attempt.started) * 1000

    async def _write(
        self, deployment: Deployment, chunks: list[bytes], sizes: list[int], last: bool = False
    ) -> None:
        if self.clock is not None:
            self.clock.pause()  # a slow client is not an idle upstream
        if self.client.response is None:
            # The answer's id as the client sees it, from its first frame on.
            parser = self.parser
            self.turn.response_id = (
                parser.response_id
                if self.passthrough and parser is not None
                else self.renderer.response_id
            )
            await self.client.start(self._headers(deployment))
        await self.client.write(chunks, sizes, last)

    # -- endings -------------------------------------------------------------------------------

    def client_gone(self, reason: str) -> None:
        upstream, self.upstream = self.upstream, None
        if self.turn.ended:
            if upstream is not None:
                upstream.close()
            return
        delivered, level = self.client.delivered()
        attempt, delivered, prior = self._split_delivery(delivered)
        drain = self.alias.config.on_client_disconnect == "drain"
        if drain and upstream is not None and self.parser is not None and reason != "shutdown":
            # Keep reading only to learn the provider's usage; history gets the delivered part.
            self.gateway.spawn(self._drain(upstream, delivered, level, reason, prior))
            return
        if upstream is not None:
            upstream.close()
        self.turn.interrupted(attempt, delivered, level, reason, prior)

    def client_idle(self) -> None:
        """The client stopped reading without closing (gateway.downstream.idle_readers): its
        connection is reset, so that nothing still queued for it arrives after the turn
        recorded what it has, and the relay ends as for a client gone."""
        self.idle = True
        if self.client.tracker is not None:
            self.client.tracker.reset()
        self.task.cancel()

    def _gone_reason(self) -> str:
        return "client_idle" if self.idle else self.gateway.cancel_reason()

    def checkpoint(self) -> Checkpoint | None:
        """What a crash now should leave recorded (TurnRecorder.checkpoint), when the frames
        the client has changed since the last one; None otherwise, or for a turn with no
        stream to cut."""
        if not self.stream or self.turn.ended or (self.attempt is None and not self.segments):
            return None
        delivered, level = self.client.delivered()
        if delivered == self.checkpointed:
            return None
        self.checkpointed = delivered
        attempt, delivered, prior = self._split_delivery(delivered)
        return self.turn.checkpoint(attempt, delivered, level, prior)

    def shown(self) -> list[ContentBlock] | None:
        """The answer's blocks as its client has them now (a live view; nothing recorded, and
        the checkpoints' own bookkeeping left alone); None for a whole answer, or once the
        turn has ended."""
        if not self.stream or self.turn.ended or (self.attempt is None and not self.segments):
            return None
        delivered, level = self.client.delivered()
        attempt, delivered, prior = self._split_delivery(delivered)
        message = self.turn.checkpoint(attempt, delivered, level, prior)["message"]
        return message["content"] if message is not None else []

    def _split_delivery(self, delivered: int) -> tuple[Attempt | None, int, list[Segment]]:
        """The first `delivered` frames by attempt: how many of each earlier segment's, and of
        the attempt they end in (the current one, or, between a failed segment and its
        continuation, the last segment's)."""
        prior: list[Segment] = []
        for earlier, sent in self.segments:
            prior.append((earlier, min(sent, delivered)))
            delivered -= prior[-1][1]
        attempt = self.attempt
        if attempt is None and prior:
            attempt, delivered = prior.pop()
        if attempt is not None and (others := other_choices(attempt.id_from)) is not None:
            others.delivered_frames = delivered  # n > 1
        return attempt, delivered, prior

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
            async with asyncio.timeout(self.alias.config.drain_timeout_s):
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

    def shut_down(self, now: bool = False) -> None:
        """The gateway is stopping and its grace is over: the client's stream ends after its
        last delta with its dialect's shutdown event, and the turn records what the client
        has, reason `shutdown` (`stopped`). `now`: the relay did not end (a write waits on a
        client that stopped reading): its connection is reset, so that nothing still queued
        for it arrives later, and its task cancelled; `client_gone` records what it has."""
        if now:
            if self.client.tracker is not None:
                self.client.tracker.reset()
            self.task.cancel()
            return
        if self.turn.ended or self.client.cancel_requested:
            return
        # The path of an explicit cancel (`cancel`), ending in `stopped` instead. Only a wait
        # on the upstream is interrupted: a write to the client is left to end (the flag is
        # looked at after it), since a write cancelled mid-drain fails the response's next.
        self.stopping = True
        self.client.cancel_requested = True
        if self.clock is not None and self.clock.timer.when is not None:
            self.clock.timer.expire()

    def cancel(self) -> bool:
        """Stop this request from another connection; False when it has already ended."""
        if self.turn.ended or self.client.cancel_requested:
            return False
        self.client.cancel_requested = True
        if self.clock is not None:
            # Expire the attempt's deadline now: whatever the relay awaits on the upstream
            # (headers or the next chunk) is interrupted, and it checks the flag after writes.
            self.clock.timer.expire()
        return True

    async def cancelled(self) -> web.StreamResponse:
        """End the client's stream cleanly after its last delta and record what it received."""
        if self.stopping:
            return await self.stopped()
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        attempt = self.attempt
        if not self.stream:
            self.turn.interrupted(attempt, 0, "acked", "client_cancel")
            error = Conflict("The request was cancelled.", code="request_cancelled")
            error.headers.update(self.headers)
            error.retries_spent = True  # the SDKs retry a 409; a cancel is meant
            raise error
        deployment = self.deployment
        assert deployment is not None
        if self.client.response is None:
            await self.client.start(self._headers(deployment))
        return await self._end_stream(self.renderer.cancelled(), "client_cancel")

    async def stopped(self) -> web.StreamResponse:
        """Cut at the shutdown deadline (`shut_down`): the stream ends with the dialect's
        shutdown event, which carries no content, so the turn keeps exactly the frames the
        client has. Before any answer began: a 503 the client may retry elsewhere."""
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        if self.client.response is None:
            self.turn.interrupted(self.attempt, 0, "acked", "shutdown")
            error = ServiceUnavailable(SHUTDOWN_MESSAGE, code="shutdown")
            error.headers.update(self.headers)
            raise error
        final = self.renderer.shutdown(SHUTDOWN_MESSAGE)
        return await self._end_stream(final, "shutdown", SHUTDOWN_ACK_S, reset=True)

    async def _end_stream(
        self, final: bytes, reason: str, wait_s: float = 2.0, reset: bool = False
    ) -> web.StreamResponse:
        """Write the stream's last frames and end it; record what the client has once it has
        acknowledged them (or `wait_s` passed). Cancelled meanwhile, or the client gone: what
        it has by then. `reset`: a client still short of some frames then has its connection
        reset, so that they never reach it after the turn recorded it without them."""
        response = self.client.response
        assert response is not None
        # Its access record says what the turn's record says: cut, and at shutdown with the
        # error event the client was sent.
        logs.annotate(interrupted=True, error="shutdown" if reason == "shutdown" else None)
        try:
            delivered, level = await self.client.end_cancelled(final, wait_s)
        except ConnectionError:
            self.client_gone(reason)
            return response
        except asyncio.CancelledError:
            self.client_gone(reason)
            raise
        tracker = self.client.tracker
        if reset and tracker is not None and delivered < tracker.frames_written:
            tracker.reset()
        attempt, current, prior = self._split_delivery(delivered)
        self.turn.interrupted(attempt, current, level, reason, prior)
        return response

    def close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        self.client.close()
        # The renderer holds a bound method of this relay (as the client stream did until it
        # closed): left in place, that cycle would leave the request's whole object graph (its
        # aiohttp request, task, turn and logs) to the cyclic collector, on every request.
        self.renderer.price = None
