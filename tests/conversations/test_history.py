"""Matching a stateless request's messages against the stored conversation."""

from __future__ import annotations

from typing import Any

from gateway.conversations.history import branch_after, match_history
from gateway.storage.records import Event


def stored(*items: tuple[str, dict[str, Any]]) -> list[Event]:
    return [Event("c", i + 1, "t", kind, 0.0, payload) for i, (kind, payload) in enumerate(items)]


HISTORY = stored(
    ("user/message", {"content": "Q1"}),
    (
        "assistant/message",
        {"content": [{"type": "reasoning", "text": "hidden"}, {"type": "text", "text": "A1"}]},
    ),
    ("turn/end", {"status": "completed"}),
)


def test_a_continuation_records_only_the_new_messages() -> None:
    request = [
        {"role": "system", "content": "be nice"},
        {"role": "user", "content": [{"type": "text", "text": "Q1"}]},
        {"role": "assistant", "content": "A1", "refusal": None},  # reasoning dropped by the client
        {"role": "user", "content": "Q2"},
    ]
    match = match_history(HISTORY, request)
    assert match.branch_at is None
    assert match.new_messages == [{"role": "user", "content": "Q2"}]


def test_an_edited_answer_branches_after_the_last_match() -> None:
    request = [
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "A1 edited"},
        {"role": "user", "content": "Q2"},
    ]
    match = match_history(HISTORY, request)
    assert match.branch_at == 1
    assert match.new_messages == request[1:]


def test_a_regenerate_branches_at_the_user_message() -> None:
    match = match_history(HISTORY, [{"role": "user", "content": "Q1"}])
    assert match.branch_at == 1
    assert match.new_messages == []


# What follows a turn at seq 10 whose end a request's history is (by its fingerprint): the
# next question, its interrupted answer, the turn's end.
AFTER = [
    Event("c", 11, "t2", "turn/end", 0.0, {"status": "completed"}),
    Event("c", 12, "t3", "user/message", 0.0, {"content": "Q2"}),
    Event("c", 13, "t3", "assistant/message", 0.0, {"content": [], "interrupted": True}),
    Event("c", 14, "t3", "turn/end", 0.0, {"status": "aborted"}),
]


def test_after_a_turn_a_regenerate_branches_at_its_question() -> None:
    match = branch_after(AFTER, [{"role": "user", "content": "Q2"}], 10, repair=False)
    assert match is not None and (match.branch_at, match.new_messages) == (12, [])


def test_after_a_turn_an_edited_question_branches_at_the_turn() -> None:
    edited = [{"role": "user", "content": "Q2, edited"}]
    match = branch_after(AFTER, edited, 10, repair=True)
    assert match is not None and (match.branch_at, match.new_messages) == (10, edited)


def test_after_a_turn_messages_past_the_events_read_cannot_tell() -> None:
    # All of them match: the request may continue the conversation at its end.
    assert branch_after(AFTER[:2], [{"role": "user", "content": "Q2"}], 10, repair=False) is None
    assert branch_after([], [{"role": "user", "content": "Q2"}], 10, repair=False) is None


def test_after_a_turn_an_answer_repair_may_put_back_is_left_to_the_whole_path() -> None:
    follow_up = [{"role": "user", "content": "Q2"}, {"role": "user", "content": "Go on"}]
    assert branch_after(AFTER, follow_up, 10, repair=True) is None
    match = branch_after(AFTER, follow_up, 10, repair=False)
    assert match is not None and (match.branch_at, match.new_messages) == (12, follow_up[1:])


def test_nothing_in_common_branches_at_zero() -> None:
    match = match_history(HISTORY, [{"role": "user", "content": "other"}])
    assert match.branch_at == 0


def test_tool_calls_and_results_are_compared() -> None:
    history = stored(
        ("user/message", {"content": "go"}),
        (
            "assistant/message",
            {"content": [{"type": "tool_call", "id": "c1", "name": "f", "arguments": "{}"}]},
        ),
    )
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    request = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
    ]
    match = match_history(history, request)
    assert match.branch_at is None
    assert match.new_messages == [request[2]]
    other = {**call, "function": {"name": "f", "arguments": '{"x": 1}'}}
    assert (
        match_history(history, [request[0], {"role": "assistant", "tool_calls": [other]}]).branch_at
        == 1
    )


INTERRUPTED = stored(
    ("user/message", {"content": "Q1"}),
    (
        "assistant/message",
        {"content": [{"type": "text", "text": "Half an ans"}], "interrupted": True},
    ),
    ("turn/end", {"status": "aborted"}),
)


def test_repair_puts_back_a_dropped_interrupted_answer() -> None:
    request = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Q1"},
        {"role": "user", "content": "Q2"},
    ]
    match = match_history(INTERRUPTED, request, repair=True)
    assert match.branch_at is None
    assert match.new_messages == [{"role": "user", "content": "Q2"}]
    assert match.repaired == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "Q1"},
        {"role": "assistant", "content": "Half an ans"},
        {"role": "user", "content": "Q2"},
    ]


