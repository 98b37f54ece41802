"""Threading's fingerprints: a turn's end fingerprint made from the canonical forms threading
made of the request's history is the one made from the messages alone, and so are those of a
large body's history, keyed ahead on a thread (`KeyedHistory`)."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.conversations.reshaped import dspy_view
from gateway.conversations.threading import (
    KeyedHistory,
    end_fingerprint,
    fingerprint,
    history_keys,
    keyed_history,
    lookup_prints,
    prior_history,
    repair_history,
    start_fingerprint,
)
from tests.conversations.test_threading_frameworks import dspy_prompt

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


MERGED = {  # Mastra: one answer of two calls, each followed by its result
    "role": "assistant",
    "content": "",
    "tool_calls": [CALL, {**CALL, "id": "call_2", "function": {"name": "g", "arguments": "{}"}}],
}
KEYED_PROMPTS: list[list[dict[str, Any]]] = [
    *PROMPTS,
    [{"role": "system", "content": "Only instructions."}],
    [
        {"role": "user", "content": "go"},
        MERGED,
        {"role": "tool", "tool_call_id": "call_2", "content": "b"},
        {"role": "tool", "tool_call_id": "call_1", "content": "a"},
        {"role": "user", "content": "and?"},
    ],
    [  # two calls, one answered: no step is merged, before or after the answer
        {"role": "user", "content": "go"},
        MERGED,
        {"role": "tool", "tool_call_id": "call_1", "content": "a"},
    ],
    [{"role": "user", "content": "go"}, MERGED],
    # Follow-ups that may have dropped an interrupted answer (history repair): a user message
    # after a user message, with and without an answer before them.
    [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "user", "content": "four"},
    ],
    [{"role": "user", "content": "one"}, {"role": "user", "content": "two"}],
    [
        {"role": "user", "content": "go"},
        MERGED,
        {"role": "tool", "tool_call_id": "call_2", "content": "b"},
        {"role": "tool", "tool_call_id": "call_1", "content": "a"},
        {"role": "user", "content": "and?"},
        {"role": "user", "content": "well?"},
    ],
    # A prompt ending with an answer's start (a prefill).
    [{"role": "user", "content": "one"}, {"role": "assistant", "content": "Once upon"}],
]
ANSWERS = [
    {"role": "assistant", "content": "six"},
    {"role": "assistant", "content": None, "tool_calls": MERGED["tool_calls"]},
]


@pytest.mark.parametrize("prompt", KEYED_PROMPTS)
@pytest.mark.parametrize("answer", ANSWERS)
def test_a_history_keyed_ahead_gives_the_fingerprints_made_at_the_turns_end(
    prompt: list[dict[str, Any]], answer: dict[str, Any]
) -> None:
    keyed = keyed_history("key", "ann", prompt)
    assert keyed is not None and keyed.made_for("key", "ann", prompt)
    assert end_fingerprint("key", "ann", prompt, answer, keyed) == end_fingerprint(
        "key", "ann", prompt, answer
    )
    assert start_fingerprint("key", "ann", prompt, keyed) == start_fingerprint("key", "ann", prompt)
    # Made for another user (or key, or prompt), it is not taken for theirs.
    assert end_fingerprint("key", "bob", prompt, answer, keyed) == end_fingerprint(
        "key", "bob", prompt, answer
    )
    # A request's lookup keys its whole history once: its prints are those of each prefix
    # made alone, and the keys it hands on are the keyed history's.
    for repair in (True, False):
        looked = lookup_prints("key", "ann", prompt, repair=repair)
        prior, began = prior_history(prompt), repair_history(prompt) if repair else None
        assert looked.prior == len(prior)
        assert looked.history_print == (fingerprint("key", "ann", prompt, prior) if prior else None)
        assert looked.start_print == (fingerprint("key", "ann", prompt, began) if began else None)
        if prior or began:
            assert isinstance(looked.keys, KeyedHistory) and looked.keys == keyed
            assert looked.keys.end_fingerprint(answer) == end_fingerprint(
                "key", "ann", prompt, answer
            )
        else:  # a first message: keyed at its end, unless its body is large (on a thread)
            assert looked.keys is None
            ahead = lookup_prints("key", "ann", prompt, repair=repair, whole=True)
            assert isinstance(ahead.keys, KeyedHistory) and ahead.keys == keyed


def test_a_fresh_prompt_holding_its_history_is_not_keyed_ahead() -> None:
    dspy = dspy_prompt("")
    assert dspy_view(dspy) is not None
    assert keyed_history("key", None, dspy) is None
    looked = lookup_prints("key", None, dspy, repair=True, whole=True)
    assert not isinstance(looked.keys, KeyedHistory)
