"""The data path of one chat completion, top to bottom.

    plan (deployments in order)
      -> attempt: open the upstream; an error before any byte reached the client moves on
         to the next deployment when it is retryable
      -> relay: decode upstream SSE frames, assemble them into events, forward each frame's
         bytes unchanged (no re-serialisation), note which events each written frame carried
      -> track delivery: the kernel's acknowledged-byte count says which frames the client has
      -> record: the finalisation rules of contract section 3 (gateway.conversations.recorder)

When the client goes away, aiohttp cancels the handler (`handler_cancellation=True`) wherever it
is waiting: on the upstream's headers, on the next upstream chunk, or on a write (or a write
raises ConnectionError first). `client_gone` then runs without awaiting anything: it closes the
upstream connection at once and records the delivered prefix.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway.conversations.recorder import Attempt, TurnRecorder
from gateway.errors import (
    GatewayError,
    UpstreamError,
    UpstreamIncompleteStream,
    UpstreamProtocolError,
    UpstreamStreamError,
)
from gateway.providers.base import UpstreamResponse
from gateway.providers.openai_chat import ChatStreamParser, parse_completion
from gateway.routing import Deployment
from gateway.stream.delivery import DeliveryTracker
from gateway.stream.events import StreamFailure
from gateway.stream.sse import SSEDecoder, SSEFrameTooLarge

log = logging.getLogger(__name__)

_MAX_BODY = 64 * 1024 * 1024


@dataclass
class ChatCall:
    request: web.Request
    body: dict[str, Any]
    stream: bool
    deployments: list[Deployment]
    turn: TurnRecorder
    headers: dict[str, str]  # response headers decided before the upstream call
    cancel_reason: Callable[[], str]  # "client_disconnect", or "shutdown" while draining


async def run_chat(call: ChatCall) -> web.StreamResponse:
    relay = _Relay(call)
    try:
        return await relay.run()
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
        relay.close()


class _Relay:
    def __init__(self, call: ChatCall) -> None:
        self.call = call
        self.turn = call.turn
        self.attempt: Attempt | None = None
        self.upstream: UpstreamResponse | None = None
        self.response: web.StreamResponse | None = None
        self.tracker: DeliveryTracker | None = None

    async def run(self) -> web.StreamResponse:
        last_error: UpstreamError | None = None
        for deployment in self.call.deployments:
            attempt = self.attempt = self.turn.new_attempt(deployment.route)
            try:
                self.upstream = await deployment.provider.chat(
                    self.call.body, stream=self.call.stream
                )
                if self.call.stream:
                    return await self._relay_stream(deployment)
                return await self._relay_body(deployment)
            except UpstreamError as error:
                if self.upstream is not None:
                    self.upstream.close()
                    self.upstream = None
                self.turn.attempt_failed(
                    attempt, error, aborted_finish=isinstance(error, UpstreamIncompleteStream)
                )
                last_error = error
                if self.response is not None:
                    # Bytes already reached the client: no retry can take them back.
                    self.turn.failed(error)
                    await self._write_error_frame(error)
                    return self.response
                log.warning(
                    "deployment %s failed: %s (%s)", deployment.name, error.message, error.label
                )
                if not error.retryable:
                    break
        assert last_error is not None
        self.turn.failed(last_error)
        raise last_error

    def _headers(self, deployment: Deployment) -> dict[str, str]:
        return {
            **self.call.headers,
            "X-Gateway-Deployment": deployment.name,
            "X-Gateway-Attempts": str(len(self.turn.attempts)),
        }

    # -- streaming ---------------------------------------------------------------------------

    async def _relay_stream(self, deployment: Deployment) -> web.StreamResponse:
        upstream, attempt = self.upstream, self.attempt
        assert upstream is not None and attempt is not None
        decoder = SSEDecoder()
        parser = ChatStreamParser()
        while not parser.done:
            chunk = await upstream.read()
            try:
                frames = decoder.feed(chunk) if chunk else decoder.flush()
            except SSEFrameTooLarge as exc:
                raise UpstreamProtocolError(str(exc)) from None
            out: list[bytes] = []
            failure: StreamFailure | None = None
            for frame in frames:
                if not frame.complete:
                    continue  # a torn frame at the end is never forwarded
                events, kind = parser.feed(frame)
                attempt.add(events)
                if kind == "error":
                    failure = events[0]  # type: ignore[assignment]
                    break
                if kind == "usage_only" and upstream.usage_injected:
                    continue
                out.append(frame.raw)
                attempt.frame_written()
            if out:
                await self._write(deployment, out)
            if failure is not None:
                raise UpstreamStreamError(failure.message, upstream=failure.upstream)
            if not chunk:
                break
        upstream.close()
        self.upstream = None
        if not parser.finished:
            raise UpstreamIncompleteStream("the upstream stream ended without a finish_reason")
        self.turn.completed(attempt)
        if self.response is None:  # an upstream that finished without a single frame
            await self._start_response(deployment)
        assert self.response is not None
        await self.response.write_eof()
        return self.response

    async def _start_response(self, deployment: Deployment) -> web.StreamResponse:
        response = web.StreamResponse(
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
        await response.prepare(self.call.request)
        self.tracker.chunked = response.chunked
        return response

    async def _write(self, deployment: Deployment, frames: list[bytes]) -> None:
        response = self.response or await self._start_response(deployment)
        tracker = self.tracker
        assert tracker is not None
        writer = response._payload_writer
        assert writer is not None
        tracker.before_write([len(f) for f in frames], writer.output_size)
        await response.write(b"".join(frames) if len(frames) > 1 else frames[0])
        tracker.after_write(writer.output_size)

    async def _write_error_frame(self, error: GatewayError) -> None:
        assert self.response is not None
        await self.response.write(b"data: " + orjson.dumps(error.to_openai()) + b"\n\n")
        await self.response.write_eof()

    # -- non-streaming -------------------------------------------------------------------------

    async def _relay_body(self, deployment: Deployment) -> web.StreamResponse:
        upstream, attempt = self.upstream, self.attempt
        assert upstream is not None and attempt is not None
        parts: list[bytes] = []
        size = 0
        while chunk := await upstream.read():
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
        events = parse_completion(obj)
        attempt.add(events)
        if events and isinstance(events[0], StreamFailure):
            raise UpstreamStreamError(events[0].message, upstream=events[0].upstream)
        if not obj.get("choices"):
            raise UpstreamIncompleteStream("the upstream answer has no choices")
        self.turn.completed(attempt)
        return web.Response(
            body=raw, content_type="application/json", headers=self._headers(deployment)
        )

    # -- endings ---------------------------------------------------------------------------

    def client_gone(self, reason: str) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        if self.turn.ended:
            return
        delivered = 0
        level = "acked"
        if self.response is not None and self.tracker is not None:
            writer = self.response._payload_writer
            delivered = self.tracker.delivered_frames(writer.output_size if writer else 0)
            level = self.tracker.level
        self.turn.interrupted(self.attempt, delivered, level, reason)

    def crashed(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        if not self.turn.ended:
            log.exception("the chat pipeline failed unexpectedly")
            self.turn.failed(GatewayError("internal error in the gateway"))

    def close(self) -> None:
        if self.upstream is not None:
            self.upstream.close()
        if self.tracker is not None:
            self.tracker.close()
