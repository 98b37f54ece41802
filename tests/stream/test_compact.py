"""The compact timed stream expands back to every delta with its time (docs/recording.md, "The
compact stream")."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.providers.openai_chat import ChatStreamParser
from gateway.stream.assembler import BlockAssembler
from gateway.stream.compact import Timed, compact, expand
from gateway.stream.events import BlockDelta, BlockEnd, BlockStart, Finish, StreamEvent, Usage
from gateway.stream.sse import SSEDecoder
from tests.fakes import fixture_bytes


def timed_fixture(name: str) -> list[Timed]:
    parser = ChatStreamParser()
    out: list[Timed] = []
    for i, frame in enumerate(SSEDecoder().feed(fixture_bytes(name))):
        out += [(i * 7.0 + 0.4, e) for e in parser.feed(frame)[0]]
    return out


@pytest.mark.parametrize(
    "name",
    [
        "openai-chat-text-usage.sse",
        "openai-chat-tool-call-usage.sse",
        "deepseek-chat-reasoning-content.sse",
    ],
)
def test_expansion_rebuilds_the_content_byte_for_byte(name: str) -> None:
    timed = timed_fixture(name)
    records = compact(timed)
    back = expand(records)
    original_deltas = [(round(t), e) for t, e in timed if isinstance(e, BlockDelta)]
    assert [(t, e) for t, e in back if isinstance(e, BlockDelta)] == original_deltas
    before = BlockAssembler.of(e for _, e in timed)
    after = BlockAssembler.of(e for _, e in back)
    assert [b.to_content() for b in after.blocks()] == [b.to_content() for b in before.blocks()]
    assert after.finish_reason == before.finish_reason
    assert after.usage == before.usage


def test_the_record_shape() -> None:
    timed: list[Timed] = [
        (10.2, BlockStart(0, "text")),
        (10.2, BlockDelta(0, "Hel")),
        (15.0, BlockDelta(0, "lo")),
        (30.0, BlockStart(1, "tool_call", id="c1", name="f")),
        (31.0, BlockDelta(1, "{}")),
        (32.0, BlockEnd(1)),
        (33.0, Finish("tool_calls")),
        (33.0, Usage({"total_tokens": 2})),
    ]
    assert compact(timed) == [
        {"type": "text", "index": 0, "t0": 10, "dt": [5], "parts": ["Hel", "lo"]},
        {
            "type": "tool_call",
            "index": 1,
            "t0": 31,
            "dt": [],
            "parts": ["{}"],
            "id": "c1",
            "name": "f",
        },
        {"type": "end", "index": 1, "t": 32},
        {"type": "finish", "t": 33, "reason": "tool_calls"},
        {"type": "usage", "t": 33, "usage": {"total_tokens": 2}},
    ]


_delta = st.tuples(st.integers(0, 3), st.text(max_size=5))


@given(st.lists(st.tuples(st.floats(0, 5, allow_nan=False), _delta), max_size=40))
def test_any_delta_sequence_round_trips(steps: list[tuple[float, tuple[int, str]]]) -> None:
    t = 0.0
    timed: list[Timed] = []
    started: set[int] = set()
    for gap, (index, text) in steps:
        t += gap
        if index not in started:
            started.add(index)
            timed.append((t, BlockStart(index, "reasoning" if index % 2 else "text")))
        timed.append((t, BlockDelta(index, text)))
    back = expand(compact(timed))
    deltas: list[tuple[int, StreamEvent]] = [
        (round(t), e) for t, e in timed if isinstance(e, BlockDelta)
    ]
    assert [(t, e) for t, e in back if isinstance(e, BlockDelta)] == deltas
    assert [b.to_content() for b in BlockAssembler.of(e for _, e in back).blocks()] == [
        b.to_content() for b in BlockAssembler.of(e for _, e in timed).blocks()
    ]
