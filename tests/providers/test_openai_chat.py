"""The OpenAI chat wire format parsed from real captured streams matches the expected assembly."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.errors import UpstreamProtocolError
from gateway.providers import openai_chat
from gateway.providers.openai_chat import ChatStreamParser, parse_completion
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import BlockDelta, BlockEnd, BlockStart, StreamEvent, StreamFailure
from gateway.stream.sse import SSEDecoder, SSEFrame
from tests.fakes import expected, feed_fixture, fixture_bytes

CHAT = [
    "openai-chat-text-usage.sse",
    "openai-chat-tool-call-usage.sse",
    "deepseek-chat-reasoning-content.sse",
    "openrouter-chat-reasoning-details.sse",
    "openrouter-chat-error-chunk.sse",
    "groq-chat-reasoning-error-event.sse",
]


def parse(name: str) -> tuple[list[StreamEvent], ChatStreamParser]:
    parser = ChatStreamParser()
    return feed_fixture(name, parser)[0], parser


def joined(assembler: BlockAssembler, kind: str) -> str:
    return "".join(b.text for b in assembler.blocks() if b.kind == kind)


@pytest.mark.parametrize("name", CHAT)
def test_assembly_matches_the_captured_values(name: str) -> None:
    want = expected(name)
    events, parser = parse(name)
    assembler = BlockAssembler.of(events)
    assert joined(assembler, "text") == want["content"]["value"]
    reasoning = want.get("reasoning_content") or want.get("reasoning")
    assert joined(assembler, "reasoning") == (reasoning["value"] if reasoning else "")
    calls = [b for b in assembler.blocks() if b.kind == "tool_call"]
    assert [(c.id, c.name, c.text) for c in calls] == [
        (t["id"], t["name"], t["arguments"]["value"]) for t in want["tool_calls"]
    ]
    failures = [e for e in events if isinstance(e, StreamFailure)]
    assert len(failures) == len(want["in_band_errors"])
    if not failures:
        assert assembler.finish_reason == want["finish_reason"]
        assert assembler.usage == want["usage"]
        assert parser.done is want["done_marker"]


def test_a_channel_switch_closes_the_previous_block() -> None:
    events, _ = parse("deepseek-chat-reasoning-content.sse")
    starts = [e for e in events if isinstance(e, BlockStart)]
    assert [(s.index, s.kind) for s in starts] == [(0, "reasoning"), (1, "text")]
    first_text = events.index(starts[1])
    assert BlockEnd(0) in events[:first_text]


def test_usage_only_chunk_is_flagged() -> None:
    parser = ChatStreamParser()
    kinds = [
        parser.feed(f)[1] for f in SSEDecoder().feed(fixture_bytes("openai-chat-text-usage.sse"))
    ]
    assert kinds[-2:] == ["usage_only", "done"]


def test_invalid_json_is_a_protocol_error() -> None:
    with pytest.raises(UpstreamProtocolError):
        ChatStreamParser().feed(SSEFrame(raw=b"data: {oops\n\n", data="{oops"))


def test_non_streaming_completion_gives_the_same_blocks() -> None:
    events = parse_completion(
        {
            "choices": [
                {
                    "index": 0,
                    "message": {
                        "role": "assistant",
                        "content": "Calling.",
                        "reasoning_content": "Think.",
                        "tool_calls": [
                            {
                                "id": "c1",
                                "type": "function",
                                "function": {"name": "f", "arguments": "{}"},
                            }
                        ],
                    },
                    "finish_reason": "tool_calls",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3},
        }
    )
    assembler = BlockAssembler.of(events)
    assert [b.to_content() for b in assembler.blocks()] == [
        {"type": "reasoning", "text": "Think."},
        {"type": "text", "text": "Calling."},
        {"type": "tool_call", "id": "c1", "name": "f", "arguments": "{}"},
    ]
    assert assembler.finish_reason == "tool_calls"
    assert assembler.usage == {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}


@pytest.mark.parametrize("name", CHAT)
def test_the_fast_text_path_gives_the_events_the_general_walk_gives(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    fast, _ = parse(name)
    monkeypatch.setattr(ChatStreamParser, "_more_text", lambda self, obj, choices: None)
    general, _ = parse(name)
    assert fast == general


def test_chunks_that_are_not_plain_text_leave_the_fast_path() -> None:
    # After a plain text chunk, each of these ends or adds a block, or carries usage.
    opening = {"choices": [{"index": 0, "delta": {"content": "a"}}]}
    others = [
        {"choices": [{"index": 0, "delta": {"content": "b"}, "finish_reason": "stop"}]},
        {"choices": [{"index": 0, "delta": {"reasoning_content": "r"}}]},
        {"choices": [{"index": 0, "delta": {"reasoning": "r", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c"}]}}]},
        {"choices": [{"index": 0, "delta": {"content": "b"}}], "usage": {"total_tokens": 1}},
    ]
    for other in others:
        parser = ChatStreamParser()
        parser.chunk(opening)
        assert parser._more_text(other, other["choices"]) is None, other


def _text_delta(parser: ChatStreamParser, payload: bytes) -> tuple[int, str] | None:
    """One frame's `data:` payload read by `text_run`: the open block's index and the piece,
    or None when it is not one more piece of the open text."""
    index, texts, stop = parser.text_run([b"data: " + payload], 0)
    assert stop == len(texts)
    return (index, texts[0]) if texts else None


def test_a_run_of_text_frames_stops_at_the_first_that_is_not_one() -> None:
    parser = ChatStreamParser()
    piece = b'data: {"choices":[{"index":0,"delta":{"content":"%s"}}]}'
    pieces = [piece % b"a", piece % b"b", b"data: [DONE]", piece % b"c"]
    assert parser.text_run(pieces, 0) == (0, [], 0)  # no text block open yet
    parser.chunk({"choices": [{"index": 0, "delta": {"content": "open"}}]})
    assert parser.text_run(pieces, 0) == (0, ["a", "b"], 2)
    assert parser.text_run(pieces, 2) == (0, [], 2)
    assert parser.text_run(pieces, 3) == (0, ["c"], 4)
    assert parser.text_run([b"event: x", *pieces], 0) == (0, [], 0)


@pytest.mark.parametrize("name", CHAT)
def test_reading_text_deltas_off_raw_payloads_gives_the_events_feed_gives(name: str) -> None:
    general, _ = parse(name)
    parser = ChatStreamParser()
    events: list[StreamEvent] = []
    read_fast = 0
    for frame in SSEDecoder().feed(fixture_bytes(name)):
        simple = frame.raw.startswith(b"data: ") and frame.raw.count(b"\n") == 2
        if simple and (delta := _text_delta(parser, frame.raw[6:-2])) is not None:
            events.append(BlockDelta(*delta))
            read_fast += 1
        else:
            events += parser.feed(frame)[0]
    assert events == general
    if name.startswith("openai-chat-text"):
        assert read_fast > 3  # the path is taken, not only refused


def test_raw_payloads_that_are_not_one_more_piece_of_text_are_refused() -> None:
    parser = ChatStreamParser()
    assert _text_delta(parser, b'{"choices":[{"index":0,"delta":{"content":"a"}}]}') is None
    parser.chunk({"choices": [{"index": 0, "delta": {"content": "a"}}]})  # text is open now
    assert _text_delta(parser, b'{"choices":[{"index":0,"delta":{"content":"b"}}]}') == (0, "b")
    for payload in [
        b"[DONE]",
        b'{"error":{"message":"overloaded"},"choices":[{"index":0,"delta":{"content":"b"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":"b"}}],"usage":{"total_tokens":1}}',
        b'{"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}',
        b'{"choices":[{"index":1,"delta":{"content":"b"}}]}',
        b'{"choices":[{"index":0,"delta":{"content":null}}]}',
        b'["not an object"]',
        b'{"choices":[{"index":0,"delta":{"content":"\xff"}}]}',  # not UTF-8: feed replaces
    ]:
        assert _text_delta(parser, payload) is None, payload


# Chunks near the shape of a text piece: each field the fast read looks at may be missing, of
# another type or another value, beside fields it skips (of any JSON type, big ints included).
_scalar = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False)
    | st.text(max_size=5)
)  # fmt: skip
_json = st.recursive(
    _scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=6,
)
_maybe = st.just(...) | _json  # `...`: the field is left out


def _fields(**fields: st.SearchStrategy[object]) -> st.SearchStrategy[dict[str, object]]:
    return st.fixed_dictionaries(fields).map(lambda d: {k: v for k, v in d.items() if v is not ...})


_delta = _fields(
    content=st.text(max_size=5) | _maybe,
    reasoning_content=st.none() | _maybe,
    reasoning=st.none() | _maybe,
    tool_calls=st.none() | _maybe,
    role=st.just("assistant") | _maybe,
)
_choice = _fields(
    index=st.sampled_from([0, 0.0, False, 1, "0"]) | _maybe,
    delta=_delta | _maybe,
    finish_reason=st.none() | st.just("stop") | _maybe,
    logprobs=_maybe,
)
_chunk = _fields(
    id=st.just("chatcmpl-1") | _maybe,
    choices=st.lists(_choice, min_size=1, max_size=2) | _maybe,
    usage=st.none() | _maybe,
    error=st.none() | _maybe,
    obfuscation=_maybe,
)


@settings(max_examples=400, deadline=None)
@given(chunk=_chunk, duplicate=st.booleans())
def test_a_text_piece_read_off_the_raw_payload_is_what_feed_reads(
    chunk: dict[str, object], duplicate: bool
) -> None:
    payload = json.dumps(chunk).encode()
    if duplicate and payload != b"{}":  # a key given twice: JSON parsers keep the last
        payload = b'{"choices":[{"index":0,"delta":{"content":"first"}}],' + payload[1:]
    fast, general = ChatStreamParser(), ChatStreamParser()
    for parser in (fast, general):
        parser.chunk({"choices": [{"index": 0, "delta": {"content": "open"}}]})
    read = _text_delta(fast, payload)
    try:
        events, kind = general.feed(SSEDecoder().feed(b"data: " + payload + b"\n\n")[0])
    except UpstreamProtocolError:
        assert read is None
        return
    if read is not None:  # refusing is always allowed; reading must agree with feed
        assert (events, kind) == ([BlockDelta(*read)], "data")


@settings(max_examples=300, deadline=None)
@given(
    content=st.one_of(st.none(), st.text(max_size=5), st.integers()),
    reason=st.sampled_from([None, "", "stop", "length", 7]),
    extra=st.sampled_from(
        [
            {},
            {"reasoning_content": "r"},
            {"reasoning": ""},
            {"tool_calls": []},
            {"refusal": "no"},
            {"tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
        ]
    ),
    index=st.sampled_from([None, 0, 1]),
    usage=st.sampled_from([None, {"prompt_tokens": 1}, 3]),
    more_choices=st.booleans(),
)
def test_a_text_answer_gives_the_events_the_general_way_gives(
    content: object,
    reason: object,
    extra: dict[str, object],
    index: int | None,
    usage: object,
    more_choices: bool,
) -> None:
    """parse_completion makes a plain text answer's events directly: the same events, in the
    same order, as the chunk-by-chunk way every other answer takes."""
    choice: dict[str, object] = {"message": {"role": "assistant", "content": content, **extra}}
    choice["finish_reason"] = reason
    if index is not None:
        choice["index"] = index
    body: dict[str, object] = {"choices": [choice] * (2 if more_choices else 1)}
    if usage is not None:
        body["usage"] = usage
    direct = parse_completion(body)
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(openai_chat, "_plain_text", lambda choice: None)
        assert direct == parse_completion(body)
