"""Recording a turn: new input, attempts, and the order of its events (docs/recording.md,
"Order inside a turn").

Order inside a turn, always:
- success: input events, `assistant/message`, `turn/end(completed)`;
- the client left with a non-empty delivered prefix: `assistant/message(interrupted)` holding
  only the delivered blocks, then `turn/end(aborted)`;
- the client left with nothing delivered: `assistant/attempt(empty_prefix)`, `turn/end(aborted)`;
- a provider fault: `assistant/attempt(provider_error | aborted_finish)` holding what was
  received, `request/error`, then the next attempt or `turn/end(error)`.

Every method here only queues events: finalising never awaits, so it also runs safely inside a
handler that is being cancelled because its client went away.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from gateway import metrics
from gateway.conversations.threading import end_fingerprint, start_fingerprint
from gateway.dialects.chat_message import assistant_message
from gateway.errors import GatewayError, UpstreamError
from gateway.scrub import scrub, scrub_json
from gateway.storage.backlog import Mark
from gateway.storage.payload import DeferredPayload
from gateway.storage.records import (
    ASSISTANT_ATTEMPT,
    ASSISTANT_MESSAGE,
    CONVERSATION_NOTE,
    REQUEST_ERROR,
    TOOL_RESULT,
    TURN_END,
    USER_MESSAGE,
    AssistantMessagePayload,
    AttemptPayload,
    Checkpoint,
    CheckpointMessage,
    ContentBlock,
    Conversation,
    EventPayload,
    NewEvent,
    NotePayload,
    RequestErrorPayload,
    Route,
    TokenCounts,
    TurnEndPayload,
    TurnStart,
    UserMessagePayload,
)
from gateway.stream.assembler import BlockAssembler
from gateway.stream.attempt_log import AttemptLog
from gateway.stream.compact import CompactRecords, Timed, compact
from gateway.stream.events import StreamEvent

if TYPE_CHECKING:
    from gateway.metering.limits import Lease
    from gateway.providers.wire import StreamParser


class TurnWrites(Protocol):
    """What a turn writes through: the Store, or a stand-in that keeps the writes (tests)."""

    def create_conversation(self, conversation: Conversation) -> None: ...

    def start_turn(self, turn: TurnStart) -> None: ...

    def append(self, event: NewEvent) -> None: ...

    async def durable_enough(self) -> None: ...

    def mark(self) -> Mark: ...


class TurnMeter(Protocol):
    """What meters an ending turn (gateway.metering.usage.Meter): one usage record per attempt
    written, the turn's billed totals returned."""

    def turn(self, turn: TurnRecorder) -> dict[str, Any]: ...


class Attempt:
    """One upstream request: its route, and what it received (its AttemptLog)."""

    __slots__ = (
        "_first_token_ms",
        "add",
        "delivered",
        "ended",
        "frame_written",
        "id_from",
        "log",
        "number",
        "outcome",
        "route",
        "upstream_id",
        "whole",
    )

    def __init__(self, number: int, route: Route, started: float | None = None) -> None:
        self.number = number
        self.route = route
        self.log = AttemptLog(started)
        # Called once per upstream frame: the log's own methods, with no call in between.
        self.add: Callable[[list[StreamEvent]], None] = self.log.add
        self.frame_written: Callable[[], None] = self.log.mark
        self._first_token_ms: float | None = None
        # Set when the attempt ends, for metering: how it ended and how many of its events (in
        # received order) the client got.
        self.outcome: str | None = None  # completed | interrupted | error
        self.delivered = 0
        self.ended: float | None = None
        # The upstream's own id for its answer: a whole answer's, or read when needed from
        # the stream's parser (set once per attempt, never per frame).
        self.upstream_id: str | None = None
        self.id_from: StreamParser | None = None
        # A whole (non-streamed) answer's events, as received at once: its record is made
        # from them directly, without reading them back out of the log.
        self.whole: list[StreamEvent] | None = None

    @property
    def answer_id(self) -> str | None:
        return self.id_from.response_id if self.id_from is not None else self.upstream_id

    @property
    def started(self) -> float:
        return self.log.started

    @property
    def first_token_ms(self) -> float | None:
        """When the first content came (set by the relay), else the first events."""
        first = self._first_token_ms
        return self.log.first_ms if first is None else first

    @first_token_ms.setter
    def first_token_ms(self, value: float | None) -> None:
        self._first_token_ms = value

    def settle(self, outcome: str, delivered: int) -> None:
        if self.outcome is None:
            self.outcome, self.delivered, self.ended = outcome, delivered, time.monotonic()

    def delivered_events(self, frames: int) -> list[Timed]:
        """The events the first `frames` frames were made from, one object each (costly for a
        long stream: the recorder reads `log` instead)."""
        return self.log.timed(self.log.cut(frames))

    @property
    def events(self) -> list[Timed]:
        """Every event received, one object each (as `delivered_events`)."""
        return self.log.timed(self.log.count)

    @property
    def usage(self) -> dict[str, Any] | None:
        """The provider's own count for everything this attempt received, when it came."""
        return self.log.usage()


