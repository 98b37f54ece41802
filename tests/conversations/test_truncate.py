"""Truncates applied to history, without a server (docs/recording.md, "What the user saw")."""

from __future__ import annotations

from typing import Any

from gateway.conversations.derive import apply_truncates, cut_blocks, derive_messages, text_chars
from gateway.conversations.history import match_history
from gateway.conversations.items import path_items
from gateway.storage.records import Event

# Code points, not bytes (UTF-8: 4 for the emoji, 3 for each CJK) nor UTF-16 units (2 for it).
TEXT = "你好🙂 world"  # 9 code points
CALL = {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": "{}"}


def ev(seq: int, kind: str, conversation: str = "c", turn: str = "t1", **payload: Any) -> Event:
    return Event(conversation, seq, turn, kind, 0.0, payload)


def answer(seq: int, blocks: list[dict[str, Any]], conversation: str = "c") -> Event:
    return ev(seq, "assistant/message", conversation, content=blocks, interrupted=True)


def truncate(seq: int, message_seq: int, chars: int, conversation: str = "c") -> Event:
    return ev(seq, "assistant/truncate", conversation, message_seq=message_seq, content_chars=chars)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def test_text_is_cut_in_code_points() -> None:
    assert len(TEXT.encode()) == 16 and len(TEXT.encode("utf-16-le")) // 2 == 10
    assert text_chars([text(TEXT)]) == 9
    assert cut_blocks([text(TEXT)], 3) == [text("你好🙂")]
    assert cut_blocks([text(TEXT)], 2) == [text("你好")]
    assert cut_blocks([text(TEXT)], 0) == []


def test_blocks_before_the_cut_are_kept_and_everything_after_it_dropped() -> None:
    reasoning, more = {"type": "reasoning", "text": "think"}, {"type": "reasoning", "text": "more"}
    blocks = [reasoning, text("ab"), CALL, more, text("cdef"), CALL]
    # The cut falls in the second text block: what came before it stays, in order.
    assert cut_blocks(blocks, 3) == [reasoning, text("ab"), CALL, more, text("c")]
    # At the end of the first text block: the next text block was not shown at all, nor
    # anything streamed after its first character.
    assert cut_blocks(blocks, 2) == [reasoning, text("ab"), CALL, more]
    assert cut_blocks(blocks, 1) == [reasoning, text("a")]
    # All of the text shown: every block stays.
    assert cut_blocks(blocks, 6) == blocks


def test_derive_applies_a_truncate_and_leaves_the_log_alone() -> None:
    message = answer(2, [{"type": "reasoning", "text": "r"}, text(TEXT)])
    events = [
        ev(1, "user/message", content="hi"),
        message,
        ev(3, "turn/end", status="aborted"),
        truncate(4, 2, 3),
    ]
    assert derive_messages(events) == [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "你好🙂", "reasoning_content": "r"},
    ]
    assert message.payload["content"][1] == text(TEXT)  # the recorded event is unchanged
    applied = apply_truncates(events)
    assert [e.type for e in applied] == ["user/message", "assistant/message", "turn/end"]
    assert applied[1].payload["truncated"] == {"seq": 4, "content_chars": 3, "delivered_chars": 9}
    assert applied[1].payload["interrupted"] is True
    # Applying again changes nothing (a derived path is applied already).
    assert apply_truncates(applied) == applied


def test_the_shortest_truncate_holds_whatever_the_order() -> None:
    events = [answer(1, [text(TEXT)]), truncate(2, 1, 2), truncate(3, 1, 5)]
    assert derive_messages(events)[0]["content"] == "你好"


def test_a_truncate_recorded_after_a_branch_point_still_applies() -> None:
    # The branch's path holds its parent's events up to seq 2; the truncate came at 3.
    path = [ev(1, "user/message", "parent", content="hi"), answer(2, [text(TEXT)], "parent")]
    later = [truncate(3, 2, 1, "parent")]
    assert derive_messages(apply_truncates(path, later))[1]["content"] == "你"


def test_a_truncate_names_its_own_conversation_s_message() -> None:
    # seq 2 of the branch is not seq 2 of its parent.
    events = [answer(2, [text(TEXT)], "branch"), truncate(3, 2, 1, "parent")]
    assert derive_messages(events)[0]["content"] == TEXT


def test_a_tool_call_after_the_cut_never_needs_a_result() -> None:
    events = [answer(1, [text("abc"), CALL]), truncate(2, 1, 2)]
    assert derive_messages(events) == [{"role": "assistant", "content": "ab"}]


def test_history_matching_sees_the_truncated_text() -> None:
    path = apply_truncates(
        [
            ev(1, "user/message", content="hi"),
            answer(2, [text(TEXT)]),
            ev(3, "turn/end", status="aborted"),
            truncate(4, 2, 3),
        ]
    )
    shown = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "你好🙂"}]
    follow = {"role": "user", "content": "go on"}
    match = match_history(path, [*shown, follow])
    assert (match.branch_at, match.new_messages) == (None, [follow])
    # The delivered text is no longer what the model remembers: sent back, it branches.
    delivered = [shown[0], {"role": "assistant", "content": TEXT}, follow]
    assert match_history(path, delivered).branch_at == 1
    # History repair puts back what was shown.
    repaired = match_history(path, [shown[0], follow], repair=True)
    assert repaired.repaired == [*shown, follow]


def test_items_show_the_truncated_text() -> None:
    items = path_items(apply_truncates([answer(1, [text(TEXT), CALL]), truncate(2, 1, 4)]))
    assert [(i["type"], i["status"]) for i in items] == [("message", "incomplete")]
    assert items[0]["content"][0]["text"] == "你好🙂 "
