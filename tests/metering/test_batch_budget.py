"""A batch is admitted against its team's budget when it is created, at the most its requests
may cost: 64 batches created at once against a hard budget spend, once run and billed, no more
than the budget and one batch's cost, on SQLite and on PostgreSQL with Redis; a batch that
could not be priced under a hard budget is refused before it reaches the provider."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from gateway.metering.tokens import count_messages
from tests.conftest import MakeGateway
from tests.http.openai_api import OpenAIAPI
from tests.metering.budgeted import CONCURRENT, backend, budgeted_team, spent

__all__ = ["backend"]  # the fixture, run on each backend

MakeServer = Callable[..., Awaitable[TestServer]]
# gpt-4o-mini's batch prices, USD per token: half its own.
BATCH_INPUT, BATCH_OUTPUT = 7.5e-08, 3e-07
BOUND = 1000  # each request's max_tokens


def requests(count: int = 3, bound: int | None = BOUND) -> list[dict[str, Any]]:
    return [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "gpt",
                "messages": [{"role": "user", "content": f"Question {i}: what is a lighthouse?"}],
                **({"max_tokens": bound} if bound is not None else {}),
            },
        }
        for i in range(count)
    ]


def batch_file(lines: list[dict[str, Any]]) -> bytes:
    return "\n".join(json.dumps(line) for line in lines).encode()


async def test_batches_created_at_once_stay_within_a_hard_budget(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, backend: dict[str, Any]
) -> None:
    api = await OpenAIAPI().start(aiohttp_server)
    models = [{"name": "gpt", "deployments": [api.deployment("gpt-4o-mini")]}]
    budget = 0.01
    gw, key = await budgeted_team(make_gateway, models, {"usd": budget, "period": "day"}, **backend)
    client = gw.client(api_key=key)
    lines = requests()
    uploaded = await client.files.create(file=("b.jsonl", batch_file(lines)), purpose="batch")

    async def create() -> str:
        try:
            batch = await client.batches.create(
                input_file_id=uploaded.id,
                endpoint="/v1/chat/completions",
                completion_window="24h",
            )
        except openai.RateLimitError as refused:
            assert refused.code == "budget_exceeded"
            return "refused"
        return batch.id

    outcomes = await asyncio.gather(*(create() for _ in range(CONCURRENT)))
    created = [o for o in outcomes if o != "refused"]
    assert created and len(created) < CONCURRENT
    assert sorted(created) == sorted(api.batches)  # a refused one never reached the provider
    # Each batch runs to the most it was allowed: every request's prompt and its whole bound.
    prompt = count_messages(lines[0]["body"]["messages"])
    for batch_id in created:
        api.complete(batch_id, prompt=prompt, completion=BOUND)
        assert (await client.batches.retrieve(batch_id)).status == "completed"
    one = len(lines) * (prompt * BATCH_INPUT + BOUND * BATCH_OUTPUT)
    total = await spent(gw)
    assert total == pytest.approx(len(created) * one)  # billed as run, not as estimated
    assert total <= budget + one, f"{total:.6f} USD spent of {budget}, {len(created)} batches"


async def test_a_batch_that_cannot_be_bounded_is_refused_under_a_hard_budget(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    api = await OpenAIAPI().start(aiohttp_server)
    price = {"input_cost_per_token": 1e-6, "output_cost_per_token": 2e-6}
    models = [{"name": "gpt", "deployments": [{**api.deployment("house-model"), "price": price}]}]
    gw, key = await budgeted_team(make_gateway, models, {"usd": 1, "period": "day"})
    client = gw.client(api_key=key)
    unbounded = await client.files.create(
        file=("b.jsonl", batch_file(requests(bound=None))), purpose="batch"
    )
    with pytest.raises(openai.PermissionDeniedError) as caught:
        await client.batches.create(
            input_file_id=unbounded.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
    assert caught.value.code == "price_unknown" and "3 of this batch's requests" in str(
        caught.value.message
    )
    assert api.batches == {}
    # Bounded, it is admitted.
    bounded = await client.files.create(file=("b.jsonl", batch_file(requests())), purpose="batch")
    await client.batches.create(
        input_file_id=bounded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert len(api.batches) == 1
