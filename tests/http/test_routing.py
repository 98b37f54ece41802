"""Routing across several fake upstreams: fallbacks, retries, Retry-After, cooldowns, timeouts."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import openai
import pytest

from gateway import metrics
from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import FAILED_TURN, FakeUpstream, chunk, completion, frames, status

QUESTION = [{"role": "user", "content": "Route me."}]
TEXT = "The capital of the UK is London."
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05}


def deployment(fake: FakeUpstream, name: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "openai", "api_base": fake.url, "name": name, "model": name, **extra}


async def two(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, **alias: Any
) -> tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]:
    a, b = await make_upstream(), await make_upstream()
    deployments = alias.pop("deployments", [deployment(a, "a"), deployment(b, "b")])
    gw = await make_gateway(
        models=[{"name": "m", "deployments": deployments, "retry": FAST, **alias}]
    )
    return gw, a, b


async def stream_text(gw: GatewayUnderTest) -> tuple[str, Any]:
    response = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in response.parse() if c.choices])
    return text, response.headers


async def deployments(gw: GatewayUnderTest) -> dict[str, dict[str, Any]]:
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/v1/gateway/deployments") as response:
            return {d["name"]: d for d in (await response.json())["data"]}


@pytest.mark.parametrize(
    "failure",
    [
        status(500, {"error": {"message": "boom", "type": "server_error"}}),
        status(429, {"error": {"message": "slow down", "type": "rate_limit_error"}}),
        status(503, "<html>Service Unavailable</html>"),
        frames(then="end"),  # a 200 stream that ends before any content
        frames(chunk(""), then="reset"),  # cut before its first content chunk
    ],
)
async def test_falls_back_on_retryable_failures(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, failure: Any
) -> None:
    gw, a, _b = await two(make_gateway, make_upstream)
    a.push(failure)
    text, headers = await stream_text(gw)
    assert text == TEXT
    assert headers["X-Gateway-Deployment"] == "b"
    assert headers["X-Gateway-Attempts"] == "2"
    events = await gw.wait_turn_end(headers["X-Conversation-Id"])
    assert [e["type"] for e in events] == [
        "user/message",
        "assistant/attempt",
        "request/error",
        "assistant/message",
        "turn/end",
    ]
    assert events[1]["payload"]["route"]["deployment"] == "a"
    assert events[3]["payload"]["route"]["deployment"] == "b"
    assert events[3]["payload"]["content"] == [{"type": "text", "text": TEXT}]


async def test_falls_back_when_the_upstream_refuses_connections(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    b = await make_upstream()
    dead = {"provider": "openai", "api_base": "http://127.0.0.1:9/v1", "name": "dead"}
    gw, _, _ = await two(make_gateway, make_upstream, deployments=[dead, deployment(b, "b")])
    text, headers = await stream_text(gw)
    assert (text, headers["X-Gateway-Deployment"]) == (TEXT, "b")


async def test_first_token_timeout_falls_back(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    a, b = await make_upstream(), await make_upstream()
    slow = deployment(a, "a", timeouts={"first_token_s": 0.3})
    gw, _, _ = await two(make_gateway, make_upstream, deployments=[slow, deployment(b, "b")])
    a.push(frames(chunk(""), then="stall"))  # headers and an empty chunk, then nothing
    text, headers = await stream_text(gw)
    assert (text, headers["X-Gateway-Deployment"]) == (TEXT, "b")
    await asyncio.wait_for(a.disconnected.wait(), 5)  # the stalled upstream was closed
    events = await gw.wait_turn_end(headers["X-Conversation-Id"])
    assert events[2]["payload"]["code"] == "upstream_timeout_first_token"


async def test_no_retry_after_the_first_delivered_byte(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, b = await two(make_gateway, make_upstream)
    a.push(frames(chunk("Half "), then="reset"))
    body, conversation_id = await gw.post_stream(
        {"model": "m", "messages": QUESTION, "stream": True}
    )
    assert body.startswith(chunk("Half "))
    assert b'data: {"error":' in body
    assert b.requests == []  # never asked: its answer would repeat what the user saw
    events = await gw.wait_turn_end(conversation_id)
    assert [e["type"] for e in events] == FAILED_TURN


async def test_client_errors_are_not_retried(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, b = await two(make_gateway, make_upstream)
    a.push(
        status(
            400,
            {
                "error": {
                    "message": "bad temperature",
                    "type": "invalid_request_error",
                    "param": "temperature",
                }
            },
        )
    )
    with pytest.raises(openai.BadRequestError) as caught:
        await gw.client().chat.completions.create(model="m", messages=QUESTION)
    assert caught.value.body == {
        "message": "bad temperature",
        "type": "invalid_request_error",
        "param": "temperature",
    }
    assert b.requests == []
    assert (await deployments(gw))["a"]["state"] == "healthy"  # the client's mistake


async def test_retry_after_is_honoured(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    a = await make_upstream()
    gw, _, _ = await two(make_gateway, make_upstream, deployments=[deployment(a, "a")])
    a.push(
        status(
            429,
            {"error": {"message": "later", "type": "rate_limit_error"}},
            headers={"Retry-After": "0.4"},
        )
    )
    text, headers = await stream_text(gw)
    assert (text, headers["X-Gateway-Attempts"]) == (TEXT, "2")
    assert a.request_times[1] - a.request_times[0] >= 0.4


async def test_a_retry_after_beyond_the_cap_is_not_waited_for(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    a = await make_upstream()
    gw, _, _ = await two(make_gateway, make_upstream, deployments=[deployment(a, "a")])
    a.push(
        status(
            429,
            {"error": {"message": "tomorrow", "type": "rate_limit_error"}},
            headers={"Retry-After": "3600"},
        )
    )
    with pytest.raises(openai.RateLimitError) as caught:
        await gw.client().chat.completions.create(model="m", messages=QUESTION)
    assert caught.value.response.headers["Retry-After"] == "3600"
    assert len(a.requests) == 1


async def test_cooldown_then_half_open_probe(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, _b = await two(
        make_gateway,
        make_upstream,
        cooldown={"failures": 2, "window_s": 60, "cooldown_s": 0.3},
        retry={**FAST, "max_attempts": 2},
    )

    def transitions(state: str) -> float:
        labels = {"deployment": "a", "state": state}
        value = metrics.REGISTRY.get_sample_value("gateway_deployment_transitions_total", labels)
        return value or 0.0

    before = {state: transitions(state) for state in ("cooling", "half_open")}
    boom = status(500, {"error": {"message": "boom", "type": "server_error"}})
    a.push(boom, boom)
    for _ in range(2):
        _, headers = await stream_text(gw)
        assert headers["X-Gateway-Deployment"] == "b"
    assert (await deployments(gw))["a"]["state"] == "cooling"
    # While cooling, a is skipped: b answers at once.
    _, headers = await stream_text(gw)
    assert (headers["X-Gateway-Deployment"], headers["X-Gateway-Attempts"]) == ("b", "1")
    assert len(a.requests) == 2
    # After the cooldown one request probes a; its success makes a healthy again.
    async with asyncio.timeout(5):
        while (await deployments(gw))["a"]["state"] != "half_open":
            await asyncio.sleep(0.05)
    _text, headers = await stream_text(gw)
    assert headers["X-Gateway-Deployment"] == "a"
    state = (await deployments(gw))["a"]
    assert state["state"] == "healthy"
    assert len(a.requests) == 3
    # Each transition counted once (the metric is the process's: other tests' counts stay).
    assert {state: transitions(state) - n for state, n in before.items()} == {
        "cooling": 1.0,
        "half_open": 1.0,
    }
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/metrics") as response:
            exported = await response.text()
    assert 'gateway_deployment_transitions_total{deployment="a",state="cooling"}' in exported


async def test_a_failed_probe_cools_down_again(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, _b = await two(
        make_gateway, make_upstream, cooldown={"failures": 1, "window_s": 60, "cooldown_s": 0.2}
    )
    boom = status(500, {"error": {"message": "boom", "type": "server_error"}})
    a.push(boom, boom)
    await stream_text(gw)
    async with asyncio.timeout(5):
        while (await deployments(gw))["a"]["state"] != "half_open":
            await asyncio.sleep(0.05)
    _, headers = await stream_text(gw)
    assert headers["X-Gateway-Deployment"] == "b"
    assert (await deployments(gw))["a"]["state"] == "cooling"


async def test_idle_timeout_ends_a_stalled_stream(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    a = await make_upstream()
    gw, _, _ = await two(
        make_gateway, make_upstream, deployments=[deployment(a, "a", timeouts={"idle_s": 0.3})]
    )
    a.push(frames(chunk("Started "), then="stall"))
    body, conversation_id = await gw.post_stream(
        {"model": "m", "messages": QUESTION, "stream": True}
    )
    assert body.startswith(chunk("Started "))
    assert b'"code":"upstream_timeout_idle"' in body
    await asyncio.wait_for(a.disconnected.wait(), 5)
    events = await gw.wait_turn_end(conversation_id)
    assert events[2]["payload"]["code"] == "upstream_timeout_idle"
    assert events[3]["payload"]["reason"] == "timeout"


async def test_alias_fallbacks_chain(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    a, b = await make_upstream(), await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "deployments": [deployment(a, "a")],
                "fallbacks": ["backup"],
                "retry": FAST,
            },
            {"name": "backup", "deployments": [deployment(b, "b")]},
        ]
    )
    a.push(status(503, {"error": {"message": "down", "type": "server_error"}}))
    text, headers = await stream_text(gw)
    assert (text, headers["X-Gateway-Deployment"]) == (TEXT, "b")
    assert b.requests[0]["model"] == "b"


async def test_non_streaming_falls_back_too(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, a, b = await two(make_gateway, make_upstream)
    a.push(status(502, "bad gateway"))
    b.push(completion("fine"))
    result = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION
    )
    assert result.parse().choices[0].message.content == "fine"
    assert result.headers["X-Gateway-Deployment"] == "b"


async def test_weighted_traffic_split_over_many_requests(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    a, b = await make_upstream(), await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "strategy": "weighted",
                "deployments": [deployment(a, "a", weight=3), deployment(b, "b", weight=1)],
            }
        ]
    )
    client = gw.client()
    for _ in range(200):
        stream = await client.chat.completions.create(model="m", messages=QUESTION, stream=True)
        async for _ in stream:
            pass
    share = len(a.requests) / 200
    assert len(a.requests) + len(b.requests) == 200
    assert 0.65 <= share <= 0.85  # 3:1 within tolerance (p < 1e-4 of falling outside by chance)
