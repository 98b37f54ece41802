"""Metering: what was generated and billed, what was delivered, what it cost, and reports."""

from __future__ import annotations

import csv
import io
from typing import Any

import aiohttp
import pytest
import tiktoken

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import DONE, USAGE, FakeUpstream, chunk, frames, paused, status

MASTER = "master-key-for-tests-0123456789"
QUESTION = [{"role": "user", "content": "Count to three, please."}]
PRICE = {"input_cost_per_mtok": 2.0, "output_cost_per_mtok": 8.0}  # USD per million tokens


def tokens(text: str) -> int:
    return len(tiktoken.get_encoding("cl100k_base").encode(text))


async def metered(
    make_gateway: MakeGateway, upstream: FakeUpstream, **alias: Any
) -> GatewayUnderTest:
    return await make_gateway(
        models=[
            {
                "name": "m",
                "retry": {"max_attempts": 1},
                "deployments": [
                    {"provider": "openai", "api_base": upstream.url, "name": "d", **PRICE}
                ],
                **alias,
            }
        ],
        auth={"master_key": MASTER},
    )


def usage_rows(gw: GatewayUnderTest) -> list[dict[str, Any]]:
    columns = [
        "status",
        "prompt_tokens",
        "completion_tokens",
        "completion_delivered",
        "usage_source",
        "cost_usd",
        "deployment",
        "alias",
    ]
    rows = gw.query(f"SELECT {', '.join(columns)} FROM usage ORDER BY created_at")
    return [dict(zip(columns, r, strict=True)) for r in rows]


async def test_completed_stream_costs_the_providers_count(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await metered(make_gateway, upstream)
    upstream.push(
        frames(
            chunk("One, two, three."),
            chunk(finish="stop"),
            chunk(usage=USAGE, no_choices=True),
            DONE,
        )
    )
    _, conversation_id = await gw.post_stream(
        {"model": "m", "messages": QUESTION, "stream": True}, key=MASTER
    )
    events = await gw.wait_turn_end(conversation_id)
    [row] = usage_rows(gw)
    assert row == {
        "status": "completed",
        "prompt_tokens": 5,
        "completion_tokens": 7,
        "completion_delivered": 7,
        "usage_source": "provider",
        "cost_usd": pytest.approx((5 * 2.0 + 7 * 8.0) / 1e6),
        "deployment": "d",
        "alias": "m",
    }
    assert events[-1]["payload"]["metered"]["cost_usd"] == pytest.approx(66e-6)


async def test_cancel_is_estimated_and_flagged(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await metered(make_gateway, upstream)
    upstream.push(frames(chunk("One, "), chunk("two, "), then="stall"))
    response = await gw.client(api_key=MASTER).chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, stream=True
    )
    stream = response.parse()
    seen = ""
    async for part in stream:
        seen += part.choices[0].delta.content or ""
        if seen == "One, two, ":
            break
    await stream.close()
    await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    [row] = usage_rows(gw)
    prompt = 3 + 4 + tokens(QUESTION[0]["content"])  # framing + the message
    generated = tokens("One, two, ")
    assert row["status"] == "interrupted"
    assert row["usage_source"] == "estimated"
    assert (row["prompt_tokens"], row["completion_tokens"]) == (prompt, generated)
    assert row["completion_delivered"] == generated
    assert row["cost_usd"] == pytest.approx((prompt * 2.0 + generated * 8.0) / 1e6)


async def test_drained_cancel_keeps_generated_and_delivered_apart(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await metered(make_gateway, upstream, on_client_disconnect="drain")
    upstream.push(
        paused(
            [chunk("One, "), chunk("two, ")],
            [chunk("three."), chunk(finish="stop"), chunk(usage=USAGE, no_choices=True), DONE],
        )
    )
    response = await gw.client(api_key=MASTER).chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, stream=True
    )
    stream = response.parse()
    seen = ""
    async for part in stream:
        seen += part.choices[0].delta.content or ""
        if seen == "One, two, ":
            break
    await stream.close()
    upstream.release.set()
    await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    [row] = usage_rows(gw)
    assert row["usage_source"] == "provider"
    assert row["completion_tokens"] == 7  # what the provider generated and bills
    assert row["completion_delivered"] == tokens("One, two, ")  # what the user got
    assert row["cost_usd"] == pytest.approx(66e-6)


async def test_a_failed_attempt_costs_nothing(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await metered(make_gateway, upstream)
    upstream.push(status(500, {"error": {"message": "boom", "type": "server_error"}}))
    _, conversation_id = await gw.post_stream(
        {"model": "m", "messages": QUESTION, "stream": True}, key=MASTER
    )
    await gw.wait_turn_end(conversation_id)
    [row] = usage_rows(gw)
    assert (row["status"], row["prompt_tokens"], row["completion_tokens"], row["cost_usd"]) == (
        "error",
        0,
        0,
        0.0,
    )


async def test_usage_reports_group_and_stay_within_the_team(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw = await make_gateway(auth={"master_key": MASTER})
    admin_headers = {"Authorization": f"Bearer {MASTER}"}
    keys = {}
    async with aiohttp.ClientSession(headers=admin_headers) as session:
        for team in ("red", "blue"):
            await session.post(gw.url + "/v1/gateway/teams", json={"id": team, "name": team})
            async with session.post(gw.url + "/v1/gateway/keys", json={"team_id": team}) as r:
                keys[team] = (await r.json())["key"]
    for team, count in (("red", 2), ("blue", 1)):
        for _ in range(count):
            await gw.client(api_key=keys[team]).chat.completions.create(
                model="demo", messages=QUESTION
            )
    await gw.flush()

    async def report(key: str, query: str) -> Any:
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
            async with session.get(gw.url + "/v1/usage" + query) as r:
                return r.status, (await r.text() if "csv" in query else await r.json())

    status_code, body = await report(MASTER, "?group_by=team&granularity=hour")
    assert status_code == 200
    by_team = {r["group"]: r for r in body["data"]}
    assert (by_team["red"]["requests"], by_team["blue"]["requests"]) == (2, 1)
    assert by_team["red"]["prompt_tokens"] > 0 and by_team["red"]["completion_tokens"] > 0
    # A team key sees only its own team, whatever it asks for.
    _, body = await report(keys["blue"], "?group_by=team&team_id=red")
    assert [r["group"] for r in body["data"]] == ["blue"]
    _, body = await report(keys["red"], "?group_by=model")
    assert [(r["group"], r["requests"]) for r in body["data"]] == [("demo", 2)]
    _, text = await report(MASTER, "?group_by=key&format=csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert len(rows) == 3 and set(rows[0]) >= {"period_start", "group", "requests", "cost_usd"}
    assert rows[-1]["period_start"] == "total"
    status_code, body = await report(MASTER, "?group_by=colour")
    assert status_code == 400 and body["error"]["param"] == "group_by"
