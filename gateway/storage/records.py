"""The event log's records and the store's record types (docs/recording.md, "The event log")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

from gateway.ids import sortable_hex

USER_MESSAGE = "user/message"
TOOL_RESULT = "tool/result"
ASSISTANT_MESSAGE = "assistant/message"
ASSISTANT_ATTEMPT = "assistant/attempt"
REQUEST_ERROR = "request/error"
TURN_END = "turn/end"
# What the client says it showed of an interrupted answer: applied wherever history is derived
# (docs/recording.md, "What the user saw"); not a surface event itself.
ASSISTANT_TRUNCATE = "assistant/truncate"
# What the gateway noted about where a turn was recorded (`thread_ambiguous`: threading could not
# tell which conversation the request continued); first in its turn, not a surface event.
CONVERSATION_NOTE = "conversation/note"

# Only these make up model history.
SURFACE_TYPES = frozenset({USER_MESSAGE, TOOL_RESULT, ASSISTANT_MESSAGE})

# -- payloads, one shape per event type (docs/recording.md, "The event log") -------------------
#
# Plain dicts at runtime, written as JSON and read back from it: the types say what each kind
# holds. A usage report stays a dict: its keys are each provider's own.

# A client's message content: its text, or its parts (each a dict with a `type`) as it sent them.
MessageContent = str | list[dict[str, Any]] | None


class ContentBlock(TypedDict, total=False):
    """One block of an answer (`BlockAssembler` blocks as stored): text, reasoning (plus what
    the provider attached to it, such as Anthropic's thinking `signature`), a tool call, or a
    kind the gateway does not know, kept with its `data`."""

    type: str
    text: str
    id: str | None  # a tool call's
    name: str | None  # a tool call's
    arguments: str  # a tool call's JSON arguments, as streamed
    signature: str  # signed reasoning
    data: dict[str, Any] | None  # an unknown kind's


class Route(TypedDict):
    """Where an attempt went (`Deployment.route`)."""

    provider: str
    deployment: str
    model: str


class TokenCounts(TypedDict):
    """A turn's provider-reported usage, summed over its attempts."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class Segment(TypedDict):
    """The part of a continued answer one attempt produced."""

    attempt: int
    route: Route
    content: list[ContentBlock]
    usage: dict[str, Any] | None


class Truncated(TypedDict):
    """What an `assistant/truncate` did to the message it names: added when history is derived
    (`apply_truncates`), never stored."""

    seq: int
    content_chars: int
    delivered_chars: int


class UserMessagePayload(TypedDict):
    content: MessageContent
    name: NotRequired[str]


class ToolResultPayload(TypedDict):
    tool_call_id: str | None
    content: MessageContent
    synthetic: bool


class AssistantMessagePayload(TypedDict):
    """An answer; one the client sent as history has only `content`, `interrupted`,
    `surface_op` and `source`."""

    content: list[ContentBlock]
    interrupted: bool
    surface_op: str  # "append"
    source: NotRequired[str]  # "client"
    stream: NotRequired[list[dict[str, Any]]]  # the compact stream (gateway.stream.compact)
    route: NotRequired[Route]
    attempt: NotRequired[int]
    finish_reason: NotRequired[str | None]
    usage: NotRequired[dict[str, Any] | None]
    upstream_id: NotRequired[str]
    truncated_record: NotRequired[bool]
    delivery: NotRequired[str]  # an interrupted one's: "acked" | "sent"
    segments: NotRequired[list[Segment]]  # a continued one's
    truncated: NotRequired[Truncated]


class DeliveredPrefix(TypedDict):
    """What a failed attempt had delivered when it failed."""

    content: list[ContentBlock]
    frames: int
    delivery: str


class AttemptPayload(TypedDict):
    reason: str  # provider_error | aborted_finish | empty_prefix
    attempt: int
    stream: list[dict[str, Any]]
    route: Route
    usage: dict[str, Any] | None
    truncated_record: NotRequired[bool]
    upstream_id: NotRequired[str]
    delivered: NotRequired[DeliveredPrefix]


class RequestErrorPayload(TypedDict):
    attempt: int
    route: Route
    status: int
    code: str
    type: str
    message: str
    retryable: bool


class TurnEndPayload(TypedDict):
    status: str  # completed | aborted | error
    reason: str | None
    attempts: int
    duration_ms: float
    usage: TokenCounts
    metered: NotRequired[dict[str, Any]]  # the billed totals (gateway.metering.usage)
    response_id: NotRequired[str]
    upstream_id: NotRequired[str]


class TruncatePayload(TypedDict):
    message_seq: int
    content_chars: int


class NotePayload(TypedDict):
    note: str  # thread_ambiguous
    candidates: NotRequired[list[str]]


EventPayload = (
    UserMessagePayload
    | ToolResultPayload
    | AssistantMessagePayload
    | AttemptPayload
    | RequestErrorPayload
    | TurnEndPayload
    | TruncatePayload
    | NotePayload
)


class CheckpointMessage(TypedDict):
    """A checkpoint's delivered prefix: the interrupted `assistant/message` it would become."""

    content: list[ContentBlock]
    interrupted: bool
    surface_op: str
    route: Route
    attempt: int
    finish_reason: str | None
    delivery: str
    segments: NotRequired[list[Segment]]


class CheckpointAttempt(TypedDict):
    number: int
    route: Route
    outcome: str | None
    usage: dict[str, Any] | None
    first_token_ms: float | None
    duration_ms: float
    others: NotRequired[dict[str, int]]  # an `n > 1` stream's other choices' counts


class Checkpoint(TypedDict):
    """What ending a streaming turn as interrupted would record (`TurnRecorder.checkpoint`),
    kept while it streams so that recovery can close it after a crash."""

    message: CheckpointMessage | None
    attempts: list[CheckpointAttempt]
    team_id: str | None
    key_id: str | None
    user: str | None
    alias: str | None
    reasoning: bool
    response_id: str | None
    tags: NotRequired[str]  # the request's metadata tags, for its usage rows


@dataclass(slots=True)
class Event:
    conversation_id: str
    seq: int
    turn_id: str
    type: str
    created_at: float
    # Which of EventPayload's shapes is told by `type` (docs/recording.md, "The event log").
    payload: EventPayload

    def to_api(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "seq": self.seq,
            "turn_id": self.turn_id,
            "type": self.type,
            "created_at": self.created_at,
            "payload": self.payload,
        }


@dataclass(slots=True)
class NewEvent:
    """An event before the store gives it its `seq`."""

    conversation_id: str
    turn_id: str
    type: str
    # One of EventPayload's shapes, or a DeferredPayload (gateway.storage.payload) holding one.
    payload: EventPayload | dict[str, Any]
    created_at: float = field(default_factory=time.time)
    # Makes its write idempotent: a write replayed from the spool twice lands once.
    uid: str = field(default_factory=sortable_hex)
    # A `turn/end`'s: the history after the turn, for automatic threading (stored with the
    # turn, not in the payload).
    fingerprint: str | None = None
    # An interrupted answer's `turn/end`'s: the history before the answer (its request's), which
    # a client that dropped the partial answer sends (history repair, threading.py).
    start_fingerprint: str | None = None


@dataclass(slots=True)
class Conversation:
    id: str
    created_at: float
    # A branch: its history is the parent's events up to parent_seq, then its own.
    parent_id: str | None = None
    parent_seq: int | None = None
    # The team whose keys may read it (None: made in open mode, only the admin sees it).
    team_id: str | None = None
    key_id: str | None = None
    metadata: dict[str, Any] | None = None
    deleted_at: float | None = None  # deleted through the Conversations API: hidden, kept


@dataclass(slots=True)
class TurnStart:
    id: str
    conversation_id: str
    started_at: float
    request: dict[str, Any]
    team_id: str | None = None
    key_id: str | None = None
