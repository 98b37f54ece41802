"""Traces over OTLP/HTTP: a span per turn and a child per upstream attempt, named and described
as the OpenTelemetry GenAI semantic conventions say (docs/operations.md, "Traces").

    chat {alias}             SERVER: from the request to the turn's end; a child of the
                             client's span when the request carries a `traceparent`
      chat {upstream model}  CLIENT: one per attempt, from its start to its end; the upstream
                             request carries a `traceparent` naming it

Off unless `tracing.otlp_endpoint` is set: `start` then returns None, nothing of opentelemetry
is imported, and each hook on the data path is one test for None.

The spans say what the turn records. An attempt's span starts with the attempt; the turn's
`request/error` and `turn/end` events, as its recorder writes them, end the spans with the
figures those events and the attempts hold (how it ended, usage, what reached the client). So
a trace agrees with the event log, and a turn that ends in the background (a drained upstream)
ends its span then. Spans are batched and exported by the SDK's own thread; the gateway's
cleanup flushes them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from aiohttp import web

from gateway.config import ConfigError, TracingConfig
from gateway.errors import GatewayError
from gateway.storage.backlog import Mark
from gateway.storage.records import REQUEST_ERROR, TURN_END, Conversation, NewEvent, TurnStart
from gateway.stream.attempt_log import Other
from gateway.stream.events import Finish
from gateway.upstream.pool import TRACE_HEADERS

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span

    from gateway.conversations.recorder import Attempt, TurnRecorder, TurnWrites
    from gateway.routing.router import Deployment

log = logging.getLogger(__name__)

# The recorder's turn statuses as a trace names them.
_STATUS = {"completed": "completed", "aborted": "interrupted", "error": "error"}
# `gen_ai.provider.name` where the conventions name a provider otherwise than the config does.
_PROVIDER = {"azure": "azure.ai.openai"}


def start(config: TracingConfig) -> Tracing | None:
    """The app's tracing, exporting to `config.otlp_endpoint`; None when that is unset."""
    if config.otlp_endpoint is None:
        return None
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        raise ConfigError(
            "tracing.otlp_endpoint is set, but OpenTelemetry is not installed: install the"
            " gateway with its otel extra (pip install 'gateway[otel]')"
        ) from None
    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name}),
        # A client's sampling decision (its traceparent's flag) is followed; the ratio decides
        # for traces that begin here.
        sampler=ParentBased(TraceIdRatioBased(config.sample_ratio)),
    )
    exporter = OTLPSpanExporter(endpoint=config.otlp_endpoint, headers=dict(config.headers))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return Tracing(provider)


