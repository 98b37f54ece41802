"""Event log records (contract section 3)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from gateway.ids import random_hex

USER_MESSAGE = "user/message"
TOOL_RESULT = "tool/result"
ASSISTANT_MESSAGE = "assistant/message"
ASSISTANT_ATTEMPT = "assistant/attempt"
REQUEST_ERROR = "request/error"
TURN_END = "turn/end"

# Only these make up model history.
SURFACE_TYPES = frozenset({USER_MESSAGE, TOOL_RESULT, ASSISTANT_MESSAGE})


def sortable_hex() -> str:
    """32 hex digits: the time in milliseconds, then 80 random bits.

    Ids that grow with time land at the right edge of the store's indexes, so a turn's inserts
    touch a few index pages instead of one random page per index and row (which the write-ahead
    log then writes whole); 80 random bits keep them as unguessable as any id needs to be.
    """
    clock = _clock
    ms = time.time_ns() // 1_000_000
    if ms != clock.ms:  # a request makes five ids, in the same millisecond: formatted once
        clock.ms, clock.hex = ms, f"{ms:012x}"
    return clock.hex + random_hex(10)


class _Millisecond:
    """The last millisecond an id was made in, and its hex (attributes: see gateway.ids)."""

    def __init__(self) -> None:
        self.ms = -1
        self.hex = ""


_clock = _Millisecond()


def new_id(prefix: str) -> str:
    return f"{prefix}_{sortable_hex()}"


@dataclass(slots=True)
class Event:
    conversation_id: str
    seq: int
    turn_id: str
    type: str
    created_at: float
    payload: dict[str, Any]

    def to_api(self) -> dict[str, Any]:
        return {
            "conversation_id": self.conversation_id,
            "seq": self.seq,
            "turn_id": self.turn_id,
            "type": self.type,
            "created_at": self.created_at,
            "payload": self.payload,
        }


@dataclass(slots=True, init=False)
class NewEvent:
    """An event before the store gives it its `seq`."""

    conversation_id: str
    turn_id: str
    type: str
    payload: dict[str, Any]
    created_at: float
    # Makes its write idempotent: a write replayed from the spool twice lands once.
    uid: str

    # Written out, here and in the other records a request makes: compiled (gateway.native),
    # an `__init__` runs as C, where the one the decorator writes stays interpreted (~0.3-1 us
    # each, a request making a dozen or two).
    def __init__(
        self,
        conversation_id: str,
        turn_id: str,
        type: str,
        payload: dict[str, Any],
        created_at: float | None = None,
        uid: str | None = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.turn_id = turn_id
        self.type = type
        self.payload = payload
        self.created_at = time.time() if created_at is None else created_at
        self.uid = sortable_hex() if uid is None else uid


@dataclass(slots=True, init=False)
class Conversation:
    id: str
    created_at: float
    # A branch: its history is the parent's events up to parent_seq, then its own.
    parent_id: str | None
    parent_seq: int | None
    # The team whose keys may read it (None: made in open mode, only the admin sees it).
    team_id: str | None
    key_id: str | None
    metadata: dict[str, Any] | None
    deleted_at: float | None  # deleted through the Conversations API: hidden, kept

    def __init__(
        self,
        id: str,
        created_at: float,
        parent_id: str | None = None,
        parent_seq: int | None = None,
        team_id: str | None = None,
        key_id: str | None = None,
        metadata: dict[str, Any] | None = None,
        deleted_at: float | None = None,
    ) -> None:
        self.id = id
        self.created_at = created_at
        self.parent_id = parent_id
        self.parent_seq = parent_seq
        self.team_id = team_id
        self.key_id = key_id
        self.metadata = metadata
        self.deleted_at = deleted_at


@dataclass(slots=True, init=False)
class TurnStart:
    id: str
    conversation_id: str
    started_at: float
    request: dict[str, Any]
    team_id: str | None
    key_id: str | None

    def __init__(
        self,
        id: str,
        conversation_id: str,
        started_at: float,
        request: dict[str, Any],
        team_id: str | None = None,
        key_id: str | None = None,
    ) -> None:
        self.id = id
        self.conversation_id = conversation_id
        self.started_at = started_at
        self.request = request
        self.team_id = team_id
        self.key_id = key_id