def _input_event(message: dict[str, Any]) -> tuple[str, EventPayload]:
    role = message.get("role")
    if role == "user":
        payload: UserMessagePayload = {"content": message.get("content")}
        if message.get("name"):
            payload["name"] = message["name"]
        return USER_MESSAGE, payload
    if role == "tool":
        return TOOL_RESULT, {
            "tool_call_id": message.get("tool_call_id"),
            "content": message.get("content"),
            "synthetic": False,
        }
    # An assistant message the client supplied (its own history, few-shot examples).
    blocks: list[ContentBlock] = []
    if message.get("reasoning_content"):
        blocks.append({"type": "reasoning", "text": message["reasoning_content"]})
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    if content:
        blocks.append({"type": "text", "text": content})
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        blocks.append(
            {
                "type": "tool_call",
                "id": call.get("id"),
                "name": function.get("name"),
                "arguments": function.get("arguments", ""),
            }
        )
    return ASSISTANT_MESSAGE, {
        "content": blocks,
        "interrupted": False,
        "surface_op": "append",
        "source": "client",
    }


Segment = tuple[Attempt, int]  # an earlier attempt, and how many of its frames the client got
# A payload that says which attempt answered (and its upstream's id for it), and one holding
# an answer's blocks (which a continued answer credits to its attempts, `_with_segments`).
_Answered = TypeVar("_Answered", AssistantMessagePayload, AttemptPayload)
_Answer = TypeVar("_Answer", AssistantMessagePayload, CheckpointMessage)
Part = tuple[Attempt, int]  # an attempt, and how many of its events (in received order) count


def _answer(parts: list[Part]) -> tuple[BlockAssembler, list[dict[str, Any]], bool]:
    """An answer's blocks and its compact stream (docs/recording.md, "The compact stream"),
    from the events of one attempt or, for a continued answer, of each attempt in order: block
    indexes shifted so they never collide, times measured from the first attempt's start. The
    flag: the stream holds long runs read from the logs when stored (its payload must be a
    DeferredPayload). A whole answer, its events received at once and kept whole by the log,
    is made from those events as they came: what the log's replay would give, for less."""
    first, end = parts[0]
    whole = first.whole
    if whole is not None and len(parts) == 1 and end == first.log.count and not first.log.truncated:
        received = first.log.first_ms or 0.0
        records = compact([(received, event) for event in whole])
        return BlockAssembler.of(whole), _scrubbed(records), False
    assembler = BlockAssembler()
    stream = CompactRecords()
    origin = first.started
    offset = 0
    for part, end in parts:
        shift = (part.started - origin) * 1000.0
        top = part.log.replay(end, stream, assembler, shift_ms=shift, index_offset=offset)
        offset = max(offset, top + 1)
    return assembler, _scrubbed(stream.done()), stream.deferred