def test_repair_inside_a_longer_history() -> None:
    history = stored(
        ("user/message", {"content": "Q1"}),
        ("assistant/message", {"content": [{"type": "text", "text": "Cut"}], "interrupted": True}),
        ("user/message", {"content": "Q2"}),
        ("assistant/message", {"content": [{"type": "text", "text": "A2"}]}),
    )
    request = [
        {"role": "user", "content": "Q1"},
        {"role": "user", "content": "Q2"},
        {"role": "assistant", "content": "A2"},
        {"role": "user", "content": "Q3"},
    ]
    match = match_history(history, request, repair=True)
    assert (match.branch_at, match.new_messages) == (None, [request[3]])
    assert match.repaired is not None
    assert [m["content"] for m in match.repaired] == ["Q1", "Cut", "Q2", "A2", "Q3"]


def test_no_repair_when_anything_else_differs() -> None:
    edited = [{"role": "user", "content": "Q1"}, {"role": "assistant", "content": "Other"}]
    assert match_history(INTERRUPTED, edited, repair=True).branch_at == 1
    other_question = [{"role": "user", "content": "Q0"}, {"role": "user", "content": "Q2"}]
    assert match_history(INTERRUPTED, other_question, repair=True).branch_at == 0
    # A completed answer that was dropped is not repaired: that is a real divergence.
    completed = stored(
        ("user/message", {"content": "Q1"}),
        (
            "assistant/message",
            {"content": [{"type": "text", "text": "Full"}], "interrupted": False},
        ),
    )
    dropped = [{"role": "user", "content": "Q1"}, {"role": "user", "content": "Q2"}]
    match = match_history(completed, dropped, repair=True)
    assert (match.branch_at, match.repaired) == (1, None)


def test_repair_is_off_unless_asked() -> None:
    request = [{"role": "user", "content": "Q1"}, {"role": "user", "content": "Q2"}]
    assert match_history(INTERRUPTED, request).branch_at == 1


TOOL_ROUND = stored(
    ("user/message", {"content": "Weather in Paris?"}),
    (
        "assistant/message",
        {
            "content": [
                {
                    "type": "tool_call",
                    "id": "c1",
                    "name": "weather",
                    "arguments": '{"city":"Paris","units":{"t":"C","w":"kmh"}}',
                }
            ]
        },
    ),
)


def _resent(arguments: str, *, call_id: str = "c1", name: str = "weather") -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
    return [
        {"role": "user", "content": [{"type": "text", "text": "Weather in Paris?"}]},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": call_id, "content": "18 C"},
    ]


def test_tool_arguments_resent_re_serialised_or_reordered_continue() -> None:
    for arguments in (
        '{"city": "Paris", "units": {"t": "C", "w": "kmh"}}',  # json.dumps, as LangChain resends
        '{"units":{"w":"kmh","t":"C"},"city":"Paris"}',  # keys in another order
        '{\n  "city": "Paris",\n  "units": {"t": "C", "w": "kmh"}\n}',  # pretty-printed
    ):
        match = match_history(TOOL_ROUND, _resent(arguments))
        assert match.branch_at is None, arguments
        assert match.new_messages == [_resent(arguments)[2]]


def test_a_changed_argument_call_id_or_name_branches() -> None:
    for request in (
        _resent('{"city": "Lyon", "units": {"t": "C", "w": "kmh"}}'),
        _resent('{"city": "Paris", "units": {"t": "F", "w": "kmh"}}'),
        _resent('{"city":"Paris","units":{"t":"C","w":"kmh"}}', call_id="c2"),
        _resent('{"city":"Paris","units":{"t":"C","w":"kmh"}}', name="climate"),
    ):
        assert match_history(TOOL_ROUND, request).branch_at == 1


def test_arguments_that_are_not_json_are_compared_as_text() -> None:
    history = stored(
        ("user/message", {"content": "go"}),
        (
            "assistant/message",
            {"content": [{"type": "tool_call", "id": "c1", "name": "f", "arguments": "{broken"}]},
        ),
    )
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{broken"}}
    same = [{"role": "user", "content": "go"}, {"role": "assistant", "tool_calls": [call]}]
    assert match_history(history, same).branch_at is None
    other = {**call, "function": {"name": "f", "arguments": "{broken "}}
    changed = [same[0], {"role": "assistant", "tool_calls": [other]}]
    assert match_history(history, changed).branch_at == 1


def test_text_parts_with_extra_keys_equal_their_joined_string() -> None:
    request = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Q", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "1"},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "A1"}]},
        {"role": "user", "content": "Q2"},
    ]
    match = match_history(HISTORY, request)
    assert match.branch_at is None
    assert match.new_messages == [request[2]]
