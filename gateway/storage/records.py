"""The event log's records and the store's record types (docs/recording.md, "The event log")."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

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


@dataclass(slots=True)
class NewEvent:
    """An event before the store gives it its `seq`."""

    conversation_id: str
    turn_id: str
    type: str
    payload: dict[str, Any]
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
