"""Reading a request body: nesting is bounded exactly, however the check is short-cut."""

from __future__ import annotations

import json

import pytest

from gateway.dialects.requests import MAX_JSON_DEPTH, parse_json_object
from gateway.errors import InvalidRequest


def nested(depth: int) -> bytes:
    """A body whose deepest value sits `depth` levels down (the body itself is level 1)."""
    value: object = "leaf"
    for _ in range(depth - 1):
        value = [value]
    return json.dumps({"model": "m", "x": value}).encode()


def test_a_body_at_the_depth_limit_is_read() -> None:
    assert parse_json_object(nested(MAX_JSON_DEPTH))["model"] == "m"


def test_one_level_deeper_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="nested more than"):
        parse_json_object(nested(MAX_JSON_DEPTH + 1))


def test_many_brackets_that_are_not_deep_are_read() -> None:
    # More brackets than the limit, side by side: the cheap count says "maybe", the check "no".
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}] * 300}).encode()
    assert len(parse_json_object(body)["messages"]) == 300


def test_brackets_inside_strings_do_not_make_a_body_deep() -> None:
    body = json.dumps({"content": "[" * 500 + "{" * 500}).encode()
    assert parse_json_object(body)["content"].startswith("[[")
