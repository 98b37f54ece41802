"""Token estimates: exact for short texts, sampled (and close) for long ones."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import orjson
import pytest
import tiktoken

from gateway.metering import tokens
from gateway.metering.request_tokens import prompt_extras
from gateway.metering.tokens import count_messages, count_text, tally_messages


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


@pytest.fixture
def loading(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[threading.Event, list[int]]]:
    """The tokenizer as if not loaded yet, its load (each one counted) held until the event."""
    real = tokens._encoding()
    release, loads = threading.Event(), []

    def held() -> object:
        loads.append(1)
        release.wait(10)
        return real

    monkeypatch.setattr(tokens, "_loaded", tokens._UNLOADED)
    monkeypatch.setattr(tokens, "_loader", None)
    monkeypatch.setattr(tokens, "_read_encoding", held)
    yield release, loads
    release.set()
    if tokens._loader is not None:
        tokens._loader.join(10)


def loaded_and_counted(release: threading.Event, text: str) -> int:
    """Let the held load finish; `text`'s exact count, which the rough rate misses."""
    release.set()
    loader = tokens._loader
    assert loader is not None
    loader.join(10)
    exact = len(tiktoken.get_encoding("cl100k_base").encode(text))
    assert exact != len(text) // 4
    return exact


def test_a_reservation_made_while_the_tokenizer_loads_counts_characters_instead_of_waiting(
    loading: tuple[threading.Event, list[int]],
) -> None:
    """A request's reservation must not hold the event loop for the tokenizer's load: it
    counts four characters a token until the load, begun by it on a thread, is done."""
    release, loads = loading
    text = "What a user saw is what the model remembers, no more, no less."
    messages = [{"role": "user", "content": text}]
    assert tally_messages(messages).tokens() == 3 + 4 + len(text) // 4  # the load is held
    assert tally_messages(messages).tokens() == 3 + 4 + len(text) // 4
    exact = loaded_and_counted(release, text)
    assert tally_messages(messages).tokens() == count_messages(messages) == 3 + 4 + exact
    assert loads == [1]  # one load, however many estimates came during it


def test_the_tools_of_a_reservation_made_while_the_tokenizer_loads_count_characters_too(
    loading: tuple[threading.Event, list[int]],
) -> None:
    """A request offering tools reserves their tokens too: at the rough rate while the load
    is held, without keeping that count; once loaded, the exact count is what is billed."""
    release, loads = loading
    tools = [{"type": "function", "function": {"name": "lookup", "description": "Find a row."}}]
    extras = prompt_extras({"tools": tools})
    assert extras is not None
    text = orjson.dumps(tools).decode()  # what the model is shown
    assert extras.tokens(wait=False) == len(text) // 4  # the load is held: it did not wait
    exact = loaded_and_counted(release, text)
    assert extras.tokens(wait=False) == extras.tokens() == exact
    assert loads == [1]
