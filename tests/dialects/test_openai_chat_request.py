"""The chat request's check: a body is taken or refused exactly as `ChatCompletionRequest` takes
or refuses it, whether or not the model is built for it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gateway.dialects.openai_chat import ChatCompletionRequest, parse_chat_request
from gateway.errors import InvalidRequest

USER = {"role": "user", "content": "hi"}
TOOL_CALL = {
    "role": "assistant",
    "content": None,
    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
}

BODIES: list[dict[str, Any]] = [
    {"model": "m", "messages": [USER]},
    {"model": "m", "messages": [USER], "stream": True},
    {"model": "m", "messages": [USER], "stream": None},
    {"model": "m", "messages": [USER], "stream": "true"},  # lax: the model reads it as True
    {"model": "m", "messages": [USER], "stream": 0},
    {"model": "m", "messages": [USER], "stream": [True]},
    {"model": "m", "messages": [{"role": "system", "content": "be brief"}, USER, TOOL_CALL]},
    {"model": "m", "messages": [TOOL_CALL, {"role": "tool", "tool_call_id": "c1", "content": "4"}]},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
    {"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": 3}]}]},
    {"model": "m", "messages": [{"role": "user", "content": 3}]},
    {"model": "m", "messages": [{"role": "robot", "content": "hi"}]},
    {"model": "m", "messages": [{"role": ["user"], "content": "hi"}]},
    {"model": "m", "messages": [{"content": "hi"}]},
    {"model": "m", "messages": [{"role": "user", "content": "hi", "name": 7}]},
    {"model": "m", "messages": [{"role": "user", "content": "hi", "name": "ann", "x": 1}]},
    {"model": "m", "messages": ["hi"]},
    {"model": "m", "messages": []},
    {"model": "m", "messages": {"role": "user"}},
    {"model": 3, "messages": [USER]},
    {"messages": [USER]},
    {"model": "m", "messages": [USER], "temperature": "hot", "anything": {"goes": [1]}},
]


@pytest.mark.parametrize("body", BODIES)
def test_a_body_is_taken_or_refused_as_the_model_does(body: dict[str, Any]) -> None:
    try:
        expected: bool | None = bool(ChatCompletionRequest.model_validate(body).stream)
    except ValidationError:
        expected = None
    try:
        parsed, stream = parse_chat_request(orjson.dumps(body))
    except InvalidRequest:
        assert expected is None, "refused a body the model takes"
        return
    assert expected is not None, "took a body the model refuses"
    assert stream is expected
    assert parsed == body  # forwarded as the client sent it


def test_a_refusal_names_the_field_of_the_message_at_fault() -> None:
    body = {"model": "m", "messages": [USER, TOOL_CALL, {"role": "user", "content": 3}]}
    with pytest.raises(InvalidRequest) as refused:
        parse_chat_request(orjson.dumps(body))
    assert refused.value.param == "messages[2].content"
