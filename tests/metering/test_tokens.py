"""Token estimates: exact for short texts, sampled (and close) for long ones."""

from __future__ import annotations

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
