"""Histories a framework writes into a fresh prompt each step, read as the history they hold.

DSPy's ReAct asks each step with a new prompt (its ChatAdapter's): a system message naming
the signature's fields and one user message holding the inputs and the trajectory so far,
each field under a `[[ ## name ## ]]` marker, the steps' `thought_i`, `tool_name_i`,
`tool_args_i` and `observation_i` among them. The model answers `next_thought`,
`next_tool_name` and `next_tool_args` the same way, and the next prompt carries them back as
the trajectory's next entry, with the tool's observation. No message of one step's request
is in the next one's, so threading would find no history to continue.

`dspy_view` reads such a request as the conversation it holds: the inputs as the first user
message, each trajectory entry as an assistant message (the thought, tool and arguments, in
one canonical text) and the observation as the user message after it; its instructions are
the signature's input fields, which ReAct's steps and the extraction that ends the run share.
`dspy_answer` reads a step's answer as the trajectory entry it becomes. Threading
fingerprints these views (gateway.conversations.threading), so each step continues the
conversation of the step before: what is recorded is each prompt as sent, and its answer.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

from gateway.conversations.history import text_of

_SYSTEM = "Your input fields are:\n"
_OUTPUTS = "\nYour output fields are:\n"
_TRAJECTORY = "[[ ## trajectory ## ]]\n"
_REQUIREMENTS = "\n\nRespond with the corresponding output fields"
_FIELD = re.compile(r"\[\[ ## (\w+) ## \]\](?:\n|\Z)")
_STEP = ("thought", "tool_name", "tool_args", "observation")


def _fields(text: str) -> list[tuple[str, str]]:
    """(name, value) of each `[[ ## name ## ]]` field of `text`, in order, values stripped."""
    parts = _FIELD.split(text)
    return [(parts[i], parts[i + 1].strip()) for i in range(1, len(parts) - 1, 2)]


def _action(thought: str, tool: str, arguments: str) -> dict[str, Any]:
    """One ReAct step's action as an assistant message, its arguments as canonical JSON."""
    try:
        parsed = orjson.loads(arguments)
        arguments = orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()
    except orjson.JSONDecodeError:
        pass
    return {"role": "assistant", "content": f"{thought}\n{tool}\n{arguments}"}


def dspy_view(messages: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The history a DSPy ReAct prompt holds, with its instructions (see the module's
    docstring); None for any other request."""
    if len(messages) != 2 or messages[0].get("role") != "system":
        return None
    system = text_of(messages[0].get("content"))
    if not system.startswith(_SYSTEM) or messages[1].get("role") != "user":
        return None
    prompt = text_of(messages[1].get("content"))
    inputs, marker, trajectory = prompt.partition(_TRAJECTORY)
    if not marker:
        return None
    trajectory = trajectory.rsplit(_REQUIREMENTS, 1)[0]
    fields = _fields(trajectory)
    if len(fields) % len(_STEP):
        return None
    view: list[dict[str, Any]] = [
        {"role": "system", "content": system.partition(_OUTPUTS)[0]},
        {"role": "user", "content": inputs.strip()},
    ]
    for i in range(0, len(fields), len(_STEP)):
        step = fields[i : i + len(_STEP)]
        n = i // len(_STEP)
        if [name for name, _ in step] != [f"{kind}_{n}" for kind in _STEP]:
            return None
        (_, thought), (_, tool), (_, arguments), (_, observation) = step
        view.append(_action(thought, tool, arguments))
        view.append({"role": "user", "content": observation})
    return view


def dspy_answer(answer: dict[str, Any]) -> dict[str, Any]:
    """A ReAct step's answer as the trajectory entry the next prompt carries; any other
    answer as it is."""
    fields = dict(_fields(text_of(answer.get("content"))))
    if answer.get("tool_calls") or not {"next_thought", "next_tool_name"} <= fields.keys():
        return answer
    return _action(
        fields["next_thought"], fields["next_tool_name"], fields.get("next_tool_args", "{}")
    )
