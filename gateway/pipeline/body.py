"""The non-streaming relay: the upstream's JSON body read whole, checked, and answered at once
(unchanged when the upstream speaks the client's dialect, else rendered in it)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import orjson
from aiohttp import web

from gateway.conversations.recorder import Attempt, TurnRecorder
from gateway.errors import (
    UpstreamIncompleteStream,
    UpstreamProtocolError,
    UpstreamStreamError,
)
from gateway.pipeline.deadline import Deadline
from gateway.providers.base import UpstreamResponse
from gateway.providers.wire import parse_body
from gateway.routing.router import Deployment
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import Finish, StreamFailure

if TYPE_CHECKING:
    from gateway.pipeline.relay import ChatCall

_MAX_BODY = 64 * 1024 * 1024


class _BodyRelay:
    """`_Relay`'s non-streaming phase. No state of its own: it uses the relay's (relay.py)."""

    call: ChatCall
    turn: TurnRecorder
    attempt: Attempt | None
    upstream: UpstreamResponse | None
    timer: Deadline | None
    holding: bool
    # The attempt's (relay.py): its deadline as of now, its response headers.
    _deadline: Callable[[], float]
    _headers: Callable[[Deployment], dict[str, str]]

    async def _relay_body(self, deployment: Deployment) -> web.StreamResponse:
        upstream, attempt, timer = self.upstream, self.attempt, self.timer
        assert upstream is not None and attempt is not None and timer is not None
        self.holding = False  # the headers came: from here on, gaps are idle time
        parts: list[bytes] = []
        size = 0
        while True:
            timer.set(self._deadline())
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
        # Recorded with the other answers of this loop iteration (pipeline/turn_ends.py), and
        # durable before the client has its answer.
        await self.call.turn_ends.completed(self.turn, attempt)
        await self.turn.store.durable_enough()
        return web.Response(
            body=raw, content_type="application/json", headers=self._headers(deployment)
        )
