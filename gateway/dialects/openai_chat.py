"""The OpenAI Chat Completions request, as clients send it.

The request is validated by a pydantic model but forwarded as the client's own JSON object, so
fields this gateway does not know (new OpenAI parameters, provider extensions) pass through.
"""

from __future__ import annotations

from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gateway.errors import InvalidRequest


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")

    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Any = None


class ChatCompletionRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str = Field(description="A model alias from the gateway's config.")
    messages: list[ChatMessage] = Field(min_length=1)
    stream: bool | None = False


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


def _param(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_chat_request(raw: bytes) -> tuple[dict[str, Any], ChatCompletionRequest]:
    body = parse_json_object(raw)
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _param(tuple(first["loc"]))
        if first["type"] == "missing":
            raise InvalidRequest(f"Missing required parameter: '{param}'.", param=param) from None
        raise InvalidRequest(f"Invalid value for '{param}': {first['msg']}.", param=param) from None
    return body, request
