"""BlockAssembler.interrupted_blocks(): what an interrupted answer keeps (docs/recording.md,
"The assembled stream")."""

from __future__ import annotations

from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import BlockDelta, BlockEnd, BlockStart, Finish, StreamEvent, Usage


def kept(events: list[StreamEvent]) -> list[tuple[str, str]]:
    return [(b.kind, b.text) for b in BlockAssembler.of(events).interrupted_blocks()]


def test_closed_and_unclosed_text_and_reasoning_in_stream_order() -> None:
    events: list[StreamEvent] = [
        BlockStart(0, "reasoning"),
        BlockDelta(0, "Hmm."),
        BlockEnd(0),
        BlockStart(1, "text"),
        BlockDelta(1, "  Half an ans"),
    ]
    assert kept(events) == [("reasoning", "Hmm."), ("text", "  Half an ans")]  # text untrimmed


def test_white_space_only_and_empty_blocks_are_left_out() -> None:
    events: list[StreamEvent] = [
        BlockStart(0, "text"),
        BlockDelta(0, " \n\t"),
        BlockEnd(0),
        BlockStart(1, "reasoning"),
        BlockDelta(1, ""),
        BlockStart(2, "text"),
    ]
    assert kept(events) == []


def test_tool_calls_are_kept_once_their_arguments_are_whole() -> None:
    """A closed call, or an open one whose arguments are a whole JSON object (OpenAI chat
    closes a call only with what follows it), is one the client has whole; a call cut inside
    its arguments is left out."""
    events: list[StreamEvent] = [
        BlockStart(0, "text"),
        BlockDelta(0, "Checking."),
        BlockEnd(0),
        BlockStart(1, "tool_call", id="c1", name="f"),
        BlockDelta(1, '{"a": 1}'),
        BlockEnd(1),
        BlockStart(2, "tool_call", id="c2", name="g"),
        BlockDelta(2, '{"b"'),
    ]
    assert kept(events) == [("text", "Checking."), ("tool_call", '{"a": 1}')]
    whole_but_open: list[StreamEvent] = [
        BlockStart(0, "tool_call", id="c1", name="f"),
        BlockDelta(0, '{"city": '),
        BlockDelta(0, '"Paris"}'),
    ]
    assert kept(whole_but_open) == [("tool_call", '{"city": "Paris"}')]
    for cut in ('{"city": "Paris"', '{"city": "Par}', "[1]", ""):
        assert kept([BlockStart(0, "tool_call", id="c1", name="f"), BlockDelta(0, cut)]) == []


def test_unknown_kinds_are_kept_only_when_closed() -> None:
    events: list[StreamEvent] = [
        BlockStart(0, "redacted_thinking", data={"data": "opaque"}),
        BlockEnd(0),
        BlockStart(1, "server_tool_use"),
        BlockDelta(1, "{"),
    ]
    assert kept(events) == [("redacted_thinking", "")]


def test_deltas_after_a_block_end_are_ignored() -> None:
    events: list[StreamEvent] = [
        BlockStart(0, "text"),
        BlockDelta(0, "a"),
        BlockEnd(0),
        BlockDelta(0, "b"),
    ]
    assert kept(events) == [("text", "a")]


def test_finish_closes_everything_and_usage_is_kept() -> None:
    assembler = BlockAssembler.of(
        [BlockStart(0, "text"), BlockDelta(0, "done"), Finish("stop"), Usage({"total_tokens": 3})]
    )
    assert assembler.finish_reason == "stop"
    assert assembler.usage == {"total_tokens": 3}
    assert all(b.closed for b in assembler.blocks())


def test_blocks_of_a_complete_answer_keep_white_space_but_not_empty_blocks() -> None:
    assembler = BlockAssembler.of(
        [
            BlockStart(0, "reasoning"),
            BlockDelta(0, ""),
            BlockStart(1, "text"),
            BlockDelta(1, "\n"),
            Finish("stop"),
        ]
    )
    assert [(b.kind, b.text) for b in assembler.blocks()] == [("text", "\n")]
