"""Spend a finance team can bill from: `GET /v1/usage/requests` exports every usage record with
its team's and key's names, what it was charged at (unit prices and their source, enough to
re-rate it) and its request's metadata tags, summing to exactly what `/v1/usage` reports; a
team key exports its own team's alone; `/v1/usage` groups by a metadata tag. On SQLite and on
PostgreSQL."""

from __future__ import annotations

import csv
import io
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from gateway.metering import usage_export
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream
from tests.metering.budgeted import MASTER, backend

__all__ = ["backend"]  # the fixture, run on each backend

HELLO = [{"role": "user", "content": "Hello"}]
INPUT, OUTPUT = 2e-6, 8e-6  # USD per token
PROMPT, COMPLETION = 7, 10
ADMIN = {"Authorization": f"Bearer {MASTER}"}


async def answer(request: web.Request) -> web.StreamResponse:
    usage = {"prompt_tokens": PROMPT, "completion_tokens": COMPLETION, "total_tokens": 17}
    message = {"role": "assistant", "content": "ok"}
    return web.json_response(
        {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 1,
            "model": "gpt-4o-mini",
            "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
            "usage": usage,
        }
    )


async def billed(
    make_gateway: MakeGateway, upstream: FakeUpstream, backend: dict[str, Any]
) -> tuple[GatewayUnderTest, dict[str, str]]:
    """Two teams' keys, and their requests: team a's tagged by project, team b's not."""
    price = {"input_cost_per_mtok": INPUT * 1e6, "output_cost_per_mtok": OUTPUT * 1e6}
    models = [
        {
            "name": "fake",
            "retry": {"max_attempts": 1},
            "deployments": [upstream.deployment(**price)],
        }
    ]
    gw = await make_gateway(models=models, auth={"master_key": MASTER}, **backend)
    keys: dict[str, str] = {}
    async with aiohttp.ClientSession(headers=ADMIN) as session:
        for team in ("a", "b"):
            async with session.post(
                gw.url + "/v1/gateway/teams", json={"id": team, "name": f"Team {team.upper()}"}
            ) as r:
                assert r.status == 201, await r.text()
            body = {"team_id": team, "name": f"=key of {team}"}  # a formula, made inert in CSV
            async with session.post(gw.url + "/v1/gateway/keys", json=body) as r:
                assert r.status == 201, await r.text()
                keys[team] = (await r.json())["key"]
    sent: list[tuple[str, dict[str, str] | None]] = [
        ("a", {"project": "apollo"}),
        ("a", {"project": "apollo", "cost_center": "42"}),
        ("a", {"project": "zeus"}),
        ("a", None),
        ("b", None),
    ]
    for team, tags in sent:
        upstream.push(answer)
        extra = {"metadata": tags} if tags else {}
        await gw.client(api_key=keys[team]).chat.completions.create(
            model="fake", messages=HELLO, user=f"user-{team}", **extra
        )
    await gw.flush()
    return gw, keys


async def export(gw: GatewayUnderTest, query: str, key: str = MASTER) -> list[dict[str, Any]]:
    """The export as JSON Lines, each line a record."""
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession(headers=headers) as session,
        session.get(gw.url + "/v1/usage/requests?format=jsonl&" + query) as r,
    ):
        assert r.status == 200, await r.text()
        assert r.content_type == "application/jsonl"
        text = await r.text()
    return [json.loads(line) for line in text.splitlines()]


async def report(gw: GatewayUnderTest, query: str, key: str = MASTER) -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session,
        session.get(gw.url + "/v1/usage?" + query) as r,
    ):
        assert r.status == 200, await r.text()
        rows: list[dict[str, Any]] = (await r.json())["data"]
    return rows


