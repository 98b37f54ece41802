"""Joining a request to a stored conversation.

A stateless chat client sends its whole history every time. With `X-Conversation-Id`, the
request's messages are compared with the conversation's stored surface messages: the matching
prefix is already recorded, the rest is new input. When the request disagrees with the stored
history (an edit, a regenerate, a client that dropped a message), the turn starts a branch at the
last matching event. Comparison is on what a model sees (role, text, tool calls and results),
in canonical form (docs/recording.md, "Equal histories"): text as a string or as text parts,
tool-call arguments as the JSON they parse to; fields clients commonly drop or add
(reasoning, `name`, `refusal: null`) are ignored.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.conversations.derive import surface_message
from gateway.storage.records import (
    ASSISTANT_MESSAGE,
    SURFACE_TYPES,
    AssistantMessagePayload,
    Event,
)

HISTORY_ROLES = frozenset({"user", "assistant", "tool"})


def text_of(content: Any) -> Any:
    """Message content in canonical form: text as one string, anything else as its JSON."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    return orjson.dumps(content, option=orjson.OPT_SORT_KEYS).decode()


def _arguments(arguments: Any) -> Any:
    """Tool-call arguments as the JSON they hold, keys sorted: clients send them back
    re-serialised (`{"city": "Paris"}` for the upstream's `{"city":"Paris"}`). Text that is not
    JSON is compared as it is."""
    if not isinstance(arguments, str):
        return arguments
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        return arguments
    return orjson.dumps(parsed, option=orjson.OPT_SORT_KEYS).decode()


# Frameworks that send a tool call back as assistant text (docs/recording.md, "Equal
# histories"): smolagents' ToolCallingAgent writes the upstream's native calls as
# "Calling tools:\n" and the Python repr of their list; LlamaIndex's ReActAgent writes the
# model's "Thought/Action/Action Input" answer again with the input as a Python dict.
_SMOLAGENTS_CALLS = "Calling tools:\n["
_SMOLAGENTS_CODE = "python_interpreter"
_CODE_END = "</code>"
_REACT = re.compile(r"Thought: (.*?)\n+Action: ([^\n]+?)\n+Action Input: (\{.*\})\s*", re.DOTALL)


def _literal(text: str) -> Any:
    """JSON, else a Python literal (what `str()` of a dict gives); None when it is neither."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None


def _text_calls(text: str) -> tuple[Any, ...] | None:
    """The tool calls smolagents wrote as text ("Calling tools:\n[...]"), as `message_key`
    keys native ones; None for any other text."""
    calls = _literal(text[len(_SMOLAGENTS_CALLS) - 1 :])
    if not isinstance(calls, list) or not calls:
        return None
    keys = []
    for call in calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            return None
        arguments = function.get("arguments")
        if not isinstance(arguments, str):  # smolagents keeps them parsed
            arguments = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
        keys.append((call.get("id"), function.get("name"), _arguments(arguments)))
    return tuple(keys)


def _react_text(text: str) -> str:
    """A ReAct action ("Thought: ...\nAction: ...\nAction Input: {...}") with its input as
    canonical JSON, so the model's JSON and a framework's Python dict of it compare equal."""
    match = _REACT.fullmatch(text)
    if match is None:
        return text
    arguments = _literal(match[3])
    if not isinstance(arguments, dict):
        return text
    canonical = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS).decode()
    return f"Thought: {match[1].strip()}\nAction: {match[2].strip()}\nAction Input: {canonical}"


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    role = message.get("role")
    content = message.get("content")
    if role == "assistant":
        tool_calls = message.get("tool_calls")
        calls = _calls(tool_calls) if tool_calls else ()
        text = content if content.__class__ is str else text_of(content)
        if not calls and text.endswith("]"):
            # smolagents writes the model's text, if any, and its calls as one message.
            at = text.rfind(_SMOLAGENTS_CALLS)
            after_line = at == 0 or (at > 0 and text[at - 1] == "\n")
            decoded = _text_calls(text[at:]) if after_line else None
            if decoded is not None:
                text = text[:at].strip()
                # Its CodeAgent's record of running the code the model wrote: no model's call.
                if any(c[1] != _SMOLAGENTS_CODE for c in decoded):
                    calls = decoded
        elif text.startswith("Thought: "):
            text = _react_text(text)
        if text.endswith(_CODE_END):
            # smolagents stops the model at its code's closing tag, then writes it in itself;
            # a model given no stop sequence writes it.
            text = text[: -len(_CODE_END)]
        if len(calls) > 1:
            # One round's parallel calls: frameworks that run them concurrently list them as
            # they finished (smolagents).
            calls = tuple(sorted(calls, key=repr))
        return ("assistant", text, calls)
    if role == "tool":
        return ("tool", message.get("tool_call_id"), text_of(content))
    # (A history's every other message: text as it is, without a call.)
    return (role, content if content.__class__ is str else text_of(content))


def _calls(tool_calls: Any) -> tuple[tuple[Any, ...], ...]:
    return tuple(
        (
            call.get("id"),
            (call.get("function") or {}).get("name"),
            _arguments((call.get("function") or {}).get("arguments")),
        )
        for call in tool_calls
        if isinstance(call, dict)
    )


def steps(keys: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The history with each answer of several tool calls, followed by a result for each,
    written as one step per call (that call, then its result), in the order of the results.
    Mastra sends the steps of a tool loop back merged into one assistant message; the gateway
    recorded them as the steps they were; both read the same here."""
    if not any(k[0] == "assistant" and len(k[2]) > 1 for k in keys):
        return keys
    out: list[tuple[Any, ...]] = []
    i = 0
    while i < len(keys):
        key = keys[i]
        calls = key[2] if key[0] == "assistant" else ()
        end = i + 1 + len(calls)
        results = keys[i + 1 : end]
        by_id = {call[0]: call for call in calls}
        if (
            len(calls) > 1
            and len(results) == len(calls)
            and all(r[0] == "tool" for r in results)
            and {r[1] for r in results} == by_id.keys()
        ):
            for n, result in enumerate(results):
                out.append(("assistant", key[1] if n == 0 else "", (by_id[result[1]],)))
                out.append(result)
            i = end
            continue
        out.append(key)
        i += 1
    return out