def _scrubbed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A stream's in-stream error events without secrets (gateway.scrub): an upstream may quote
    the key it was sent in one (its message, or its own error object)."""
    for record in records:
        if record["type"] == "error":
            record["message"] = scrub(str(record["message"]))
            record["upstream"] = scrub_json(record["upstream"])
    return records


def _with_upstream_id(attempt: Attempt, payload: _Answered) -> _Answered:
    if upstream_id := attempt.answer_id:
        payload["upstream_id"] = upstream_id  # the provider's own id for what it answered
    return payload


def _stored(payload: _Answered, deferred: bool) -> _Answered | DeferredPayload:
    """A payload whose stream has long runs is encoded when the store writes it, not now."""
    return DeferredPayload(payload) if deferred else payload


def _with_segments(payload: _Answer, parts: list[Part]) -> _Answer:
    """Credit each part of a continued answer to the deployment that produced it."""
    if len(parts) == 1:
        return payload
    payload["segments"] = [
        {
            "attempt": part.number,
            "route": part.route,
            "content": [b.to_content() for b in BlockAssembler.of(part.log.events(end)).blocks()],
            "usage": part.usage,
        }
        for part, end in parts
    ]
    return payload


def _parts(prior: Sequence[Segment], attempt: Attempt, end: int) -> list[Part]:
    return [(a, a.log.cut(frames)) for a, frames in prior] + [(attempt, end)]


def _sum_usage(usages: list[dict[str, Any]]) -> TokenCounts:
    total: TokenCounts = {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    for usage in usages:
        for key in _TOKEN_COUNTS:
            value = usage.get(key)
            if isinstance(value, int):
                total[key] += value
    return total


_TOKEN_COUNTS: tuple[Literal["prompt_tokens", "completion_tokens", "total_tokens"], ...] = (
    "prompt_tokens",
    "completion_tokens",
    "total_tokens",
)


class TurnRecorder:
    def __init__(
        self,
        store: TurnWrites,
        conversation_id: str,
        turn_id: str,
        *,
        team_id: str | None = None,
        key_id: str | None = None,
        user: str | None = None,
        alias: str | None = None,
        prompt: list[Any] | None = None,
        meter: TurnMeter | None = None,
        lease: Lease | None = None,
    ) -> None:
        self.store = store
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        # Who the turn is metered to, and what it asked for (for estimates when needed).
        self.team_id = team_id
        self.key_id = key_id
        self.user = user
        self.alias = alias
        self.prompt = prompt or []
        self.meter = meter
        self.lease = lease  # rate-limit and budget reservations, settled at the end
        self.dialect = "openai.chat"  # the client-facing API the turn came through
        # Automatic threading is on: the turn's end stores the fingerprint of the history a
        # client continuing after it would send (gateway.conversations.threading).
        self.threaded = False
        # The canonical forms of the prompt's first history messages, when threading made them
        # (gateway.conversations.threading.history_keys).
        self.prior_keys: list[tuple[Any, ...]] | None = None
        # The request asked the model to reason (its reasoning may be hidden from the stream).
        self.reasoning = False
        # The request's metadata tags as JSON, kept on its usage rows (gateway.metering.reports).
        self.tags: str | None = None
        # The id of the answer the client was sent (its first frame's), kept with the turn's end
        # so that it finds the turn.
        self.response_id: str | None = None
        self._answer: list[ContentBlock] | None = None  # the recorded answer's blocks
        self._cut = False  # the answer recorded is interrupted
        self.attempts: list[Attempt] = []
        self.ended = False
        self._on_end: asyncio.Future[None] | None = None  # made by a first `wait_ended`
        self._started = time.monotonic()
        # Where the store's writes stood once the turn's start and input were submitted: they
        # are durable when the store says the mark is (Store.durable).
        self.start_mark: Mark = (0, None)
        self.metered: dict[str, Any] | None = None  # what the turn's end billed, once it ended

    def begin(
        self,
        *,
        new_conversation: Conversation | None,
        new_messages: list[dict[str, Any]],
        request: dict[str, Any],
        note: NotePayload | None = None,
    ) -> None:
        if new_conversation is not None:
            self.store.create_conversation(new_conversation)
        self.store.start_turn(
            TurnStart(
                self.turn_id,
                self.conversation_id,
                time.time(),
                request,
                team_id=self.team_id,
                key_id=self.key_id,
            )
        )
        if note is not None:
            self._append(CONVERSATION_NOTE, note)
        for message in new_messages:
            kind, payload = _input_event(message)
            self._append(kind, payload)
        self.start_mark = self.store.mark()

    def new_attempt(self, route: Route) -> Attempt:
        attempt = Attempt(len(self.attempts) + 1, route)
        self.attempts.append(attempt)
        return attempt

    async def wait_ended(self) -> None:
        """Until the turn has ended (its `turn/end` queued): for a cancel from another
        connection that then acts on what was recorded."""
        if self.ended:
            return
        if self._on_end is None:
            self._on_end = asyncio.get_running_loop().create_future()
        await asyncio.shield(self._on_end)

    # -- finalisation --------------------------------------------------------------------

    def completed(self, attempt: Attempt, prior: Sequence[Segment] = ()) -> None:
        """The answer finished; `prior` are earlier attempts it continues (continue_on_failure)."""
        parts = _parts(prior, attempt, attempt.log.count)
        for earlier, end in parts[:-1]:
            earlier.settle("completed", end)
        attempt.settle("completed", attempt.log.count)
        assembler, stream, deferred = _answer(parts)
        payload = self._message_payload(attempt, assembler, stream, interrupted=False)
        self._answer = payload["content"]
        if len(parts) > 1:
            payload = _with_segments(payload, parts)
        self._append(ASSISTANT_MESSAGE, DeferredPayload(payload) if deferred else payload)
        self._end("completed", None)

    def interrupted(
        self,
        attempt: Attempt | None,
        delivered: int,
        level: str,
        reason: str,
        prior: Sequence[Segment] = (),
    ) -> None:
        """The client went away (or cancelled) after `delivered` frames of `attempt` reached it."""
        if attempt is None:
            self._end("aborted", reason)
            return
        own = attempt.log.cut(delivered)
        parts = _parts(prior, attempt, own)
        for earlier, end in parts[:-1]:
            earlier.settle("interrupted", end)
        if attempt.log.finished(own):
            # The client saw the whole answer, finish included: nothing was cut.
            self.completed(attempt, prior)
            return
        attempt.settle("interrupted", own)
        assembler, stream, deferred = _answer(parts)
        blocks = assembler.interrupted_blocks()
        if blocks:
            payload = self._message_payload(attempt, assembler, stream, interrupted=True)
            payload = _with_segments(payload, parts)
            payload["content"] = self._answer = [b.to_content() for b in blocks]
            self._cut = True
            payload["delivery"] = level
            # What the provider generated and bills (known when the stream was drained), not
            # just what was delivered.
            payload["usage"] = attempt.usage
            self._append(ASSISTANT_MESSAGE, _stored(payload, deferred))
        else:
            self._append(ASSISTANT_ATTEMPT, self._attempt_payload(attempt, "empty_prefix"))
        self._end("aborted", reason)

    def attempt_failed(
        self,
        attempt: Attempt,
        error: GatewayError,
        *,
        aborted_finish: bool = False,
        delivered: int = 0,
        level: str = "acked",
    ) -> None:
        """The attempt failed, after `delivered` of its frames reached the client (a stream
        that broke mid-answer). What it delivered stays in the attempt, outside model history:
        only a user's cancel makes delivered text an interrupted message."""
        reason = "aborted_finish" if aborted_finish else "provider_error"
        own = attempt.log.cut(delivered) if delivered else 0
        attempt.settle("error", own)
        payload = self._attempt_payload(attempt, reason)
        if own:
            blocks = _answer([(attempt, own)])[0].interrupted_blocks()
            payload["delivered"] = {
                "content": [b.to_content() for b in blocks],
                "frames": delivered,
                "delivery": level,
            }
        self._append(ASSISTANT_ATTEMPT, payload)
        failure: RequestErrorPayload = {
            "attempt": attempt.number,
            "route": attempt.route,
            "status": error.status,
            "code": error.code,
            "type": error.type,
            "message": scrub(error.message),
            "retryable": error.retryable,
        }
        self._append(REQUEST_ERROR, failure)

    def inputs_recorded(self) -> None:
        """A turn that only adds input (the Conversations API's items): nothing to answer."""
        self._end("completed", "items_added")

    def failed(self, error: GatewayError) -> None:
        reason = "provider_error" if isinstance(error, UpstreamError) else error.code
        if getattr(error, "phase", None):
            reason = "timeout"
        self._end("error", reason)

    # -- checkpoints ---------------------------------------------------------------------

    def checkpoint(
        self,
        attempt: Attempt | None,
        delivered: int,
        level: str,
        prior: Sequence[Segment] = (),
    ) -> Checkpoint:
        """What ending the turn as interrupted now would record, recording nothing: the blocks
        of its first `delivered` frames, and what each attempt is known to cost. A restart or
        a peer closes the turn with it if this process dies (gateway.pipeline.checkpoints)."""
        message: CheckpointMessage | None = None
        if attempt is not None and delivered:
            parts = _parts(prior, attempt, attempt.log.cut(delivered))
            if len(parts) == 1:
                assembler = BlockAssembler.of(attempt.log.events(parts[0][1]))
            else:
                assembler = _answer(parts)[0]
            if blocks := assembler.interrupted_blocks():
                shown: CheckpointMessage = {
                    "content": [b.to_content() for b in blocks],
                    "interrupted": True,
                    "surface_op": "append",
                    "route": attempt.route,
                    "attempt": attempt.number,
                    "finish_reason": None,
                    "delivery": level,
                }
                message = _with_segments(shown, parts)
        now = time.monotonic()
        return {
            "message": message,
            "attempts": [
                {
                    "number": a.number,
                    "route": a.route,
                    "outcome": a.outcome,
                    "usage": a.usage,
                    "first_token_ms": a.first_token_ms,
                    "duration_ms": round(((a.ended or now) - a.started) * 1000.0, 2),
                }
                for a in self.attempts
            ],
            "team_id": self.team_id,
            "key_id": self.key_id,
            "user": self.user,
            "alias": self.alias,
            "reasoning": self.reasoning,
            "response_id": self.response_id,
        }

    # -- helpers -------------------------------------------------------------------------

    def _message_payload(
        self,
        attempt: Attempt,
        assembler: BlockAssembler,
        stream: list[dict[str, Any]],
        *,
        interrupted: bool,
    ) -> AssistantMessagePayload:
        payload: AssistantMessagePayload = {
            "content": [b.to_content() for b in assembler.blocks()],
            "interrupted": interrupted,
            "surface_op": "append",
            "stream": stream,
            "route": attempt.route,
            "attempt": attempt.number,
            "finish_reason": assembler.finish_reason,
            "usage": assembler.usage,
        }
        if attempt.log.truncated:  # cut at a cap (gateway.stream.attempt_log)
            payload["truncated_record"] = True
        return _with_upstream_id(attempt, payload)

    def _attempt_payload(self, attempt: Attempt, reason: str) -> AttemptPayload | DeferredPayload:
        _, stream, deferred = _answer([(attempt, attempt.log.count)])
        payload: AttemptPayload = {
            "reason": reason,
            "attempt": attempt.number,
            "stream": stream,
            "route": attempt.route,
            "usage": attempt.usage,
        }
        if attempt.log.truncated:
            payload["truncated_record"] = True
        _with_upstream_id(attempt, payload)
        return _stored(payload, deferred)

    def _end(self, status: str, reason: str | None) -> None:
        if self.ended:
            return
        self.ended = True
        usages = [u for a in self.attempts if (u := a.usage)]
        payload: TurnEndPayload = {
            "status": status,
            "reason": reason,
            "attempts": len(self.attempts),
            "duration_ms": round((time.monotonic() - self._started) * 1000.0, 1),
            "usage": _sum_usage(usages),  # what providers reported
        }
        if self.response_id is not None:
            payload["response_id"] = self.response_id
        upstream = self.attempts[-1].answer_id if self.attempts else None
        if upstream and upstream != self.response_id:
            payload["upstream_id"] = upstream  # the provider's own, which finds the turn too
        if self.meter is not None:
            # What is billed: the provider's count, or an estimate where it never came.
            metered = payload["metered"] = self.metered = self.meter.turn(self)
            if self.lease is not None:
                tokens = metered["prompt_tokens"] + metered["completion_tokens"]
                self.lease.settle(metered["cost_usd"], tokens)
        elif self.lease is not None:
            self.lease.release()
        end = NewEvent(self.conversation_id, self.turn_id, TURN_END, payload)
        if self.threaded and self._answer is not None:
            answer = assistant_message(self._answer)
            end.fingerprint = end_fingerprint(
                self.key_id, self.user, self.prompt, answer, self.prior_keys
            )
            if self._cut:
                end.start_fingerprint = start_fingerprint(
                    self.key_id, self.user, self.prompt, self.prior_keys
                )
        self.store.append(end)
        if self._on_end is not None and not self._on_end.done():
            self._on_end.set_result(None)
        metrics.TURNS.labels(status, reason or "").inc()
        last = self.attempts[-1].route.get("deployment") if self.attempts else None
        alias = self.alias or ""
        metrics.COMPLETIONS.labels(alias, str(last or ""), self.dialect, status).inc()
        metrics.DURATION.labels(alias).observe(time.monotonic() - self._started)

    def _append(self, kind: str, payload: EventPayload | DeferredPayload) -> None:
        self.store.append(NewEvent(self.conversation_id, self.turn_id, kind, payload))
