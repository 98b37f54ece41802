"""Automatic threading: which conversation a request that names none continues.

Client frameworks (agent loops, chat UIs on the SDKs) send their whole history every time and
no conversation id. Each turn's end stores a fingerprint of the history a client continuing
after it would send: the turn's own messages and its answer. A request's history, everything
before its trailing user and tool messages, is fingerprinted the same way and looked up: a
match continues that conversation, or branches it when the conversation has moved on since
(a regenerate, an edited message). Both sides are in canonical form (`message_key`: text as a
string or as parts, tool-call arguments as the JSON they hold), so a client that re-serialises
what it got back still matches.

An interrupted answer's turn also stores the fingerprint of the history it began with: a chat
UI that drops a partial answer when the user presses Stop sends that history and a new user
message, which finds the turn by it (`repair_history`), in the same read, and has the partial
answer put back (history repair), a first turn's too.

A fingerprint also covers the key and the end user the turn was made for, and the request's
instructions (system and developer messages, which providers treat alike): two keys, or two
users of one key, sending identical histories never meet, and neither do two agents with
different system prompts.

A fingerprint costs in the size of the history it covers: tens of milliseconds for a body of
megabytes, time no other request would get on the event loop. A request whose body was large
(`LARGE_HISTORY`, set where it was parsed on a thread) has its history looked up by prints made
on a thread too (`lookup_prints`), which also hash its whole history once (`KeyedHistory`):
its turn's end then hashes only its answer on the loop.
"""

from __future__ import annotations

import hashlib
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.conversations.history import HISTORY_ROLES, message_key, steps, text_of
from gateway.conversations.reshaped import dspy_answer, dspy_view

_INSTRUCTION_ROLES = frozenset({"system", "developer"})

# Set in the task of a request whose body was parsed on a thread (gateway.http.large_bodies):
# its fingerprints are made there too. A request's task is its own, so it ends with it.
LARGE_HISTORY: ContextVar[bool] = ContextVar("large_history", default=False)


def prior_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history a request continues: its history messages through the last assistant
    message (empty for a first message). What follows it is the request's new input."""
    history = [m for m in messages if m.get("role") in HISTORY_ROLES]
    return history[: _prior_length(history)]


def _prior_length(history: list[dict[str, Any]]) -> int:
    for i in range(len(history) - 1, -1, -1):
        if history[i].get("role") == "assistant":
            return i + 1
    return 0


