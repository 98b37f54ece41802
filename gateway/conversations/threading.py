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
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson

from gateway.conversations.history import HISTORY_ROLES, message_key, steps, text_of
from gateway.conversations.reshaped import dspy_answer, dspy_view

_INSTRUCTION_ROLES = frozenset({"system", "developer"})


def prior_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The history a request continues: its history messages through the last assistant
    message (empty for a first message). What follows it is the request's new input."""
    history = [m for m in messages if m.get("role") in HISTORY_ROLES]
    for i in range(len(history) - 1, -1, -1):
        if history[i].get("role") == "assistant":
            return history[: i + 1]
    return []


def repair_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The history an interrupted turn began with, if this request may be that turn's
    follow-up from a client that dropped the partial answer (docs/recording.md, "History
    repair"): its history but a last user message, when what precedes that is not an answer.
    None for any other request: a first message, or one that continues after an answer."""
    history = [m for m in messages if m.get("role") in HISTORY_ROLES]
    if len(history) < 2 or history[-1].get("role") != "user":
        return None
    if history[-2].get("role") == "assistant":
        return None
    return history[:-1]


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
    canonical = [key_id, user, instructions, steps(keys)]
    data = orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS)
    return hashlib.blake2b(data, digest_size=16).hexdigest()


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
