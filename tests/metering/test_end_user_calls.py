"""API calls that are no turn (embeddings, images, audio, moderations, rerank) are admitted and
metered by the same end user as a turn: the key's own user, else the request's `user`, else
the header `limits.end_user_header` names; its `end_user` limits and budgets hold against them
and their usage rows name it. File and batch calls name theirs too, and a batch's requests are
billed to the end user each names."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream
from tests.http.openai_api import OpenAIAPI
from tests.metering.budgeted import MASTER

IMAGE = 0.011  # gpt-image-1, one low-quality 1024 x 1024 image
ALICE, BOB = {"X-End-User": "alice"}, {"X-End-User": "bob"}


async def gateway(
    make_gateway: MakeGateway,
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    end_user: dict[str, Any],
    api: OpenAIAPI | None = None,
) -> tuple[GatewayUnderTest, openai.AsyncOpenAI]:
    """Images, embeddings, files and batches (of `api`, else a new fake OpenAI API) for a key of
    team `t`, whose end users have these limits each."""
    api = api or await OpenAIAPI().start(aiohttp_server)
    upstream = await FakeUpstream().start(aiohttp_server)
    embeddings = upstream.deployment(input_cost_per_mtok=0.02, output_cost_per_mtok=0)
    gw = await make_gateway(
        models=[
            {"name": "img", "deployments": [api.deployment("gpt-image-1")]},
            {"name": "e", "deployments": [embeddings]},
            {"name": "gpt", "deployments": [api.deployment("gpt-4o-mini")]},
        ],
        auth={"master_key": MASTER},
        limits={"end_user_header": "X-End-User"},
    )
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {MASTER}"}) as session:
        team = {"id": "t", "name": "T", "limits": {"end_user": end_user}}
        async with session.post(gw.url + "/v1/gateway/teams", json=team) as r:
            assert r.status == 201, await r.text()
        async with session.post(gw.url + "/v1/gateway/keys", json={"team_id": "t"}) as r:
            assert r.status == 201, await r.text()
            key: str = (await r.json())["key"]
    return gw, gw.client(api_key=key)


async def image(client: openai.AsyncOpenAI, headers: dict[str, str]) -> Any:
    return await client.images.generate(
        model="img", prompt="a lighthouse", size="1024x1024", quality="low", extra_headers=headers
    )


async def test_an_end_users_budget_named_by_the_header_holds_for_images(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    budget = {"usd": 1.5 * IMAGE, "period": "day"}
    gw, client = await gateway(make_gateway, aiohttp_server, {"budget": budget})
    await image(client, ALICE)
    with pytest.raises(openai.RateLimitError) as caught:
        await image(client, ALICE)  # a second image would pass alice's budget
    assert caught.value.code == "budget_exceeded" and "team.user" in caught.value.message
    await image(client, BOB)  # bob's budget is his own
    await gw.flush()
    spent = await gw.gateway.usage.spent("team.user", "t:alice", 0.0)
    assert spent == pytest.approx(IMAGE)
    rows = gw.query('SELECT "user", endpoint FROM usage ORDER BY created_at')
    assert rows == [("alice", "images.generations"), ("bob", "images.generations")]


async def test_an_end_users_rate_limit_named_by_the_header_holds_for_embeddings(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    gw, client = await gateway(make_gateway, aiohttp_server, {"rpm": 1})
    await client.embeddings.create(model="e", input="hi", extra_headers=ALICE)
    with pytest.raises(openai.RateLimitError) as caught:
        await client.embeddings.create(model="e", input="hi", extra_headers=ALICE)
    assert caught.value.code == "rate_limit_exceeded"
    await client.embeddings.create(model="e", input="hi", extra_headers=BOB)
    # The request's own `user` comes before the header, as for a turn.
    await client.embeddings.create(model="e", input="hi", user="carol", extra_headers=ALICE)
    await gw.flush()
    users = [row[0] for row in gw.query('SELECT "user" FROM usage ORDER BY created_at')]
    assert users == ["alice", "bob", "carol"]


async def test_file_and_batch_rows_name_their_end_users(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    api = await OpenAIAPI().start(aiohttp_server)
    gw, client = await gateway(make_gateway, aiohttp_server, {"rpm": 100}, api)
    lines = [
        {"custom_id": f"req-{i}", "method": "POST", "url": "/v1/chat/completions",
         "body": {"model": "gpt", "messages": [{"role": "user", "content": f"Q{i}"}], **user}}
        for i, user in enumerate([{"user": "alice"}, {"user": "bob"}, {"user": "alice"}, {}])
    ]  # fmt: skip
    data = "\n".join(json.dumps(line) for line in lines).encode()
    carol = {"X-End-User": "carol"}
    uploaded = await client.files.create(
        file=("b.jsonl", data), purpose="batch", extra_headers=carol
    )
    batch = await client.batches.create(
        input_file_id=uploaded.id,
        endpoint="/v1/chat/completions",
        completion_window="24h",
        extra_headers=carol,
    )
    api.complete(batch.id, prompt=100, completion=20)
    assert (await client.batches.retrieve(batch.id)).status == "completed"
    await gw.flush()
    rows = gw.query(
        'SELECT endpoint, "user", prompt_tokens, units, cost_usd FROM usage ORDER BY created_at'
    )
    assert [row[:2] for row in rows[:2]] == [("files.create", "carol"), ("batches.create", "carol")]
    billed = {row[1]: (row[2], json.loads(row[3])["requests"], row[4]) for row in rows[2:]}
    one = 100 * 7.5e-08 + 20 * 3e-07  # gpt-4o-mini's batch prices: half its own
    # Each request billed to the end user it names; one naming none, to the key's (none here).
    assert billed == {
        "alice": (200, 2, pytest.approx(2 * one)),
        "bob": (100, 1, pytest.approx(one)),
        None: (100, 1, pytest.approx(one)),
    }
    assert await gw.gateway.usage.spent("team.user", "t:alice", 0.0) == pytest.approx(2 * one)