def repair_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The history an interrupted turn began with, if this request may be that turn's
    follow-up from a client that dropped the partial answer (docs/recording.md, "History
    repair"): its history but a last user message, when what precedes that is not an answer.
    None for any other request: a first message, or one that continues after an answer."""
    history = [m for m in messages if m.get("role") in HISTORY_ROLES]
    began = _began_length(history)
    return history[:began] if began else None


def _began_length(history: list[dict[str, Any]]) -> int:
    if len(history) < 2 or history[-1].get("role") != "user":
        return 0
    if history[-2].get("role") == "assistant":
        return 0
    return len(history) - 1


def fingerprint(
    key_id: str | None,
    user: str | None,
    messages: list[dict[str, Any]],
    history: list[dict[str, Any]],
    keys: list[tuple[Any, ...]] | None = None,
) -> str:
    """The fingerprint of `history` as continued by a request carrying `messages` (whose
    system and developer messages are the instructions) for this key and user; `keys`, the
    history's canonical forms when they are known already (`history_keys`)."""
    instructions = [
        text_of(m.get("content")) for m in messages if m.get("role") in _INSTRUCTION_ROLES
    ]
    if keys is None:
        keys = history_keys(history)
    return hashlib.blake2b(_canonical(key_id, user, instructions, keys), digest_size=16).hexdigest()


def _canonical(
    key_id: str | None, user: str | None, instructions: list[Any], keys: list[tuple[Any, ...]]
) -> bytes:
    return orjson.dumps([key_id, user, instructions, steps(keys)], option=orjson.OPT_SORT_KEYS)


def history_keys(history: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """The canonical form of each message of a history (`message_key`): most of what making a
    fingerprint costs, so a turn makes them once for both of its fingerprints."""
    return [message_key(m) for m in history]


def end_fingerprint(
    key_id: str | None,
    user: str | None,
    prompt: list[dict[str, Any]],
    answer: dict[str, Any],
    prior_keys: list[tuple[Any, ...]] | None = None,
) -> str:
    """The fingerprint of the history after a turn: its request's history and its answer.
    `prior_keys`: the canonical forms of the first messages of that history, made when the
    request was threaded (the rest are made here)."""
    if isinstance(prior_keys, KeyedHistory) and prior_keys.made_for(key_id, user, prompt):
        return prior_keys.end_fingerprint(answer)
    view = dspy_view(prompt)
    if view is not None:  # a fresh prompt holding its history (reshaped.py)
        prompt, answer = view, dspy_answer(answer)
    history = [m for m in prompt if m.get("role") in HISTORY_ROLES]
    done = prior_keys or []
    keys = [*done, *history_keys(history[len(done) :]), message_key(answer)]
    history.append(answer)
    return fingerprint(key_id, user, prompt, history, keys)


def start_fingerprint(
    key_id: str | None,
    user: str | None,
    prompt: list[dict[str, Any]],
    prior_keys: list[tuple[Any, ...]] | None = None,
) -> str:
    """The fingerprint of the history a turn began with (its request's), as `repair_history`
    finds it for a request that dropped the turn's answer."""
    if isinstance(prior_keys, KeyedHistory) and prior_keys.made_for(key_id, user, prompt):
        return prior_keys.start_fingerprint()
    prompt = dspy_view(prompt) or prompt
    history = [m for m in prompt if m.get("role") in HISTORY_ROLES]
    done = prior_keys or []
    keys = [*done, *history_keys(history[len(done) :])]
    return fingerprint(key_id, user, prompt, history, keys)


def recorded_fingerprint(
    key_id: str | None, request: dict[str, Any], history: list[dict[str, Any]]
) -> str:
    """The fingerprint of `history` for a turn as the store recorded it (its `request`: its
    user and instructions), when what a turn ended with changes afterwards (a truncate)."""
    return fingerprint(key_id, request.get("user"), request.get("instructions") or [], history)


def keyed_history(
    key_id: str | None, user: str | None, prompt: list[dict[str, Any]]
) -> KeyedHistory | None:
    """A prompt's `KeyedHistory`; None for a fresh prompt holding its history (reshaped.py),
    whose fingerprints are of another history."""
    return KeyedHistory(key_id, user, prompt) if dspy_view(prompt) is None else None


class KeyedHistory(list[tuple[Any, ...]]):
    """The canonical forms of every history message of a prompt (`history_keys`), hashed in
    one pass into what threading needs of them: the fingerprints of its first messages up to
    each of `cuts` (the history a request continues, the one an interrupted turn began with),
    and the state the turn's own fingerprints continue from, the whole history hashed up to
    where the answer's key goes. Made for one key, user and prompt (`made_for`), never for a
    fresh prompt holding its history (`keyed_history`)."""

    def __init__(
        self,
        key_id: str | None,
        user: str | None,
        prompt: list[dict[str, Any]],
        history: list[dict[str, Any]] | None = None,
        cuts: tuple[int, ...] = (),
    ):
        if history is None:
            history = [m for m in prompt if m.get("role") in HISTORY_ROLES]
        super().__init__(history_keys(history))
        self.key_id, self.user, self.prompt = key_id, user, prompt
        self.history = history  # the prompt's history messages
        instructions = [
            text_of(m.get("content")) for m in prompt if m.get("role") in _INSTRUCTION_ROLES
        ]
        self.prints: list[str] = []  # the fingerprint of the first messages up to each cut
        if steps(self) is not self:  # a merged step (history.steps): no prefix is another's
            data = _canonical(key_id, user, instructions, self)
            for cut in cuts:
                prefix = _canonical(key_id, user, instructions, self[:cut])
                self.prints.append(hashlib.blake2b(prefix, digest_size=16).hexdigest())
            # `data` ends with the steps' list and the whole list closing (`]]`).
            self._before_answer = hashlib.blake2b(data[:-2], digest_size=16)
            return
        # The steps are the keys themselves: the canonical form of any first messages is the
        # whole history's up to the end of their last key, then `]]`. So the history is
        # serialised and hashed once, a part between cuts at a time.
        head = orjson.dumps([key_id, user, instructions], option=orjson.OPT_SORT_KEYS)
        state = hashlib.blake2b(head[:-1] + b",[", digest_size=16)
        at = 0
        for stop in (*cuts, len(self)):
            if stop > at:
                keys = self if at == 0 and stop == len(self) else self[at:stop]
                part = orjson.dumps(keys, option=orjson.OPT_SORT_KEYS)[1:-1]
                state.update(b"," + part if at else part)
                at = stop
            if len(self.prints) < len(cuts):
                done = state.copy()
                done.update(b"]]")
                self.prints.append(done.hexdigest())
        self._before_answer = state

    def made_for(self, key_id: str | None, user: str | None, prompt: list[dict[str, Any]]) -> bool:
        return prompt is self.prompt and key_id == self.key_id and user == self.user

    def start_fingerprint(self) -> str:
        """`start_fingerprint` of this history, hashing nothing more."""
        state = self._before_answer.copy()
        state.update(b"]]")
        return state.hexdigest()

    def end_fingerprint(self, answer: dict[str, Any]) -> str:
        """`end_fingerprint` of this history and `answer`, hashing only the answer. An answer
        is an assistant message at the end, which no step before it merges with (`steps`):
        its key follows theirs, and both lists close after it."""
        rest = orjson.dumps(message_key(answer), option=orjson.OPT_SORT_KEYS) + b"]]"
        state = self._before_answer.copy()
        state.update(b"," + rest if self else rest)
        return state.hexdigest()


@dataclass(slots=True)
class LookupPrints:
    """What threading looks a request's history up by (`lookup_prints`)."""

    # The fresh prompt's history, when the request is one holding it (reshaped.py).
    view: list[dict[str, Any]] | None = None
    # How many history messages the request continues after (`prior_history`).
    prior: int = 0
    # Their canonical forms; for a large body, those of its whole history (`KeyedHistory`).
    keys: list[tuple[Any, ...]] | None = None
    history_print: str | None = None  # of the history it continues
    start_print: str | None = None  # of the history an interrupted turn began with


_NOTHING = LookupPrints()  # a first message's: nothing to look up


def lookup_prints(
    key_id: str | None,
    user: str | None,
    messages: list[dict[str, Any]],
    *,
    repair: bool,
    whole: bool = False,
) -> LookupPrints:
    """The fingerprints a request's history is looked up by: of its prior history, and with
    `repair` of the history an interrupted turn would have begun with (`repair_history`).
    The whole history is keyed and hashed once for both and for the turn's own fingerprints
    (`KeyedHistory`), so that its end hashes only the answer; a first message's is left to its
    end, unless `whole` (a large body's, which this keys on a thread)."""
    view = dspy_view(messages)
    if view is not None:  # a fresh prompt: the history it holds (reshaped.py)
        continued = prior_history(view)
        if not continued:
            return _NOTHING
        keys = history_keys(continued)
        looked_up = fingerprint(key_id, user, view, continued, keys)
        return LookupPrints(view, len(continued), keys, looked_up)
    history = [m for m in messages if m.get("role") in HISTORY_ROLES]
    prior = _prior_length(history)
    began = _began_length(history) if repair else 0
    if not prior and not began and not whole:
        return _NOTHING
    keyed = KeyedHistory(key_id, user, messages, history, tuple(c for c in (prior, began) if c))
    prints = iter(keyed.prints)
    history_print = next(prints) if prior else None
    start_print = next(prints) if began else None
    return LookupPrints(None, prior, keyed, history_print, start_print)
