"""Reading a JSON request body into a pydantic model: one error shape for every endpoint.

A bad body is a 400 `invalid_request_error` whose `param` names the field the way OpenAI does
(`messages[0].role`), whichever dialect or admin endpoint received it.
"""

from __future__ import annotations

from typing import Any, TypeGuard, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidRequest

M = TypeVar("M", bound=BaseModel)

# orjson reads JSON nested up to 1024 levels deep but writes at most 254, and the gateway writes
# every body again (forwarded upstream, recorded inside its own envelopes): a body nested deeper
# than it can write used to fail later as a 500. Bodies deeper than this are refused up front.
MAX_JSON_DEPTH = 128
_ORJSON_MAX_DEPTH = 254


def _too_deep(body: Any) -> bool:
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


def validated(model: type[M], body: dict[str, Any]) -> M:
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


def _whole(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def check_output_params(body: dict[str, Any]) -> None:
    """A chat body's output bounds and `n`, checked before anything is reserved or recorded:
    a reservation is computed from them, so a negative, zero, fractional or absurd one would
    let a request through a budget it does not fit (or widen a TPM window)."""
    for name in ("max_completion_tokens", "max_tokens"):
        value = body.get(name)
        if value is not None and not (_whole(value) and 1 <= value <= MAX_OUTPUT_TOKENS):
            raise InvalidRequest(
                f"Invalid value for '{name}': expected a positive integer of at most"
                f" {MAX_OUTPUT_TOKENS}, got {value!r:.40}.",
                param=name,
            )
    n = body.get("n")
    if n is not None and not (_whole(n) and 1 <= n <= MAX_CHOICES):
        raise InvalidRequest(
            f"Invalid value for 'n': expected an integer from 1 to {MAX_CHOICES}, got {n!r:.40}.",
            param="n",
        )


def output_bound(body: dict[str, Any]) -> int | None:
    """The most output tokens a (checked) chat body allows per choice, if it names a bound."""
    bound = body.get("max_completion_tokens") or body.get("max_tokens")
    return bound if _whole(bound) else None


def choices(body: dict[str, Any]) -> int:
    """How many choices a (checked) chat body asks for."""
    n = body.get("n")
    return n if _whole(n) and n >= 1 else 1