class Tracing:
    """One app's tracer provider (not the process-wide one: each app exports on its own)."""

    def __init__(self, provider: TracerProvider) -> None:
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.provider = provider
        self.tracer = provider.get_tracer("gateway")
        self.propagator = TraceContextTextMapPropagator()
        self.server, self.client = SpanKind.SERVER, SpanKind.CLIENT
        self.status, self.error = Status, StatusCode.ERROR
        self.in_context = set_span_in_context

    def turn(
        self, headers: Mapping[str, str], model: str, request_id: str, dialect: str
    ) -> TurnTrace:
        """The span of a completion request, begun now: a child of the client's span when
        `headers` carry a W3C `traceparent` (and `tracestate`)."""
        span = self.tracer.start_span(
            f"chat {model}",
            context=self.propagator.extract(headers),
            kind=self.server,
            attributes={
                "gen_ai.operation.name": "chat",
                "gen_ai.request.model": model,
                "gateway.request.id": request_id,
                "gateway.dialect": dialect,
            },
        )
        return TurnTrace(self, span)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export every ended span now (blocking: call it from a thread)."""
        return self.provider.force_flush(int(timeout_s * 1000))

    async def close(self) -> None:
        """Export what is left, then stop the exporter (off the event loop: it blocks)."""
        await asyncio.to_thread(self.provider.shutdown)


class TurnTrace:
    """One turn's spans: its own, and one per attempt while the attempt is open."""

    __slots__ = ("_attempts", "_error", "_tracing", "recorder", "span")

    def __init__(self, tracing: Tracing, span: Span) -> None:
        self._tracing = tracing
        self.span = span
        self.recorder: TurnRecorder | None = None
        self._attempts: dict[int, Span] = {}  # open attempt spans, by attempt number
        self._error: BaseException | None = None  # what ended the request before its turn began

    def began(self, recorder: TurnRecorder) -> None:
        """The turn has its recorder: its writes are watched for the turn's end."""
        self.recorder = recorder
        recorder.store = _Watched(recorder.store, self)
        self.span.update_name(f"chat {recorder.alias}")
        self.span.set_attributes(
            {
                "gen_ai.request.model": recorder.alias or "",
                "gen_ai.conversation.id": recorder.conversation_id,
                "gateway.turn.id": recorder.turn_id,
            }
        )

    def attempt(self, attempt: Attempt, deployment: Deployment) -> None:
        """An attempt starts: its span begins, and its upstream request will name it."""
        tracing, recorder = self._tracing, self.recorder
        assert recorder is not None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            "gen_ai.provider.name": _PROVIDER.get(deployment.provider_name)
            or deployment.provider_name,
            "gen_ai.request.model": deployment.upstream_model,
            "gen_ai.conversation.id": recorder.conversation_id,
            "gateway.deployment": deployment.name,
            "gateway.attempt": attempt.number,
        }
        if deployment.config.api_base:
            url = urlsplit(deployment.config.api_base)
            if url.hostname:
                attributes["server.address"] = url.hostname
                attributes["server.port"] = url.port or (443 if url.scheme == "https" else 80)
        span = tracing.tracer.start_span(
            f"chat {deployment.upstream_model}",
            context=tracing.in_context(self.span),
            kind=tracing.client,
            attributes=attributes,
        )
        self._attempts[attempt.number] = span
        context = span.get_span_context()
        header = b"traceparent: 00-%032x-%016x-%02x\r\n" % (
            context.trace_id,
            context.span_id,
            context.trace_flags,
        )
        if context.trace_state:
            header += b"tracestate: %s\r\n" % context.trace_state.to_header().encode()
        TRACE_HEADERS.set(header)

    def raised(self, error: BaseException) -> None:
        """The request ended with `error` (ignored once its turn began: the turn's end says)."""
        self._error = error

    def left(self) -> None:
        """The handler is done. A request refused before its turn began ends its span now;
        a turn's span ends with the turn, now or later (an upstream drained for its usage)."""
        TRACE_HEADERS.set(None)
        recorder, error = self.recorder, self._error
        if recorder is not None and (
            recorder.ended or error is None or isinstance(error, asyncio.CancelledError)
        ):
            return
        if isinstance(error, asyncio.CancelledError):
            self.span.set_attribute("gateway.turn.status", "interrupted")
        elif error is not None:
            code = error.code if isinstance(error, GatewayError) else type(error).__name__
            self.span.set_attributes({"gateway.turn.status": "error", "error.type": code})
            self.span.set_status(self._tracing.status(self._tracing.error, code))
        self.span.end()

    # -- the turn's events, as its recorder writes them --------------------------------------

    def saw(self, event: NewEvent) -> None:
        if event.type == REQUEST_ERROR:
            self._attempt_failed(event.payload)
        elif event.type == TURN_END:
            self._ended(event.payload)

    def _attempt_failed(self, error: Mapping[str, Any]) -> None:
        recorder = self.recorder
        assert recorder is not None
        number = error.get("attempt")
        if isinstance(number, int) and (span := self._attempts.pop(number, None)) is not None:
            self._end_attempt(span, recorder.attempts[number - 1], error)

    def _ended(self, end: Mapping[str, Any]) -> None:
        recorder, span = self.recorder, self.span
        assert recorder is not None
        status = _STATUS.get(end["status"], end["status"])
        reason = end.get("reason")
        for number, attempt_span in sorted(self._attempts.items()):
            attempt = recorder.attempts[number - 1]
            failed = {"code": reason or "error"} if attempt.outcome in (None, "error") else None
            self._end_attempt(attempt_span, attempt, failed)
        self._attempts.clear()
        attributes: dict[str, Any] = {
            "gateway.turn.status": status,
            "gateway.attempts": len(recorder.attempts),
        }
        if reason is not None:
            attributes["gateway.turn.reason"] = reason
        metered = end.get("metered")
        if isinstance(metered, dict):
            attributes["gen_ai.usage.input_tokens"] = metered["prompt_tokens"]
            attributes["gen_ai.usage.output_tokens"] = metered["completion_tokens"]
            attributes["gateway.delivered_tokens"] = metered["completion_delivered"]
            attributes["gateway.usage.source"] = metered["usage_source"]
            if metered.get("cost_usd") is not None:
                attributes["gateway.cost_usd"] = metered["cost_usd"]
        answered = [a for a in recorder.attempts if a.outcome in ("completed", "interrupted")]
        if answered and (reasons := _finish_reasons(answered[-1])):
            attributes["gen_ai.response.finish_reasons"] = reasons
        if status == "error":
            attributes["error.type"] = reason or "error"
            span.set_status(self._tracing.status(self._tracing.error, reason))
        span.set_attributes(attributes)
        span.end()

    def _end_attempt(self, span: Span, attempt: Attempt, error: Mapping[str, Any] | None) -> None:
        outcome = attempt.outcome or "error"
        attributes: dict[str, Any] = {
            "gateway.attempt.outcome": outcome,
            "gateway.delivered_events": attempt.delivered,
        }
        if (first := attempt.first_token_ms) is not None:
            attributes["gateway.first_token_ms"] = round(first, 1)
        usage = attempt.usage
        if usage is not None:
            if isinstance(prompt := usage.get("prompt_tokens"), int):
                attributes["gen_ai.usage.input_tokens"] = prompt
            # An incomplete count (a stream cut before its end) says nothing of the output.
            completion = usage.get("completion_tokens")
            if isinstance(completion, int) and "partial" not in usage:
                attributes["gen_ai.usage.output_tokens"] = completion
        if reasons := _finish_reasons(attempt):
            attributes["gen_ai.response.finish_reasons"] = reasons
        if error is not None or outcome == "error":
            code = str((error or {}).get("code") or "error")
            attributes["error.type"] = code
            # The message as recorded: secrets already scrubbed (gateway.scrub).
            message = (error or {}).get("message")
            tracing = self._tracing
            span.set_status(tracing.status(tracing.error, str(message) if message else code))
        span.set_attributes(attributes)
        span.end()


def _finish_reasons(attempt: Attempt) -> list[str]:
    log = attempt.log
    return [
        s.event.reason
        for s in log.segments(log.count)
        if isinstance(s, Other) and isinstance(s.event, Finish)
    ]


class _Watched:
    """A turn's writes, passed on to the store; its `request/error` and `turn/end` events are
    also shown to its trace, after they are written. A fault of the trace's is logged, never
    raised into the recording."""

    __slots__ = ("_store", "_turn")

    def __init__(self, store: TurnWrites, turn: TurnTrace) -> None:
        self._store = store
        self._turn = turn

    def create_conversation(self, conversation: Conversation) -> None:
        self._store.create_conversation(conversation)

    def start_turn(self, turn: TurnStart) -> None:
        self._store.start_turn(turn)

    def append(self, event: NewEvent) -> None:
        self._store.append(event)
        if event.type in (REQUEST_ERROR, TURN_END):
            try:
                self._turn.saw(event)
            except Exception:
                log.exception("tracing the turn %s failed", event.turn_id)

    async def durable_enough(self) -> None:
        await self._store.durable_enough()

    def mark(self) -> Mark:
        return self._store.mark()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


TRACING = web.AppKey("tracing", Tracing)
