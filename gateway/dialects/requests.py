"""Reading a JSON request body into a pydantic model: one error shape for every endpoint.

A bad body is a 400 `invalid_request_error` whose `param` names the field the way OpenAI does
(`messages[0].role`), whichever dialect or admin endpoint received it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeGuard, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidRequest, PayloadTooLarge

M = TypeVar("M", bound=BaseModel)

# orjson reads JSON nested up to 1024 levels deep but writes at most 254, and the gateway writes
# every body again (forwarded upstream, recorded inside its own envelopes): a body nested deeper
# than it can write would fail later as a 500. Bodies deeper than this are refused up front.
MAX_JSON_DEPTH = 128
_ORJSON_MAX_DEPTH = 254


def _too_deep(body: object) -> bool:
    """Whether `body` nests deeper than MAX_JSON_DEPTH: orjson, asked to write it inside
    enough empty levels, reaches its own limit exactly then (at C speed, no Python walk)."""
    for _ in range(_ORJSON_MAX_DEPTH - MAX_JSON_DEPTH):
        body = [body]
    try:
        orjson.dumps(body)
    except orjson.JSONEncodeError:
        return True
    return False


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise InvalidRequest("The request body is empty; expected a JSON object.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
    # Nesting needs an opening bracket a level: most bodies have too few to be deep at all, and
    # counting bytes is far cheaper than the check.
    if raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH and _too_deep(body):
        raise InvalidRequest(f"The request body is nested more than {MAX_JSON_DEPTH} levels deep.")
    return body


def param_path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def validated(model: type[M], body: Mapping[str, object]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = param_path(tuple(first["loc"]))
        if first["type"] == "missing":
            raise InvalidRequest(f"Missing required parameter: '{param}'.", param=param) from None
        if first["type"] == "extra_forbidden":
            raise InvalidRequest(f"Unknown parameter: '{param}'.", param=param) from None
        raise InvalidRequest(f"Invalid value for '{param}': {first['msg']}.", param=param) from None


# The largest output bound a request may name (`max_tokens`, `max_completion_tokens`,
# `max_output_tokens`): no model comes near it, and every reservation is an exact integer.
MAX_OUTPUT_TOKENS = 2**31 - 1
# OpenAI's own range for `n` (choices per request).
MAX_CHOICES = 128


def _whole(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(low: float, high: float) -> Callable[[object], bool]:
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high


def _list_of(kind: type) -> Callable[[object], bool]:
    return lambda v: isinstance(v, list) and all(isinstance(x, kind) for x in v)


# The chat parameters the gateway knows, by OpenAI's documented types and ranges: what it does
# not read itself would otherwise be recorded as sent and left to the upstream to refuse.
# (Parameters it does not know are forwarded as they are; null stands for "not set".)
_CHAT_PARAMS: dict[str, tuple[Callable[[object], bool], str]] = {
    "temperature": (_number(0, 2), "a number from 0 to 2"),
    "top_p": (_number(0, 1), "a number from 0 to 1"),
    "presence_penalty": (_number(-2, 2), "a number from -2 to 2"),
    "frequency_penalty": (_number(-2, 2), "a number from -2 to 2"),
    "seed": (_whole, "an integer"),
    "top_logprobs": (lambda v: _whole(v) and 0 <= v <= 20, "an integer from 0 to 20"),
    "stream": (lambda v: isinstance(v, bool), "a boolean"),
    "logprobs": (lambda v: isinstance(v, bool), "a boolean"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "a boolean"),
    "store": (lambda v: isinstance(v, bool), "a boolean"),
    "user": (lambda v: isinstance(v, str), "a string"),
    "reasoning_effort": (lambda v: isinstance(v, str), "a string"),
    "service_tier": (lambda v: isinstance(v, str), "a string"),
    "stop": (lambda v: isinstance(v, str) or _list_of(str)(v), "a string or a list of strings"),
    "tools": (_list_of(dict), "a list of tool objects"),
    "tool_choice": (lambda v: isinstance(v, (str, dict)), "a string or an object"),
    "modalities": (_list_of(str), "a list of strings"),
    "response_format": (lambda v: isinstance(v, dict), "an object"),
    "stream_options": (lambda v: isinstance(v, dict), "an object"),
    "logit_bias": (lambda v: isinstance(v, dict), "an object"),
    "metadata": (lambda v: isinstance(v, dict), "an object"),
}


def check_chat_params(body: Mapping[str, object]) -> None:
    """The types and ranges of a chat body's known parameters: a 400 naming the first wrong
    one, before anything is admitted or recorded."""
    for name, value in body.items():
        rule = _CHAT_PARAMS.get(name)
        if rule is not None and value is not None and not rule[0](value):
            raise InvalidRequest(
                f"Invalid value for '{name}': expected {rule[1]}, got {value!r:.40}.", param=name
            )


Shape = tuple[int, int, int]  # server.max_messages, max_message_parts, max_tools


def check_shape(
    body: Mapping[str, object], max_messages: int, max_parts: int, max_tools: int
) -> None:
    """The shape limits of a completion request (`server.max_messages`, `max_message_parts`,
    `max_tools`): a 413 naming the limit, before anything is admitted or recorded. Within the
    body-size cap a request of many tiny messages would otherwise become as many events (and
    take seconds to validate): the handlers check the body as parsed, before its model
    validates it. A Responses body's `input` counts as its messages."""
    messages = body.get("messages", body.get("input"))
    if isinstance(messages, list):
        if len(messages) > max_messages:
            raise PayloadTooLarge(
                f"The request has {len(messages)} messages; at most {max_messages} are accepted"
                " (server.max_messages).",
                param="messages",
            )
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list) and len(content) > max_parts:
                raise PayloadTooLarge(
                    f"messages[{i}] has {len(content)} content parts; at most {max_parts} are"
                    " accepted (server.max_message_parts).",
                    param=f"messages[{i}].content",
                )
    tools = body.get("tools")
    if isinstance(tools, list) and len(tools) > max_tools:
        raise PayloadTooLarge(
            f"The request offers {len(tools)} tools; at most {max_tools} are accepted"
            " (server.max_tools).",
            param="tools",
        )