def resent(history: list[dict[str, Any]], new: list[dict[str, Any]]) -> int:
    """How many of a stateful request's new messages repeat its stored history's last turn.

    A client continuing a tool round on a conversation the gateway keeps (the Vercel AI SDK
    with a Responses `conversation`) may send the round's question, and the call, again with
    the results. Only then (the stored history ends with tool calls that the new messages
    answer) are they taken as already recorded; a question asked again otherwise is new."""
    last = history[-1] if history else {}
    calls = (
        {c.get("id") for c in last.get("tool_calls") or ()}
        if last.get("role") == "assistant"
        else set()
    )
    if not calls or not any(
        m.get("role") == "tool" and m.get("tool_call_id") in calls for m in new
    ):
        return 0
    users = [i for i, m in enumerate(history) if m.get("role") == "user"]
    return _repeated(history[users[-1] if users else 0 :], new)[0]


def _repeated(turn: list[dict[str, Any]], new: list[dict[str, Any]]) -> tuple[int, int]:
    """How many of `new` repeat `turn` from its start, and how much of `turn` they cover."""
    n = t = 0
    while n < len(new) and t < len(turn):
        if message_key(new[n]) == message_key(turn[t]):
            n, t = n + 1, t + 1
        elif turn[t].get("role") == "assistant":
            t += 1  # the client left out the answer it continues
        else:
            break
    return n, t


def resends(moved: list[dict[str, Any]], new: list[dict[str, Any]]) -> bool:
    """Whether a request on a stored response, whose conversation has moved on since by the
    messages `moved`, is the next step of the turn that moved it: the Vercel AI SDK sends
    one `previous_response_id` with every step of a tool loop, each step's input the turn's
    question, its calls so far and their results. True only when `moved` is one turn (a
    question and what answered it) ending with tool calls, `new` repeats all of it, and
    goes on with a result for one of those calls; then `resent` takes the repeated part as
    already recorded."""
    if not moved or moved[0].get("role") != "user" or moved[-1].get("role") != "assistant":
        return False
    calls = {c.get("id") for c in moved[-1].get("tool_calls") or () if isinstance(c, dict)}
    if not calls or any(m.get("role") == "user" for m in moved[1:]):
        return False
    n, t = _repeated(moved, new)
    return t == len(moved) and any(
        m.get("role") == "tool" and m.get("tool_call_id") in calls for m in new[n:]
    )


@dataclass(frozen=True)
class HistoryMatch:
    new_messages: list[dict[str, Any]]
    # None: the request continues the stored history. Otherwise the seq to branch at.
    branch_at: int | None
    # Repair: the request's messages with the interrupted answers it left out put back.
    repaired: list[dict[str, Any]] | None = None
    # The request's messages with the signed thinking (`thinking_blocks`) of the stored
    # answers they match put back where the client left it out, which Anthropic requires in
    # a tool loop with thinking on; None when nothing was left out.
    restored: list[dict[str, Any]] | None = None


