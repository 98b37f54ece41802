"""Threading's fingerprints: a turn's end fingerprint made from the canonical forms threading
made of the request's history is the one made from the messages alone."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.conversations.threading import (
    end_fingerprint,
    fingerprint,
    history_keys,
    prior_history,
)

CALL = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
PROMPTS: list[list[dict[str, Any]]] = [
    [{"role": "user", "content": "Hi"}],
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": "Hello", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "7"}]},
    ],
    [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "developer", "content": "in the middle"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": [{"type": "text", "text": "four"}]},
        {"role": "user", "content": "five"},
    ],
]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_an_end_fingerprint_from_the_lookups_keys_is_the_same(prompt: list[dict[str, Any]]) -> None:
    answer = {"role": "assistant", "content": "six", "tool_calls": [CALL]}
    prior = prior_history(prompt)
    keys = history_keys(prior)
    assert fingerprint("key", "ann", prompt, prior, keys) == fingerprint(
        "key", "ann", prompt, prior
    )
    whole = end_fingerprint("key", "ann", prompt, answer)
    assert end_fingerprint("key", "ann", prompt, answer, keys) == whole
    # ...and it is what the next request, continuing after the answer, looks up.
    following = [*prompt, answer, {"role": "user", "content": "next"}]
    assert fingerprint("key", "ann", following, prior_history(following)) == whole
