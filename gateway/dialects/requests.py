"""Reading a JSON request body into a pydantic model: one error shape for every endpoint.

A bad body is a 400 `invalid_request_error` whose `param` names the field the way OpenAI does
(`messages[0].role`), whichever dialect or admin endpoint received it.
"""

from __future__ import annotations

from typing import Any, TypeVar

import orjson
from pydantic import BaseModel, ValidationError

from gateway.errors import InvalidRequest

M = TypeVar("M", bound=BaseModel)


def parse_json_object(raw: bytes) -> dict[str, Any]:
    if not raw:
        raise InvalidRequest("The request body is empty; expected a JSON object.")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequest(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequest("The request body must be a JSON object.")
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