def _merged_steps(surface: list[Event], s: int, history: list[dict[str, Any]], h: int) -> int:
    """How many tool steps the request's message at `h` merges (see `steps`), when it and
    the results after it are the stored steps from `s`; 0 when they are not."""
    if h >= len(history) or len(history[h].get("tool_calls") or ()) < 2:
        return 0
    count = len(history[h]["tool_calls"])
    sent = [message_key(m) for m in history[h : h + 1 + count]]
    stored = [surface_message(e) for e in surface[s : s + 2 * count]]
    if len(stored) < 2 * count or any(m is None for m in stored):
        return 0
    if steps(sent) != [message_key(m) for m in stored if m is not None]:
        return 0
    return count


def _dropped_interrupted(event: Event) -> bool:
    """An answer its client did not show whole: interrupted, or truncated to what was shown
    (after all of it was delivered)."""
    if event.type != ASSISTANT_MESSAGE:
        return False
    # Bound rather than cast(), which is a call: this runs for every event a history matches.
    payload: AssistantMessagePayload = event.payload  # type: ignore[assignment]
    return bool(payload.get("interrupted")) or "truncated" in payload


def match_history(
    stored: list[Event], request_messages: list[dict[str, Any]], *, repair: bool = False
) -> HistoryMatch:
    """Compare a request with the stored history.

    With `repair`, an interrupted answer the request leaves out at its place (many chat UIs
    drop a partial answer when the user presses Stop) is put back, so the model sees what the
    user saw; any other difference still branches.
    """
    surface = [e for e in stored if e.type in SURFACE_TYPES]
    positions = [i for i, m in enumerate(request_messages) if m.get("role") in HISTORY_ROLES]
    history = [request_messages[i] for i in positions]
    inserts: list[tuple[int, dict[str, Any]]] = []  # (position in request_messages, message)
    thinking: list[tuple[int, Any]] = []  # (position, the stored answer's signed thinking)
    s = h = 0
    while s < len(surface):
        stored_message = surface_message(surface[s])
        if (
            h < len(history)
            and stored_message is not None
            and message_key(stored_message) == message_key(history[h])
        ):
            if "thinking_blocks" in stored_message and not history[h].get("thinking_blocks"):
                thinking.append((positions[h], stored_message["thinking_blocks"]))
            s, h = s + 1, h + 1
            continue
        merged = _merged_steps(surface, s, history, h)
        if merged:
            s, h = s + 2 * merged, h + 1 + merged
            continue
        # A different assistant message at this place is an edit, not an omission; a request
        # that ends where the interrupted answer was asks for it again (a regenerate).
        omitted = h < len(history) and history[h].get("role") != "assistant"
        if repair and omitted and stored_message is not None and _dropped_interrupted(surface[s]):
            following = surface_message(surface[s + 1]) if s + 1 < len(surface) else None
            if following is None or (
                h < len(history) and message_key(following) == message_key(history[h])
            ):
                at = positions[h] if h < len(history) else len(request_messages)
                inserts.append((at, stored_message))
                s += 1
                continue
        break
    new = history[h:]
    restored = None
    if thinking:
        restored = list(request_messages)
        for at, blocks in thinking:
            restored[at] = {**restored[at], "thinking_blocks": blocks}
    repaired = None
    if inserts:
        repaired = list(restored or request_messages)
        for at, message in reversed(inserts):
            repaired.insert(at, message)
    if s == len(surface):
        return HistoryMatch(new, None, repaired, restored)
    return HistoryMatch(new, surface[s - 1].seq if s else 0, restored=restored)


def branch_after(
    after: list[Event], new_messages: list[dict[str, Any]], seq: int, *, repair: bool
) -> HistoryMatch | None:
    """`match_history`'s answer for a request whose history is known to be the stored one
    through the event `seq` (it has the fingerprint of a turn that ended there), given the
    events `after` it (the first of them) and the request's messages after that history
    (`new_messages`: user and tool messages): the branch it makes where they depart.

    None when these events cannot tell, and the whole path is to be compared: the messages
    reach past them (the request may continue the conversation at its end), or an answer
    the request leaves out is one history repair might put back, which depends on the
    truncates recorded after it."""
    surface = [e for e in after if e.type in SURFACE_TYPES]
    match = match_history(surface, new_messages)
    if match.branch_at is None:
        return None
    # With no answer among the messages, each that matches is one stored event.
    s = len(new_messages) - len(match.new_messages)
    if repair and match.new_messages and surface[s].type == ASSISTANT_MESSAGE:
        return None
    return match if s else HistoryMatch(match.new_messages, seq)
