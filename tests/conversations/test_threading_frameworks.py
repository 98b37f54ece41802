"""Histories frameworks send back in their own shape compare equal to what the gateway
recorded (docs/recording.md, "Equal histories"), and only to that."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.conversations.history import message_key
from gateway.conversations.reshaped import dspy_view
from gateway.conversations.threading import end_fingerprint, fingerprint, prior_history
from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream
from tests.frameworks.scripts import Call, reply


def native(*calls: tuple[str, str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
            for i, n, a in calls
        ],
    }


def text(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "text", "text": content}]}


PARIS = ("call_1", "get_weather", '{"city":"Paris"}')
LONDON = ("call_2", "get_weather", '{"city":"London"}')


def test_smolagents_calls_as_text_are_the_calls() -> None:
    sent = "Calling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': 'get_weather', 'arguments': {'city': 'Paris'}}}]"  # noqa: E501
    assert message_key(text(sent)) == message_key(native(PARIS))
    both = (
        "Calling tools:\n[{'id': 'call_2', 'type': 'function', 'function': {'name':"
        " 'get_weather', 'arguments': {'city': 'London'}}}, {'id': 'call_1', 'type':"
        " 'function', 'function': {'name': 'get_weather', 'arguments': '{\"city\": \"Paris\"}'}}]"
    )
    assert message_key(text(both)) == message_key(native(PARIS, LONDON))
    # The model's text with its calls: smolagents sends both in one message.
    said = {**native(PARIS), "content": "Let me look."}
    assert message_key(text(f"Let me look.\n{sent}")) == message_key(said)
    assert message_key(text(f"Let me look.{sent}")) != message_key(said)
    # CodeAgent's code, its closing tag written in by smolagents, and its own record of it.
    code = 'Thought: Look.\n<code>\nprint(get_weather(city="Paris"))\n'
    ran = "Calling tools:\n[{'id': 'call_1', 'type': 'function', 'function': {'name': 'python_interpreter', 'arguments': 'print(1)'}}]"  # noqa: E501
    for answer in (code, f"{code}</code>"):  # the model stopped at the tag, or wrote it
        assert message_key(text(f"{code}</code>\n{ran}")) == message_key(text(answer))
    assert message_key(text(f"{code}</code>\n{ran}")) != message_key(text(code + "# more\n"))
    # Another argument, id or call is another message; text that only looks alike is text.
    assert message_key(text(sent.replace("Paris", "Lyon"))) != message_key(native(PARIS))
    assert message_key(text(sent.replace("call_1", "call_9"))) != message_key(native(PARIS))
    assert message_key(text(sent)) != message_key(native(PARIS, LONDON))
    for other in ("Calling tools:\n[not python]", "Calling tools:\n[]", "Calling tools:\n[1]"):
        assert message_key(text(other)) == ("assistant", other, ())


def test_a_react_action_compares_by_its_input() -> None:
    model = 'Thought: I need the weather.\nAction: get_weather\nAction Input: {"city": "Paris"}'
    resent = "Thought: I need the weather.\nAction: get_weather\nAction Input: {'city': 'Paris'}"
    assert message_key(text(resent)) == message_key(text(model))
    assert message_key(text(resent.replace("Paris", "Lyon"))) != message_key(text(model))
    assert message_key(text(resent.replace("weather.", "time."))) != message_key(text(model))
    answer = "Thought: I can answer.\nAnswer: Sunny."
    assert message_key(text(answer)) == ("assistant", answer, ())


def test_merged_tool_steps_have_the_steps_fingerprint() -> None:
    user = {"role": "user", "content": "Paris and London?"}
    results = [
        {"role": "tool", "tool_call_id": "call_1", "content": "18"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12"},
    ]
    steps = [user, native(PARIS), results[0], native(LONDON), results[1], text("Done.")]
    merged = [user, native(PARIS, LONDON), *results, text("Done.")]
    assert fingerprint("key", None, merged, merged) == fingerprint("key", None, steps, steps)
    # Only calls with their results are steps: another result, or one missing, is not.
    other = [user, native(PARIS, LONDON), results[0], {**results[1], "content": "13"}]
    assert fingerprint("key", None, other, other) != fingerprint("key", None, steps, steps[:5])
    short = [user, native(PARIS, LONDON), results[0], text("Done.")]
    unmerged = [user, native(PARIS), results[0], native(LONDON), text("Done.")]
    assert fingerprint("key", None, short, short) != fingerprint("key", None, unmerged, unmerged)


SIGNATURE = "Your input fields are:\n1. `question` (str): \n2. `trajectory` (str):\nYour output"


def dspy_prompt(trajectory: str, question: str = "Paris?") -> list[dict[str, Any]]:
    user = f"[[ ## question ## ]]\n{question}\n\n[[ ## trajectory ## ]]\n{trajectory}"
    return [
        {"role": "system", "content": SIGNATURE},
        {"role": "user", "content": f"{user}\n\nRespond with the corresponding output fields."},
    ]


def test_a_dspy_step_continues_the_step_before() -> None:
    first = dspy_prompt("")
    answer = text(
        "[[ ## next_thought ## ]]\nLook it up.\n\n[[ ## next_tool_name ## ]]\nget_weather"
        '\n\n[[ ## next_tool_args ## ]]\n{"city":"Paris"}\n\n[[ ## completed ## ]]'
    )
    entry = (
        "[[ ## thought_0 ## ]]\nLook it up.\n\n[[ ## tool_name_0 ## ]]\nget_weather\n\n"
        '[[ ## tool_args_0 ## ]]\n{"city": "Paris"}\n\n[[ ## observation_0 ## ]]\nSunny'
    )
    view = dspy_view(dspy_prompt(entry))
    assert view is not None and [m["role"] for m in view] == [
        *["system", "user", "assistant", "user"]
    ]
    after_first = end_fingerprint("key", None, first, answer)
    assert fingerprint("key", None, view, prior_history(view)) == after_first
    # Another question, another action, or another user's: another history.
    for other in (
        dspy_view(dspy_prompt(entry, question="London?")),
        dspy_view(dspy_prompt(entry.replace("Paris", "Lyon"))),
    ):
        assert other is not None
        assert fingerprint("key", None, other, prior_history(other)) != after_first
    assert fingerprint("key", "ann", view, prior_history(view)) != after_first
    # Not DSPy's shape: no view.
    assert dspy_view([{"role": "user", "content": "[[ ## trajectory ## ]]\n"}]) is None
    assert dspy_view(dspy_prompt(entry.replace("thought_0", "thought_1"))) is None


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_merged_tool_steps_continue_on_either_backend(
    request: pytest.FixtureRequest, make_gateway: MakeGateway, upstream: FakeUpstream, backend: str
) -> None:
    """Mastra's second run, its first run's steps merged: one conversation, also where the
    history is compared with the stored one message by message (PostgreSQL, or named)."""
    store = {} if backend == "sqlite" else {"url": request.getfixturevalue("pg_url")}
    gw = await make_gateway(upstream=upstream, store=store)
    paris, london = Call(*PARIS[:2], {"city": "Paris"}), Call(*LONDON[:2], {"city": "London"})
    upstream.push(reply(calls=[paris]), reply(calls=[london]), reply("Done."), reply("Rome."))
    user = {"role": "user", "content": "Paris and London?"}
    results = [
        {"role": "tool", "tool_call_id": "call_1", "content": "18"},
        {"role": "tool", "tool_call_id": "call_2", "content": "12"},
    ]
    runs = [
        [user],
        [user, native(PARIS), results[0]],
        [user, native(PARIS), results[0], native(LONDON), results[1]],
        [
            user,
            native(PARIS, LONDON),
            *results,
            text("Done."),
            {"role": "user", "content": "Rome?"},
        ],
    ]
    client = gw.client()
    named = []
    for messages in runs:
        raw = await client.chat.completions.with_raw_response.create(
            model="fake", messages=messages
        )
        named.append(raw.headers["X-Conversation-Id"])
        await gw.flush()
    assert len(set(named)) == 1, named
    # Named, the merged form continues the conversation too.
    upstream.push(reply("Still Rome."))
    again = [*runs[-1][:-1], {"role": "user", "content": "Rome?"}, text("Rome."), user]
    raw = await client.chat.completions.with_raw_response.create(
        model="fake",
        messages=again,
        extra_headers={"X-Conversation-Id": named[0]},
    )
    assert raw.headers["X-Conversation-Id"] == named[0]