def check_output_params(body: Mapping[str, object]) -> None:
    """A chat body's parameters (`check_chat_params`), its output bounds and `n`, checked
    before anything is reserved or recorded: a reservation is computed from the bounds, so a
    negative, zero, fractional or absurd one would let a request through a budget it does not
    fit (or widen a TPM window), and two that disagree would leave it to the upstream which
    one holds."""
    check_chat_params(body)
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None and not (_whole(value) and 1 <= value <= MAX_OUTPUT_TOKENS):
            raise InvalidRequest(
                f"Invalid value for '{name}': expected a positive integer of at most"
                f" {MAX_OUTPUT_TOKENS}, got {value!r:.40}.",
                param=name,
            )
    completion, tokens = body.get("max_completion_tokens"), body.get("max_tokens")
    if completion is not None and tokens is not None and completion != tokens:
        # Forwarded both, an upstream honours one of them, and which depends on the model:
        # no reservation could know which, so neither is guessed.
        raise InvalidRequest(
            f"'max_completion_tokens' ({completion}) and 'max_tokens' ({tokens}) disagree:"
            " send one output bound ('max_completion_tokens'; 'max_tokens' is its deprecated"
            " name), or both with the same value.",
            param="max_tokens",
        )
    n = body.get("n")
    if n is not None and not (_whole(n) and 1 <= n <= MAX_CHOICES):
        raise InvalidRequest(
            f"Invalid value for 'n': expected an integer from 1 to {MAX_CHOICES}, got {n!r:.40}.",
            param="n",
        )


def choices(body: Mapping[str, object]) -> int:
    """How many choices a (checked) chat body asks for."""
    n = body.get("n")
    return n if _whole(n) and n >= 1 else 1
