"""A provider's usage report is input like any other: a negative, non-numeric or absurd count
is clamped (the gateway's estimate in its place) and flagged (`usage_source:
"provider_clamped"`, `gateway_usage_clamped_total`), never lowers a budget's spend, and the
turn still ends, its reservation released, its answer well-formed, streamed or not."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.metering.prices import Price
from gateway.metering.usage import Meter, UsageRecord, checked_counts
from gateway.metrics import REGISTRY
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import DONE, FakeUpstream, chunk, sse
from tests.http.openai_api import wav
from tests.http.test_media_endpoints import request_log, sdk
from tests.http.test_media_endpoints import setup as media_setup
from tests.metering.budgeted import budgeted_team
from tests.providers.upstreams import AnthropicServer

INPUT, OUTPUT = 1e-6, 5e-6
HELLO = [{"role": "user", "content": "Hello"}]
WRONG: dict[str, tuple[dict[str, Any], str]] = {
    # -100 USD of input, as the provider would have it.
    "negative": (
        {"prompt_tokens": -100_000_000, "completion_tokens": -3, "total_tokens": -100_000_003},
        "prompt_tokens",
    ),
    "non-numeric": ({"prompt_tokens": "many", "completion_tokens": 2}, "prompt_tokens"),
    "absurd": ({"prompt_tokens": 5, "completion_tokens": 10**15}, "completion_tokens"),
}


def clamped(field: str) -> float:
    labels = {"deployment": "fake/0-openai", "field": field}
    return REGISTRY.get_sample_value("gateway_usage_clamped_total", labels) or 0.0


def answer_with(upstream: FakeUpstream, usage: dict[str, Any]) -> Any:
    """ "Hello there", streamed or whole as asked, reporting `usage`."""

    async def script(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            message = {"role": "assistant", "content": "Hello there"}
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
        for frame in (
            chunk("Hello"),
            chunk(" there"),
            chunk(finish="stop"),
            sse({**upstream.chunk_object({}), "choices": [], "usage": usage}),
            DONE,
        ):
            await upstream.write(response, frame)
        await response.write_eof()
        return response

    return script


async def post(
    gw: GatewayUnderTest, key: str, body: dict[str, Any]
) -> tuple[int, bytes, str | None]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        return response.status, await response.read(), response.headers.get("X-Conversation-Id")


def content_of(raw: bytes, stream: bool) -> str:
    """The answer's text, from a body that must be all well-formed: a whole completion, or SSE
    frames of chunks ending in [DONE] and nothing else."""
    if not stream:
        return str(json.loads(raw)["choices"][0]["message"]["content"])
    frames = raw.decode().split("\n\n")
    assert frames[-1] == "" and frames[-2] == "data: [DONE]", raw[-200:]
    text = ""
    for frame in frames[:-2]:
        assert frame.startswith("data: "), frame
        part = json.loads(frame[6:])
        assert part["object"] == "chat.completion.chunk"
        if part["choices"]:
            text += part["choices"][0]["delta"].get("content") or ""
    return text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("case", list(WRONG))
async def test_wrong_usage_is_clamped_flagged_and_the_turn_ends(
    make_gateway: MakeGateway, upstream: FakeUpstream, case: str, stream: bool
) -> None:
    usage, field = WRONG[case]
    deployment = upstream.deployment(
        input_cost_per_mtok=INPUT * 1e6, output_cost_per_mtok=OUTPUT * 1e6
    )
    models = [{"name": "fake", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    gw, key = await budgeted_team(make_gateway, models, {"usd": 1, "period": "day"})
    before = clamped(field)
    upstream.push(answer_with(upstream, usage))
    body: dict[str, Any] = {"model": "fake", "messages": HELLO, "max_tokens": 50}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    status, raw, conversation_id = await post(gw, key, body)
    assert status == 200, raw
    assert content_of(raw, stream) == "Hello there"
    assert conversation_id is not None
    events = await gw.wait_turn_end(conversation_id)
    end = events[-1]["payload"]
    assert end["status"] == "completed"
    assert end["metered"]["usage_source"] == "provider_clamped"
    await gw.flush()
    [(prompt, completion, cost, source)] = gw.query(
        "SELECT prompt_tokens, completion_tokens, cost_usd, usage_source FROM usage"
    )
    assert source == "provider_clamped"
    assert 0 < prompt < 1000 and 0 < completion <= 50  # the gateway's estimates
    assert 0 < cost == pytest.approx(prompt * INPUT + completion * OUTPUT)
    assert clamped(field) == before + 1
    held = gw.gateway.limiter.held("team", "t")
    assert (held.in_flight, held.reserved) == (0, 0.0)  # the reservation is released
    assert held.spent == pytest.approx(cost)
    # What a restarted gateway reads as spent: never less than nothing.
    assert await gw.gateway.usage.spent("team", "t", 0.0) == pytest.approx(cost)


async def test_a_negative_cost_row_never_lowers_the_spend_read_back(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    """A row of negative cost already in the store (a provider's count recorded as it came)
    gives the budget nothing back when spend is read at start."""
    deployment = upstream.deployment(
        input_cost_per_mtok=INPUT * 1e6, output_cost_per_mtok=OUTPUT * 1e6
    )
    models = [{"name": "fake", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    gw, key = await budgeted_team(make_gateway, models, {"usd": 1, "period": "day"})
    upstream.push(answer_with(upstream, {"prompt_tokens": 10, "completion_tokens": 2}))
    status, _, _ = await post(gw, key, {"model": "fake", "messages": HELLO, "max_tokens": 5})
    assert status == 200
    await gw.flush()
    assert await gw.gateway.usage.spent("team", "t", 0.0) > 0
    gw.query("UPDATE usage SET cost_usd = -100")
    assert await gw.gateway.usage.spent("team", "t", 0.0) == 0.0


@pytest.fixture
async def claude(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AnthropicServer:
    return await AnthropicServer().start(aiohttp_server)


async def test_wrong_usage_on_the_anthropic_wire_is_clamped_too(
    make_gateway: MakeGateway, claude: AnthropicServer
) -> None:
    deployment = claude.deployment(input_cost_per_mtok=3, output_cost_per_mtok=15)
    models = [{"name": "claude", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    gw, key = await budgeted_team(make_gateway, models, {"usd": 1, "period": "day"})
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": claude.model,
               "content": [], "stop_reason": None,
               "usage": {"input_tokens": -40_000_000, "output_tokens": 1}}  # fmt: skip
    text = {"type": "text", "text": ""}
    delta = {"type": "text_delta", "text": "Hello there"}
    end = {"stop_reason": "end_turn", "stop_sequence": None}
    events: list[dict[str, Any]] = [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": text},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": end, "usage": {"output_tokens": "lots"}},
        {"type": "message_stop"},
    ]

    async def script(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events:
            await response.write(claude.event(event))
        await response.write_eof()
        return response

    claude.push(script)
    body = {"model": "claude", "messages": HELLO, "max_tokens": 50, "stream": True}
    status, raw, conversation_id = await post(gw, key, body)
    assert status == 200
    assert content_of(raw, stream=True) == "Hello there"
    assert conversation_id is not None
    events_recorded = await gw.wait_turn_end(conversation_id)
    assert events_recorded[-1]["payload"]["status"] == "completed"
    await gw.flush()
    [(prompt, completion, cost, source)] = gw.query(
        "SELECT prompt_tokens, completion_tokens, cost_usd, usage_source FROM usage"
    )
    assert source == "provider_clamped"
    assert 0 < prompt < 1000 and 0 < completion <= 50 and cost > 0
    held = gw.gateway.limiter.held("team", "t")
    assert (held.in_flight, held.reserved) == (0, 0.0)


def test_a_turn_closed_from_its_checkpoint_clamps_the_same() -> None:
    """A turn a dead process left is metered from its checkpoint: a wrong count there is
    clamped and flagged as at a turn's own end."""
    rows: list[UsageRecord] = []
    price = Price(input=INPUT, output=OUTPUT)
    meter = Meter(lambda deployment, model: price, rows.append)
    before = clamped("prompt_tokens")
    attempt = {
        "number": 1,
        "route": {"provider": "openai", "deployment": "fake/0-openai", "model": "fake-model"},
        "outcome": "completed",
        "usage": {"prompt_tokens": -5_000_000, "completion_tokens": 4},
        "first_token_ms": 1.0,
        "duration_ms": 2.0,
        "prompt_tokens": 12,  # the tokenizer's count, kept with the checkpoint
    }
    checkpoint = {"message": None, "attempts": [attempt], "team_id": "t", "key_id": "k",
                  "user": None, "alias": "fake"}  # fmt: skip
    totals = meter.recovered("turn_1", "conv_1", checkpoint)
    [row] = rows
    assert (row.prompt_tokens, row.completion_tokens) == (12, 4)
    assert row.usage_source == totals["usage_source"] == "provider_clamped"
    assert row.cost_usd == pytest.approx(12 * INPUT + 4 * OUTPUT)
    assert clamped("prompt_tokens") == before + 1


@pytest.mark.parametrize(
    ("usage", "wrong"),
    [
        ({"prompt_tokens": 10, "completion_tokens": 5}, ()),
        ({"prompt_tokens": 10.0, "completion_tokens": 5}, ()),  # a whole number, as a float
        ({"prompt_tokens": 10, "completion_tokens": True}, ("completion_tokens",)),
        ({"prompt_tokens": float("nan"), "completion_tokens": 5}, ("prompt_tokens",)),
        ({"prompt_tokens": 10, "completion_tokens": 5.5}, ("completion_tokens",)),
        (
            {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -8}},
            ("prompt_tokens_details.cached_tokens",),
        ),
    ],
)
def test_what_counts_as_a_count(usage: dict[str, Any], wrong: tuple[str, ...]) -> None:
    checked = checked_counts(usage)
    assert checked.wrong == wrong
    assert min(checked.counts) >= 0


async def test_a_negative_audio_length_is_read_from_the_file_instead(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    gw, api, red, _ = await media_setup(make_gateway, aiohttp_server)
    api.usage = {"type": "duration", "seconds": -30}
    text = await sdk(gw, red).audio.transcriptions.create(model="stt", file=("clip.wav", wav(2.5)))
    assert text.text == "hello there"
    await gw.flush()
    [row] = await request_log(gw, red)
    assert row["units"] == {"seconds": 2.5} and row["usage_source"] == "estimated"
    assert row["cost_usd"] == pytest.approx(2.5 * 0.0001)  # whisper-1
