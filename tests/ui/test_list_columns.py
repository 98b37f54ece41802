"""The list's request-log columns (`GET /v1/conversations?include=usage`), which the admin UI
shows per row: attempts, failures, tokens, cost, timings and a stopped turn, on SQLite and on
PostgreSQL."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from gateway.metering.usage import UsageRecord
from gateway.storage.records import Conversation, NewEvent, TurnStart
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "sk-list-columns-master-0123456789"
T0 = 1_780_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(request: pytest.FixtureRequest, make_gateway: MakeGateway) -> GatewayUnderTest:
    store = {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    return await make_gateway(auth={"master_key": MASTER}, store=store)


async def listed(gw: GatewayUnderTest, query: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            gw.url + "/v1/conversations" + query, headers={"Authorization": f"Bearer {MASTER}"}
        ) as response:
            assert response.status == 200, await response.text()
            return {c["id"]: c for c in (await response.json())["data"]}


def attempt(turn: str, cid: str, n: int, status: str, cost: float | None, **kw: Any) -> UsageRecord:
    return UsageRecord(
        id=f"{turn}:{n}",
        turn_id=turn,
        conversation_id=cid,
        team_id=None,
        key_id=None,
        user=None,
        alias="m",
        deployment="a" if n == 1 else "b",
        provider="openai",
        model="x",
        created_at=T0 + n,
        status=status,
        prompt_tokens=kw.get("prompt", 10),
        completion_tokens=kw.get("completion", 5),
        completion_delivered=kw.get("delivered", 5),
        reasoning_tokens=0,
        cached_tokens=0,
        usage_source="provider",
        cost_usd=cost,
        ttft_ms=kw.get("ttft"),
        duration_ms=kw.get("duration"),
    )


async def test_each_row_carries_its_attempts_tokens_cost_and_timings(gw: GatewayUnderTest) -> None:
    store = gw.gateway.store
    for cid in ("c1", "c2", "c3"):
        store.create_conversation(Conversation(cid, T0 + int(cid[1])))
    # c1: a turn that fell back (a failed attempt, then a success), then one stopped.
    for turn, status in (("c1-t1", "completed"), ("c1-t2", "aborted")):
        store.start_turn(TurnStart(turn, "c1", T0 + 1, {"model": "m"}))
        store.append(NewEvent("c1", turn, "user/message", {"content": "hi"}))
        store.append(NewEvent("c1", turn, "turn/end", {"status": status}))
    store.write(
        "usage",
        attempt("c1-t1", "c1", 1, "error", 0.001, completion=0, delivered=0, duration=100.0).row(),
    )
    store.write(
        "usage", attempt("c1-t1", "c1", 2, "completed", 0.002, ttft=200.0, duration=300.0).row()
    )
    store.write(
        "usage",
        attempt(
            "c1-t2", "c1", 1, "interrupted", None, delivered=2, ttft=400.0, duration=500.0
        ).row(),
    )
    # c2: one turn, and a record whose turn id starts like c1's (`c1-t1x`): it counts for its
    # own conversation only. c3: no turn at all.
    store.start_turn(TurnStart("c2-t1", "c2", T0 + 2, {"model": "m"}))
    store.write("usage", attempt("c1-t1x", "c2", 1, "completed", 1.0).row())
    await store.flush()

    rows = await listed(gw, "?include=usage")
    assert rows["c1"]["usage"] == {
        "attempts": 3,
        "failed_attempts": 1,
        "cost_usd": pytest.approx(0.003),
        "unpriced_attempts": 1,
        "prompt_tokens": 30,
        "completion_tokens": 10,
        "completion_delivered": 7,
        "ttft_ms": 300.0,
        "duration_ms": 900.0,
        "stopped_turn": True,
    }
    assert (rows["c2"]["usage"]["attempts"], rows["c2"]["usage"]["cost_usd"]) == (1, 1.0)
    assert rows["c3"]["usage"]["attempts"] == 0 and rows["c3"]["usage"]["cost_usd"] is None
    assert "usage" not in (await listed(gw, ""))["c1"]  # only when asked for

    # Filters: a turn stopped at any turn (not only the last), a failed attempt (recovered too).
    store.start_turn(TurnStart("c3-t1", "c3", T0 + 3, {"model": "m"}))
    store.append(NewEvent("c3", "c3-t1", "turn/end", {"status": "aborted"}))
    store.start_turn(TurnStart("c3-t2", "c3", T0 + 4, {"model": "m"}))
    store.append(NewEvent("c3", "c3-t2", "turn/end", {"status": "completed"}))
    await store.flush()
    assert list(await listed(gw, "?stopped=true")) == ["c3", "c1"]
    assert list(await listed(gw, "?status=interrupted")) == ["c3", "c1"]  # any turn's, too
    assert list(await listed(gw, "?failed=true")) == ["c1"]
    assert list(await listed(gw, "?failed=true&stopped=true&include=usage")) == ["c1"]


async def test_id_finds_a_conversation_by_a_turn_or_response_id(gw: GatewayUnderTest) -> None:
    store = gw.gateway.store
    for cid in ("c1", "c2"):
        store.create_conversation(Conversation(cid, T0 + int(cid[1])))
        store.start_turn(TurnStart(f"turn_{cid}", cid, T0, {"model": "m"}))
    await store.flush()
    assert list(await listed(gw, "?id=turn_c2")) == ["c2"]
    assert list(await listed(gw, "?id=turn_c")) == []  # exact, not a prefix
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + "/v1/responses",
            json={"model": "demo", "input": "Hi"},
            headers={"Authorization": f"Bearer {MASTER}"},
        ) as response:
            assert response.status == 200, await response.text()
            made = await response.json()
    [found] = (await listed(gw, f"?id={made['id']}")).values()
    assert found["id"] not in ("c1", "c2")
