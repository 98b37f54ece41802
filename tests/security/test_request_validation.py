"""Every known chat parameter is type- and range-checked before anything is admitted or
recorded: a 400 naming it (docs/security.md, "Request validation")."""

from __future__ import annotations

from typing import Any

import pytest

from tests.conftest import GatewayUnderTest, MakeGateway

HI = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("temperature", "hot"),
        ("temperature", 3),
        ("top_p", -0.1),
        ("presence_penalty", 2.5),
        ("seed", 1.5),
        ("top_logprobs", 21),
        ("stream", "yes"),
        ("logprobs", 1),
        ("user", 7),
        ("stop", [1, 2]),
        ("tools", "x"),
        ("tools", ["x"]),
        ("tool_choice", 3),
        ("response_format", "json"),
        ("stream_options", True),
        ("logit_bias", []),
        ("metadata", "m"),
        ("n", 0),
        ("max_tokens", -1),
    ],
)
async def test_a_wrong_chat_parameter_is_a_400_naming_it_and_nothing_is_recorded(
    gw: GatewayUnderTest, param: str, value: Any
) -> None:
    status, body = await gw.post(
        "/v1/chat/completions", {"model": "demo", "messages": HI, param: value}
    )
    assert status == 400, body
    assert body["error"]["param"] == param
    await gw.flush()
    assert gw.query("SELECT COUNT(*) FROM turns") == [(0,)]
    assert gw.query("SELECT COUNT(*) FROM conversations") == [(0,)]


async def test_null_and_right_values_pass(gw: GatewayUnderTest) -> None:
    good = {"temperature": 0.5, "top_p": None, "stop": ["\\n"], "tools": None, "seed": 3,
            "stream": False, "logit_bias": {"50256": -100}, "metadata": {"a": "b"}}  # fmt: skip
    status, body = await gw.post("/v1/chat/completions", {"model": "demo", "messages": HI, **good})
    assert status == 200, body


async def test_the_other_dialects_are_checked_too(gw: GatewayUnderTest) -> None:
    status, body = await gw.post(
        "/v1/responses", {"model": "demo", "input": "hi", "temperature": "hot"}
    )
    assert (status, body["error"]["param"]) == (400, "temperature")
    status, body = await gw.post(
        "/v1/messages",
        {"model": "demo", "max_tokens": 10, "messages": HI, "temperature": "hot"},
    )
    assert status == 400, body
    await gw.flush()
    assert gw.query("SELECT COUNT(*) FROM turns") == [(0,)]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"messages": HI * 6}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": [
            {"type": "text", "text": "x"}] * 4}]}, "messages[0].content"),
        ("/v1/chat/completions", {"messages": HI, "tools": [
            {"type": "function", "function": {"name": f"f{i}"}} for i in range(4)]}, "tools"),
        ("/v1/responses", {"input": [{"role": "user", "content": "x"}] * 6}, "messages"),
        ("/v1/messages", {"max_tokens": 5, "messages": [
            {"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}] * 3},
         "messages"),
    ],
)  # fmt: skip
async def test_a_request_over_a_shape_limit_is_a_413_and_nothing_is_recorded(
    make_gateway: MakeGateway, path: str, body: dict[str, Any], param: str
) -> None:
    gw = await make_gateway(server={"max_messages": 5, "max_message_parts": 3, "max_tools": 3})
    status, answer = await gw.post(path, {"model": "demo", **body})
    assert status == 413, answer
    assert answer["error"].get("param", param) == param  # (Anthropic's shape has none)
    assert "server.max_" in answer["error"]["message"]
    await gw.flush()
    assert gw.query("SELECT COUNT(*) FROM turns") == [(0,)]


@pytest.mark.parametrize(
    ("param", "value"),
    [("input", [1.5]), ("input", ["a", 1]), ("input", [[]]), ("input", {}), ("user", 3),
     ("encoding_format", "hex"), ("dimensions", 0)],
)  # fmt: skip
async def test_a_wrong_embeddings_parameter_is_a_400_naming_it(
    gw: GatewayUnderTest, param: str, value: Any
) -> None:
    body = {"model": "demo", "input": "hello", param: value}
    status, answer = await gw.post("/v1/embeddings", body)
    assert (status, answer["error"]["param"]) == (400, param), answer
