"""Reservations that cover what is sent: tool definitions in the prompt estimate in every
dialect, the output bound an Anthropic deployment is really sent (a thinking budget included),
one output bound per request, and a model's own output limit where the price entry gives none.

Each overshoot is sent as 64 concurrent requests at a hard budget, against a priced fake
upstream that bills each request what it really was sent; whatever they ask, spend stays within
the budget plus one request's cost, on SQLite and on PostgreSQL with Redis.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anthropic
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.metering.prices import resolve
from gateway.metering.tokens import count_messages, count_text
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import DONE, FakeUpstream, chunk, sse
from tests.metering.budgeted import CONCURRENT, MASTER, Held, backend, budgeted_team, spent
from tests.providers.upstreams import AnthropicServer

__all__ = ["backend"]  # the fixture, run on each backend

# gpt-4o's prices, USD per token.
INPUT, OUTPUT = 2.5e-6, 10e-6
HELLO = [{"role": "user", "content": "Hello"}]


def _tool(i: int) -> dict[str, Any]:
    sentence = f"Looks up a field of table {i} and returns the record it names, as text."
    return {
        "type": "function",
        "function": {
            "name": f"lookup_{i}",
            "description": " ".join([sentence] * 12),
            "parameters": {
                "type": "object",
                "properties": {
                    f"arg{k}": {"type": "string", "description": f"Value {k} to match."}
                    for k in range(5)
                },
                "required": ["arg0"],
            },
        },
    }


TOOLS = [_tool(i) for i in range(15)]  # about 5,000 tokens


def compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def billed_prompt(body: dict[str, Any]) -> int:
    """What the fake provider bills as input: the messages, and the tools it was sent as the
    text of their JSON."""
    tools = body.get("tools")
    return count_messages(body["messages"]) + (count_text(compact(tools)) if tools else 0)


def chat_answer(
    upstream: FakeUpstream, held: Held, completion: int, prompt_of: Callable[..., int]
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """An OpenAI chat answer, streamed or whole as asked, held until every request is decided,
    reporting `prompt_of(body)` input and `completion` output tokens."""

    async def script(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        await held.arrive()
        prompt = prompt_of(body)
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }
        if not body.get("stream"):
            message = {"role": "assistant", "content": "ok"}
            return web.json_response(
                {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion",
                    "created": 1,
                    "model": upstream.model,
                    "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                    "usage": usage,
                }
            )
        response = await upstream.start_sse(request)
        await upstream.write(response, chunk("ok"))
        await upstream.write(response, chunk(finish="stop"))
        await upstream.write(
            response, sse({**upstream.chunk_object({}), "choices": [], "usage": usage})
        )
        await upstream.write(response, DONE)
        await response.write_eof()
        return response

    return script


def priced(upstream: FakeUpstream, **deployment: Any) -> list[dict[str, Any]]:
    fields = {"input_cost_per_mtok": INPUT * 1e6, "output_cost_per_mtok": OUTPUT * 1e6}
    fields.update(deployment)
    return [
        {
            "name": "fake",
            "retry": {"max_attempts": 1},
            "deployments": [upstream.deployment(**fields)],
        }
    ]


# -- tool definitions -------------------------------------------------------------------------


def anthropic_tools() -> list[dict[str, Any]]:
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in TOOLS
    ]


def responses_tools() -> list[dict[str, Any]]:
    return [{"type": "function", **t["function"]} for t in TOOLS]


Send = Callable[[GatewayUnderTest, str], Callable[[], Awaitable[None]]]


def via_chat(gw: GatewayUnderTest, key: str) -> Callable[[], Awaitable[None]]:
    api = gw.client(api_key=key)

    async def send() -> None:
        await api.chat.completions.create(
            model="fake",
            messages=HELLO,
            tools=TOOLS,
            max_tokens=10,
        )

    return send


def via_messages(gw: GatewayUnderTest, key: str) -> Callable[[], Awaitable[None]]:
    api = anthropic.AsyncAnthropic(base_url=gw.url, api_key=key, max_retries=0)

    async def send() -> None:
        await api.messages.create(
            model="fake",
            max_tokens=10,
            messages=[{"role": "user", "content": "Hello"}],
            tools=anthropic_tools(),
        )

    return send


def via_responses(gw: GatewayUnderTest, key: str) -> Callable[[], Awaitable[None]]:
    api = gw.client(api_key=key)

    async def send() -> None:
        await api.responses.create(
            model="fake",
            input="Hello",
            tools=responses_tools(),
            max_output_tokens=16,
        )

    return send


REFUSAL: dict[str, type[Exception]] = {
    "chat": openai.RateLimitError,
    "messages": anthropic.RateLimitError,
    "responses": openai.RateLimitError,
}
SENDERS: dict[str, Send] = {"chat": via_chat, "messages": via_messages, "responses": via_responses}


@pytest.mark.parametrize("dialect", ["chat", "messages", "responses"])
async def test_tool_definitions_are_reserved_in_every_dialect(
    make_gateway: MakeGateway, upstream: FakeUpstream, backend: dict[str, Any], dialect: str
) -> None:
    budget = 0.10
    gw, key = await budgeted_team(
        make_gateway, priced(upstream), {"usd": budget, "period": "day"}, **backend
    )
    held = Held()
    for _ in range(held.total):
        upstream.push(chat_answer(upstream, held, 10, billed_prompt))
    await held.run(SENDERS[dialect](gw, key), REFUSAL[dialect])
    one = billed_prompt(upstream.requests[0]) * INPUT + 10 * OUTPUT
    assert billed_prompt(upstream.requests[0]) > 4500  # the tools were sent and billed
    total = await spent(gw)
    assert total <= budget + one, f"{total:.4f} USD spent of {budget}, {held.arrived} admitted"
    assert held.refused > 0 and held.arrived > 0


async def test_a_cancelled_tool_request_is_metered_with_its_tools(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(models=priced(upstream))
    upstream.stall_after(["Hello"])
    response = await gw.client().chat.completions.with_raw_response.create(
        model="fake",
        messages=HELLO,
        tools=TOOLS,
        stream=True,
    )
    stream = response.parse()
    async for part in stream:
        if part.choices and part.choices[0].delta.content:
            break
    await stream.close()
    await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    await gw.flush()
    [(prompt, source)] = gw.query("SELECT prompt_tokens, usage_source FROM usage")
    assert source == "estimated"
    assert prompt >= count_text(compact(TOOLS)) + count_messages(HELLO)


async def test_a_cancelled_request_is_metered_with_its_output_schema(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(models=priced(upstream))
    upstream.stall_after(["{"])
    schema = {"name": "record", "schema": TOOLS[0]["function"]["parameters"], "strict": True}
    response_format = {"type": "json_schema", "json_schema": schema}
    response = await gw.client().chat.completions.with_raw_response.create(
        model="fake",
        messages=HELLO,
        response_format=response_format,  # type: ignore[arg-type]
        stream=True,
    )
    stream = response.parse()
    async for part in stream:
        if part.choices and part.choices[0].delta.content:
            break
    await stream.close()
    await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    await gw.flush()
    [(prompt,)] = gw.query("SELECT prompt_tokens FROM usage")
    assert prompt == count_text(compact(schema)) + count_messages(HELLO)


# -- the bound an Anthropic deployment is sent -----------------------------------------------------

CLAUDE_INPUT, CLAUDE_OUTPUT = 3e-6, 15e-6


@pytest.fixture
async def claude(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AnthropicServer:
    return await AnthropicServer().start(aiohttp_server)


def anthropic_answer(
    claude: AnthropicServer, held: Held
) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """A Messages answer, streamed or whole as asked, that bills all the `max_tokens` it was
    sent (as a model thinking to the end of its budget would)."""

    async def script(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        await held.arrive()
        message = {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": claude.model,
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": 20, "output_tokens": 1},
        }
        if not body.get("stream"):
            whole = {
                **message,
                "content": [{"type": "text", "text": "ok"}],
                "stop_reason": "end_turn",
                "stop_sequence": None,
                "usage": {"input_tokens": 20, "output_tokens": body["max_tokens"]},
            }
            return web.json_response(whole)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        text = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": "ok"}
        end = {"stop_reason": "end_turn", "stop_sequence": None}
        events: list[dict[str, Any]] = [
            {"type": "message_start", "message": message},
            {"type": "content_block_start", "index": 0, "content_block": text},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": end, "usage": {"output_tokens": body["max_tokens"]}},
            {"type": "message_stop"},
        ]
        for event in events:
            await response.write(claude.event(event))
        await response.write_eof()
        return response

    return script


def claude_models(claude: AnthropicServer) -> list[dict[str, Any]]:
    deployment = claude.deployment(
        input_cost_per_mtok=CLAUDE_INPUT * 1e6, output_cost_per_mtok=CLAUDE_OUTPUT * 1e6
    )
    return [{"name": "claude", "retry": {"max_attempts": 1}, "deployments": [deployment]}]


@pytest.mark.parametrize("dialect", ["chat", "responses"])
async def test_a_thinking_budget_added_upstream_is_reserved(
    make_gateway: MakeGateway, claude: AnthropicServer, backend: dict[str, Any], dialect: str
) -> None:
    budget = 0.30
    gw, key = await budgeted_team(
        make_gateway, claude_models(claude), {"usd": budget, "period": "day"}, **backend
    )
    held = Held()
    for _ in range(held.total):
        claude.push(anthropic_answer(claude, held))
    api = gw.client(api_key=key)

    async def send() -> None:
        if dialect == "chat":
            await api.chat.completions.create(
                model="claude", messages=HELLO, reasoning_effort="high", max_tokens=2000
            )
        else:
            await api.responses.create(
                model="claude", input="Hello", reasoning={"effort": "high"}, max_output_tokens=2000
            )

    await held.run(send, openai.RateLimitError)
    sent = claude.requests[0]["max_tokens"]
    assert sent == 16384 + 2000  # the thinking budget, and the client's room for the answer
    one = 20 * CLAUDE_INPUT + sent * CLAUDE_OUTPUT
    total = await spent(gw)
    assert total <= budget + one, f"{total:.4f} USD spent of {budget}, {held.arrived} admitted"
    assert held.arrived >= 1


# -- one output bound ------------------------------------------------------------------------------


async def test_two_output_bounds_that_disagree_are_refused_and_change_nothing(
    make_gateway: MakeGateway, upstream: FakeUpstream, backend: dict[str, Any]
) -> None:
    gw, key = await budgeted_team(
        make_gateway, priced(upstream), {"usd": 1, "period": "day"}, **backend
    )
    headers = {"Authorization": f"Bearer {key}"}
    body = {"model": "fake", "messages": HELLO, "max_completion_tokens": 1, "max_tokens": 3000}

    async def send(session: aiohttp.ClientSession) -> dict[str, Any]:
        async with session.post(
            gw.url + "/v1/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status == 400
            error: dict[str, Any] = (await response.json())["error"]
            return error

    async with aiohttp.ClientSession() as session:
        errors = await asyncio.gather(*(send(session) for _ in range(CONCURRENT)))
    error = errors[0]
    assert error["type"] == "invalid_request_error" and error["param"] == "max_tokens"
    assert "'max_completion_tokens' (1)" in error["message"]
    assert "'max_tokens' (3000)" in error["message"]
    held = gw.gateway.limiter.held("team", "t")
    assert (held.requests, held.reserved, held.in_flight) == (0, 0.0, 0)
    assert upstream.requests == []
    assert await spent(gw) == 0.0
    master = {"Authorization": f"Bearer {MASTER}"}
    async with (
        aiohttp.ClientSession(headers=master) as session,
        session.get(gw.url + "/v1/conversations") as response,
    ):
        assert (await response.json())["data"] == []  # nothing recorded
    # The same bound twice is one bound.
    upstream.push(chat_answer(upstream, Held(0), 5, billed_prompt))
    answer = await gw.client(api_key=key).chat.completions.create(
        model="fake", messages=HELLO, max_completion_tokens=50, max_tokens=50
    )
    assert answer.choices[0].message.content == "ok"


# -- a price without an output limit ---------------------------------------------------------------


def price_file(tmp_path: Path, entries: dict[str, Any]) -> str:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps(entries))
    return str(path)


def test_a_price_entry_without_an_output_limit_takes_the_models_from_the_map() -> None:
    entry = {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-5}
    from_file = resolve("gpt-4o-mini", "openai", file={"gpt-4o-mini": entry}).price
    from_config = resolve("gpt-4o-mini", "openai", override=entry).price
    assert from_file is not None and from_config is not None
    assert from_file.max_output_tokens == from_config.max_output_tokens == 16_384
    own = resolve("gpt-4o-mini", "openai", override={**entry, "max_output_tokens": 500}).price
    assert own is not None and own.max_output_tokens == 500  # the entry's own comes first
    unknown = resolve("house-model", "openai", file={"house-model": entry}).price
    assert unknown is not None and unknown.max_output_tokens is None


async def test_an_unbounded_request_reserves_the_models_output_limit(
    make_gateway: MakeGateway,
    upstream: FakeUpstream,
    backend: dict[str, Any],
    tmp_path: Path,
) -> None:
    entry = {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-5}
    prices = price_file(tmp_path, {"gpt-4o-mini": entry})
    models = [
        {
            "name": "fake",
            "retry": {"max_attempts": 1},
            "deployments": [upstream.deployment(model="gpt-4o-mini")],
        }
    ]
    budget = 1.0
    gw, key = await budgeted_team(
        make_gateway, models, {"usd": budget, "period": "day"}, prices=prices, **backend
    )
    held = Held()
    for _ in range(held.total):
        upstream.push(chat_answer(upstream, held, 2000, lambda body: 10))
    api = gw.client(api_key=key)

    async def send() -> None:
        stream = await api.chat.completions.create(model="fake", messages=HELLO, stream=True)
        async for _ in stream:
            pass

    await held.run(send, openai.RateLimitError)
    one = 10 * 1e-6 + 2000 * 1e-5
    total = await spent(gw)
    assert total <= budget + one, f"{total:.4f} USD spent of {budget}, {held.arrived} admitted"
    assert held.arrived >= 1 and held.refused > 0


async def test_an_unbounded_request_without_a_known_limit_is_refused_under_a_hard_budget(
    make_gateway: MakeGateway, upstream: FakeUpstream, tmp_path: Path
) -> None:
    entry = {"input_cost_per_token": 1e-6, "output_cost_per_token": 1e-5}
    prices = price_file(tmp_path, {"house-model": entry})
    models = [{"name": "fake", "deployments": [upstream.deployment(model="house-model")]}]
    gw, key = await budgeted_team(make_gateway, models, {"usd": 1, "period": "day"}, prices=prices)
    api = gw.client(api_key=key)
    with pytest.raises(openai.PermissionDeniedError) as caught:
        await api.chat.completions.create(model="fake", messages=HELLO)
    assert caught.value.code == "price_unknown"
    assert "'house-model'" in caught.value.message and "max_output_tokens" in caught.value.message
    assert upstream.requests == []
    # A bound of its own: admitted.
    upstream.push(chat_answer(upstream, Held(0), 5, billed_prompt))
    answer = await api.chat.completions.create(model="fake", messages=HELLO, max_tokens=100)
    assert answer.choices[0].message.content == "ok"
