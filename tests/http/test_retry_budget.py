"""One retry budget: the gateway's. An error it answers after its own retries tells the client's
SDK not to retry again (`x-should-retry: false`, which the OpenAI and Anthropic SDKs obey before
their own rules), so one call to a failing alias makes the gateway's attempts upstream and no
more. The SDK clients here keep their default retries (`max_retries=2`)."""

from __future__ import annotations

import asyncio
from typing import Any

import anthropic
import openai
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import FakeUpstream, hang_before_headers, status

QUESTION: list[Any] = [{"role": "user", "content": "What is the capital of France?"}]
BUSY = {"error": {"message": "busy", "type": "server_error", "param": None, "code": None}}
ATTEMPTS = 3  # the alias's retry.max_attempts


async def failing(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, **server: Any
) -> tuple[GatewayUnderTest, FakeUpstream]:
    """A gateway whose alias `down` has two deployments on one fake that answers only 503."""
    upstream = await make_upstream()
    upstream.push(*[status(503, BUSY) for _ in range(20)])
    gw = await make_gateway(
        models=[
            {
                "name": "down",
                "retry": {"max_attempts": ATTEMPTS, "backoff_s": 0, "max_backoff_s": 0},
                "cooldown": {"failures": 100},
                "deployments": [
                    upstream.deployment(name="first"),
                    upstream.deployment(name="second"),
                ],
            }
        ],
        server=server,
    )
    return gw, upstream


def sdk(gw: GatewayUnderTest) -> openai.AsyncOpenAI:
    """The OpenAI SDK as an application uses it: default retries."""
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key="test-key")
    assert client.max_retries == 2
    gw.clients.append(client)
    return client


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
async def test_an_openai_sdk_makes_exactly_the_gateways_attempts(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, stream: bool
) -> None:
    gw, upstream = await failing(make_gateway, make_upstream)
    with pytest.raises(openai.InternalServerError) as caught:
        await sdk(gw).chat.completions.create(model="down", messages=QUESTION, stream=stream)
    assert len(upstream.requests) == ATTEMPTS  # not ATTEMPTS * 3
    headers = caught.value.response.headers
    assert headers["x-should-retry"] == "false"
    assert headers["X-Gateway-Attempts"] == str(ATTEMPTS)
    assert caught.value.status_code == 503


async def test_an_anthropic_sdk_makes_exactly_the_gateways_attempts(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, upstream = await failing(make_gateway, make_upstream)
    client = anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key")
    assert client.max_retries == 2
    try:
        with pytest.raises(anthropic.InternalServerError) as caught:
            await client.messages.create(model="down", max_tokens=50, messages=QUESTION)
    finally:
        await client.close()
    assert len(upstream.requests) == ATTEMPTS
    assert caught.value.response.headers["x-should-retry"] == "false"


async def test_a_responses_client_makes_exactly_the_gateways_attempts(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, upstream = await failing(make_gateway, make_upstream)
    with pytest.raises(openai.InternalServerError):
        await sdk(gw).responses.create(model="down", input="Hi")
    assert len(upstream.requests) == ATTEMPTS


async def test_retry_after_is_kept(make_gateway: MakeGateway, make_upstream: MakeUpstream) -> None:
    """The upstream's `Retry-After` still reaches the client, for a retry it schedules itself;
    the SDK does not wait on it, having been told not to retry."""
    upstream = await make_upstream()
    limited = {"error": {"message": "slow down", "type": "requests", "code": "rate_limit_exceeded"}}
    upstream.push(status(429, limited, {"Retry-After": "30"}))
    gw = await make_gateway(
        models=[
            {
                "name": "limited",
                "retry": {"max_attempts": 1},
                "deployments": [upstream.deployment()],
            }
        ]
    )
    with pytest.raises(openai.RateLimitError) as caught:
        await sdk(gw).chat.completions.create(model="limited", messages=QUESTION)
    assert len(upstream.requests) == 1
    headers = caught.value.response.headers
    assert (headers["Retry-After"], headers["x-should-retry"]) == ("30", "false")


async def test_the_knob_leaves_retries_to_the_client(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, upstream = await failing(make_gateway, make_upstream, tell_clients_not_to_retry=False)
    with pytest.raises(openai.InternalServerError) as caught:
        await (
            sdk(gw)
            .with_options(max_retries=1)
            .chat.completions.create(model="down", messages=QUESTION)
        )
    assert "x-should-retry" not in caught.value.response.headers
    assert len(upstream.requests) == 2 * ATTEMPTS  # the SDK's one retry ran the plan again


async def test_errors_before_any_attempt_say_nothing(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    """Only the gateway's own retries spend the budget: an error no attempt went into (an
    unknown model) carries no `x-should-retry`."""
    gw, _ = await failing(make_gateway, make_upstream)
    client = sdk(gw)
    with pytest.raises(openai.NotFoundError) as missing:
        await client.chat.completions.create(model="nope", messages=QUESTION)
    assert "x-should-retry" not in missing.value.response.headers


async def test_a_cancelled_request_is_not_retried(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    """A non-streaming request stopped by an explicit cancel answers 409, which the SDKs would
    otherwise retry (as a lock timeout): the cancel is meant, so they are told not to."""
    upstream = await make_upstream()
    upstream.push(hang_before_headers(), hang_before_headers())
    gw = await make_gateway(upstream=upstream)
    client = openai.AsyncOpenAI(
        base_url=gw.url + "/v1", api_key="test-key", default_headers={"X-Request-Id": "stop-me"}
    )
    gw.clients.append(client)
    task = asyncio.create_task(client.chat.completions.create(model="fake", messages=QUESTION))
    await asyncio.wait_for(upstream.stalled.wait(), 5)
    assert (await gw.post("/v1/chat/completions/stop-me/cancel", {}))[0] == 200
    with pytest.raises(openai.ConflictError) as caught:
        await task
    assert caught.value.response.headers["x-should-retry"] == "false"
    assert len(upstream.requests) == 1
