"""Token estimates: exact for short texts, sampled (and close) for long ones."""

from __future__ import annotations

import time

import tiktoken

from gateway.metering.tokens import count_messages, count_text


def test_short_text_is_counted_exactly() -> None:
    text = "What a user saw is what the model remembers."
    assert count_text(text) == len(tiktoken.get_encoding("cl100k_base").encode(text))
    assert count_text("") == 0


def test_long_text_is_estimated_from_a_sample_within_ten_percent() -> None:
    text = "".join(f"Paragraph {i}: the gateway relays bytes unchanged. " for i in range(20_000))
    exact = len(tiktoken.get_encoding("cl100k_base").encode(text))
    assert abs(count_text(text) - exact) / exact < 0.10


def test_messages_add_framing() -> None:
    one = [{"role": "user", "content": "hello"}]
    assert count_messages(one) == 3 + 4 + count_text("hello")
    assert count_messages(one + one) > count_messages(one)


def test_many_texts_are_counted_from_a_sample_in_a_time_that_does_not_grow_with_them() -> None:
    # Each under the one-text sample: tokenized whole, 2,000 of them held the event loop for
    # over a second (a run of one letter is the tokenizer's slowest text).
    hostile = [{"role": "user", "content": "x" * 6000} for _ in range(2000)]
    began = time.perf_counter()
    estimate = count_messages(hostile)
    took = time.perf_counter() - began
    exact = 3 + 2000 * (4 + count_text("x" * 6000))
    assert abs(estimate - exact) / exact < 0.01
    assert took < 0.25, f"{took:.2f} s"
    # A prompt of varied texts: close still, and a short prompt exact.
    encoding = tiktoken.get_encoding("cl100k_base")
    texts = [
        f"Message {i}: " + "the gateway relays bytes unchanged. " * (i % 40) for i in range(600)
    ]
    exact = 3 + sum(4 + len(encoding.encode(t)) for t in texts)
    estimate = count_messages([{"role": "user", "content": t} for t in texts])
    assert abs(estimate - exact) / exact < 0.10