async def test_the_export_sums_to_the_usage_report(
    make_gateway: MakeGateway,
    upstream: FakeUpstream,
    backend: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gw, _ = await billed(make_gateway, upstream, backend)
    monkeypatch.setattr(usage_export, "PAGE", 2)  # three pages, joined without a gap or twice
    rows = await export(gw, "")
    assert len(rows) == 5 and len({r["id"] for r in rows}) == 5
    assert [r["created_at"] for r in rows] == sorted(r["created_at"] for r in rows)
    totals = await report(gw, "group_by=team")
    assert sum(r["cost_usd"] for r in rows) == pytest.approx(sum(t["cost_usd"] for t in totals))
    assert len({r["turn_id"] for r in rows}) == sum(t["requests"] for t in totals)
    for field in ("prompt_tokens", "completion_tokens"):
        assert sum(r[field] for r in rows) == sum(t[field] for t in totals)
    first = rows[0]
    assert first["team_id"] == "a" and first["team_name"] == "Team A"
    assert first["key_name"] == "=key of a" and first["user"] == "user-a"
    assert (first["model"], first["endpoint"], first["status"]) == ("fake", "turn", "completed")
    assert first["usage_source"] == "provider" and first["tags"] == {"project": "apollo"}
    # What each row was charged at, and a re-rating of it that gives its cost back.
    assert first["price_source"] == "config"
    for row in rows:
        prices = row["prices"]
        assert prices["input"] == pytest.approx(INPUT) and prices["output"] == pytest.approx(OUTPUT)
        rerated = (
            row["prompt_tokens"] * prices["input"] + row["completion_tokens"] * prices["output"]
        )
        assert rerated == pytest.approx(row["cost_usd"], abs=1e-12)
    assert rows[1]["tags"] == {"cost_center": "42", "project": "apollo"}

    # The same as CSV, a header first and a formula made inert.
    async with (
        aiohttp.ClientSession(headers=ADMIN) as session,
        session.get(gw.url + "/v1/usage/requests?format=csv") as r,
    ):
        assert r.status == 200 and r.content_type == "text/csv"
        table = list(csv.DictReader(io.StringIO(await r.text())))
    assert [row["id"] for row in table] == [row["id"] for row in rows]
    assert table[0]["key_name"] == "'=key of a"
    assert json.loads(table[0]["prices"])["output"] == pytest.approx(OUTPUT)
    assert sum(float(row["cost_usd"]) for row in table) == pytest.approx(
        sum(r["cost_usd"] for r in rows)
    )


async def test_a_team_key_exports_its_own_team_alone(
    make_gateway: MakeGateway, upstream: FakeUpstream, backend: dict[str, Any]
) -> None:
    gw, keys = await billed(make_gateway, upstream, backend)
    for query in ("", "team_id=a"):
        rows = await export(gw, query, keys["b"])
        assert [r["team_id"] for r in rows] == ["b"]
        assert "a" not in {r["team_id"] for r in rows}
    assert {r["team_id"] for r in await export(gw, "team_id=a")} == {"a"}
    # A range with nothing in it: no row, and for CSV the header alone.
    assert await export(gw, "from=0&to=1") == []


async def test_usage_grouped_by_a_metadata_tag(
    make_gateway: MakeGateway, upstream: FakeUpstream, backend: dict[str, Any]
) -> None:
    gw, keys = await billed(make_gateway, upstream, backend)
    one = INPUT * PROMPT + OUTPUT * COMPLETION
    for granularity in ("day", "hour"):
        rows = await report(gw, f"group_by=tag:project&granularity={granularity}")
        by_tag = {r["group"]: r for r in rows}
        assert set(by_tag) == {"apollo", "zeus", None}
        assert by_tag["apollo"]["requests"] == 2
        assert by_tag["apollo"]["cost_usd"] == pytest.approx(2 * one)
        assert by_tag["zeus"]["requests"] == 1
        assert by_tag[None]["requests"] == 2  # untagged: team a's last, and team b's
    mine = await report(gw, "group_by=tag:project", keys["b"])
    assert [(r["group"], r["requests"]) for r in mine] == [(None, 1)]
    async with (
        aiohttp.ClientSession(headers=ADMIN) as session,
        session.get(gw.url + "/v1/usage?group_by=tag:no%20spaces") as r,
    ):
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "group_by"


async def test_an_embeddings_row_keeps_its_prices(
    make_gateway: MakeGateway, upstream: FakeUpstream, backend: dict[str, Any]
) -> None:
    gw, keys = await billed(make_gateway, upstream, backend)
    await gw.client(api_key=keys["b"]).embeddings.create(model="fake", input="Hello")
    await gw.flush()
    [row] = [r for r in await export(gw, "") if r["endpoint"] == "embeddings"]
    assert row["team_name"] == "Team B" and row["prompt_tokens"] == 3
    assert row["price_source"] == "config"
    assert row["prices"]["input"] == pytest.approx(INPUT)
    assert row["cost_usd"] == pytest.approx(row["prompt_tokens"] * row["prices"]["input"])
