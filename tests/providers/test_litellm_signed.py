"""Claude's signed thinking as litellm hands it on (`thinking_blocks`), read for the record
(gateway/providers/litellm_signed.py). A stream's is tested end to end in the adapter contract
suite (`bedrock`, `vertex-anthropic`) and test_bedrock.py; a whole answer's here."""

from __future__ import annotations

from gateway.providers.litellm_signed import parse_signed_completion
from gateway.stream.events import (
    REASONING,
    TEXT,
    TOOL_CALL,
    BlockDelta,
    BlockEnd,
    BlockStart,
    Finish,
    Usage,
)


def test_a_whole_answer_keeps_each_thinking_block_with_its_signature() -> None:
    message = {
        "role": "assistant",
        "content": "Paris.",
        "reasoning_content": "First.Second.",
        "thinking_blocks": [
            {"type": "thinking", "thinking": "First.", "signature": "sig-1"},
            {"type": "thinking", "thinking": "Second.", "signature": "sig-2"},
        ],
        "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    events = parse_signed_completion(
        {
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": usage,
        }
    )
    assert events == [
        BlockStart(0, REASONING),
        BlockDelta(0, "First."),
        BlockEnd(0, {"signature": "sig-1"}),
        BlockStart(1, REASONING),
        BlockDelta(1, "Second."),
        BlockEnd(1, {"signature": "sig-2"}),
        BlockStart(2, TEXT),
        BlockDelta(2, "Paris."),
        BlockEnd(2),
        BlockStart(3, TOOL_CALL, "t1", "f"),
        BlockDelta(3, "{}"),
        BlockEnd(3),
        Finish("tool_calls"),
        Usage(usage),
    ]


def test_an_answer_without_signed_thinking_reads_as_openai_chat() -> None:
    message = {"role": "assistant", "content": "Paris.", "reasoning_content": "Hm."}
    events = parse_signed_completion({"choices": [{"message": message, "finish_reason": "stop"}]})
    assert events[:3] == [BlockStart(0, REASONING), BlockDelta(0, "Hm."), BlockEnd(0)]
