"""One chat completion's relay: its input (`ChatCall`), its entry point (`run_chat`), its state,
and its attempts: the retry plan, each attempt's deadlines, the response headers.

The phases after the upstream answers are mixins `_Relay` inherits: `_StreamRelay`
(stream.py), `_BodyRelay` (body.py), `_Endings` (endings.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from gateway import metrics
from gateway.conversations.recorder import Attempt, Segment, TurnRecorder
from gateway.dialects.base import Dialect, StreamRenderer
from gateway.errors import (
    GatewayError,
    UpstreamError,
    UpstreamIncompleteStream,
    UpstreamTimeout,
)
from gateway.http.delivery import DeliveryTracker
from gateway.pipeline.body import _BodyRelay
from gateway.pipeline.continuation import continuation_body
from gateway.pipeline.deadline import Deadline, watchdog
from gateway.pipeline.endings import _ClientCancelled, _Endings
from gateway.pipeline.stream import _StreamRelay
from gateway.pipeline.turn_ends import TurnEnds
from gateway.providers.base import UpstreamResponse
from gateway.providers.wire import StreamParser
from gateway.routing.retry import RetryPlan
from gateway.routing.router import Alias, Deployment
from gateway.stream.sse import SSEDecoder
from gateway.upstream.seam import credentials, redact_error

log = logging.getLogger("gateway.pipeline")  # one logger for the whole data path


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
    turn_ends: TurnEnds  # where a non-streaming answer's turn is recorded complete


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


class _Relay(_StreamRelay, _BodyRelay, _Endings):
    def __init__(self, call: ChatCall) -> None:
        self.call = call
        self.turn = call.turn
        self.attempt: Attempt | None = None
        self.deployment: Deployment | None = None
        self.upstream: UpstreamResponse | None = None
        self.response: web.StreamResponse | None = None
        self.tracker: DeliveryTracker | None = None
        self.timer: Deadline | None = None
        self.holding = True  # nothing reaches the client before the first content chunk
        self.loop = asyncio.get_running_loop()
        task = asyncio.current_task(self.loop)
        assert task is not None, "the relay runs in its request's task"
        self.task = task  # what an attempt's deadline cancels
        self.watchdog = watchdog(self.loop)
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
                self.timer = timer = self.watchdog.watch(self.task)
                timer.set(self._deadline())
                self.upstream = await deployment.provider.chat(
                    self._body(deployment), stream=self.call.stream
                )
                if self.call.stream:
                    response = await self._relay_stream(deployment)
                else:
                    response = await self._relay_body(deployment)
            except (TimeoutError, asyncio.CancelledError) as exc:
                if isinstance(exc, asyncio.CancelledError) and not timer.took_back():
                    raise  # not the deadline's: the client went away, the server stops
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
            if self.timer is not None:
                self.timer.close()
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
