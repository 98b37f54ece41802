"""GET /v1/conversations: filters, search, cursor pagination and team isolation, on a real
SQLite file and a real PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from gateway.conversations.events import Conversation, NewEvent, TurnStart
from gateway.storage.store import Store
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "sk-listing-master-0123456789"
T0 = 1_780_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(request: pytest.FixtureRequest, make_gateway: MakeGateway) -> GatewayUnderTest:
    store = {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    return await make_gateway(auth={"master_key": MASTER}, store=store)


async def get(gw: GatewayUnderTest, path: str, key: str = MASTER) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            gw.url + path, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            return response.status, await response.json()


async def post(gw: GatewayUnderTest, path: str, body: Any, key: str = MASTER) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.post(
            gw.url + path, json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            return response.status, await response.json()


async def ids(gw: GatewayUnderTest, query: str = "", key: str = MASTER) -> list[str]:
    status, body = await get(gw, "/v1/conversations" + query, key)
    assert status == 200, body
    return [c["id"] for c in body["data"]]


def seed(
    store: Store,
    cid: str,
    at: float,
    *,
    team: str | None = "A",
    key: str | None = "kA1",
    turns: tuple[tuple[str, str | None], ...] = (("m1", "completed"),),
    first: str | None = None,
    parent: tuple[str, int] | None = None,
) -> None:
    """A conversation made at `at`, with one turn per (model, turn/end status or None: open)."""
    store.create_conversation(
        Conversation(
            cid,
            at,
            parent_id=parent[0] if parent else None,
            parent_seq=parent[1] if parent else None,
            team_id=team,
            key_id=key,
        )
    )
    for n, (model, status) in enumerate(turns):
        turn = f"{cid}-t{n}"
        started = at + n + 1
        store.start_turn(TurnStart(turn, cid, started, {"model": model}, team_id=team, key_id=key))
        if first is not None and n == 0:
            message = {"content": first}
            store.append(NewEvent(cid, turn, "user/message", message, created_at=started))
        store.append(NewEvent(cid, turn, "user/message", {"content": f"more {n}"}))
        if status is not None:
            store.append(
                NewEvent(cid, turn, "turn/end", {"status": status}, created_at=started + 0.5)
            )


async def seed_all(gw: GatewayUnderTest) -> None:
    store = gw.gateway.store
    seed(store, "c1", T0, first="Hello apples")
    seed(store, "c2", T0 + 10, key="kA2", turns=(("m2", "aborted"),), first="Pears 100% _off_")
    seed(store, "c3", T0 + 20, team="B", key="kB", turns=(("m1", "error"),), first="Plums")
    seed(store, "c4", T0 + 30, turns=(("m2", "completed"), ("m2", "aborted")), first="Figs")
    seed(store, "c5", T0 + 40, turns=(), parent=("c1", 2))  # a branch with no turn yet
    seed(store, "c6", T0 + 50, turns=(("m1", None),), first="Still going")
    seed(store, "c7", T0 + 60, first="Deleted later")
    await store.flush()
    await store.delete_conversation("c7", T0 + 70)


async def test_the_list_and_each_filter(gw: GatewayUnderTest) -> None:
    await seed_all(gw)
    assert await ids(gw) == ["c6", "c5", "c4", "c3", "c2", "c1"]  # newest first; c7 deleted

    status, body = await get(gw, "/v1/conversations?limit=100")
    assert status == 200 and body["object"] == "list" and body["has_more"] is False
    rows = {c["id"]: c for c in body["data"]}
    assert rows["c4"] == {
        "id": "c4",
        "object": "conversation",
        "created_at": T0 + 30,
        "team_id": "A",
        "key_id": "kA1",
        "model": "m2",
        "status": "interrupted",  # its last turn ended aborted
        "turns": 2,
        "last_activity": T0 + 32.5,
        "preview": "Figs",
        "parent_id": None,
        "parent_seq": None,
    }
    assert rows["c5"]["preview"] == "Hello apples"  # a branch shows its parent's first message
    assert (rows["c5"]["status"], rows["c5"]["turns"]) == (None, 0)
    assert rows["c6"]["status"] == "active"

    assert await ids(gw, "?status=completed") == ["c1"]
    assert await ids(gw, "?status=interrupted") == ["c4", "c2"]
    assert await ids(gw, "?status=error") == ["c3"]
    assert await ids(gw, "?status=active") == ["c6"]
    assert await ids(gw, "?model=m1") == ["c6", "c3", "c1"]
    assert await ids(gw, "?team_id=B") == ["c3"]
    assert await ids(gw, "?key_id=kA2") == ["c2"]
    assert await ids(gw, "?team_id=A&model=m2&status=interrupted") == ["c4", "c2"]
    assert await ids(gw, "?parent_id=c1") == ["c5"]
    assert await ids(gw, "?id=c3") == ["c3"]


async def test_search_and_dates(gw: GatewayUnderTest) -> None:
    await seed_all(gw)
    assert await ids(gw, "?q=APPLES") == ["c5", "c1"]  # case-insensitive; the branch too
    assert await ids(gw, "?q=100%25") == ["c2"]  # % and _ are literal
    assert await ids(gw, "?q=_off_") == ["c2"]
    assert await ids(gw, "?q=%25") == ["c2"]
    assert await ids(gw, "?q=more%201") == []  # only the first user message is searched
    assert await ids(gw, "?q=c3") == ["c3"]  # or the id
    assert await ids(gw, f"?since={T0 + 15}&until={T0 + 45}") == ["c5", "c4", "c3"]
    iso = datetime.fromtimestamp(T0 + 25, UTC).isoformat()
    assert await ids(gw, f"?until={iso.replace('+', '%2B')}") == ["c3", "c2", "c1"]


async def test_cursor_pagination_visits_each_conversation_once(gw: GatewayUnderTest) -> None:
    store = gw.gateway.store
    for n in range(25):
        # Pairs share a creation time: ties are broken by id, so no page skips or repeats.
        seed(store, f"p{n:02d}", T0 + n // 2, first=f"question {n}")
    await store.flush()
    seen: list[str] = []
    after = ""
    pages = []
    while True:
        status, body = await get(gw, f"/v1/conversations?limit=10{after}")
        assert status == 200
        seen += [c["id"] for c in body["data"]]
        pages.append((len(body["data"]), body["has_more"]))
        assert body["last_id"] == body["data"][-1]["id"]
        if not body["has_more"]:
            break
        after = f"&after={body['last_id']}"
    assert pages == [(10, True), (10, True), (5, False)]
    assert seen == sorted(seen, reverse=True) and len(set(seen)) == 25


async def test_a_team_key_sees_only_its_own_team(gw: GatewayUnderTest) -> None:
    await seed_all(gw)
    for team in ("A", "B"):
        assert (await post(gw, "/v1/gateway/teams", {"name": team, "id": team}))[0] == 201
    _, key_a = await post(gw, "/v1/gateway/keys", {"team_id": "A"})
    _, key_b = await post(gw, "/v1/gateway/keys", {"team_id": "B"})
    a, b = key_a["key"], key_b["key"]

    assert await ids(gw, key=a) == ["c6", "c5", "c4", "c2", "c1"]
    assert await ids(gw, key=b) == ["c3"]
    # Asking for another team's conversations, by any filter, finds nothing.
    assert await ids(gw, "?team_id=A", key=b) == ["c3"]
    assert await ids(gw, "?id=c1", key=b) == []
    assert await ids(gw, "?parent_id=c1", key=b) == []
    assert await ids(gw, "?q=apples", key=b) == []
    assert await ids(gw, "?key_id=kA1", key=b) == []
    status, _ = await get(gw, "/v1/conversations/c1/usage", key=b)
    assert status == 404
    status, _ = await get(gw, "/v1/conversations/c3/usage", key=b)
    assert status == 200


async def test_a_real_turn_is_listed_with_its_usage(gw: GatewayUnderTest) -> None:
    await post(gw, "/v1/gateway/teams", {"name": "A", "id": "A"})
    _, key = await post(gw, "/v1/gateway/keys", {"team_id": "A"})
    status, answer = await post(
        gw,
        "/v1/chat/completions",
        {"model": "demo", "messages": [{"role": "user", "content": "Hi there"}]},
        key=key["key"],
    )
    assert status == 200, answer
    [row] = (await get(gw, "/v1/conversations", key["key"]))[1]["data"]
    assert (row["team_id"], row["key_id"], row["model"]) == ("A", key["id"], "demo")
    assert (row["status"], row["turns"], row["preview"]) == ("completed", 1, "Hi there")
    status, usage = await get(gw, f"/v1/conversations/{row['id']}/usage", key["key"])
    assert status == 200
    [attempt] = usage["data"]
    assert attempt["alias"] == "demo" and attempt["status"] == "completed"
    assert attempt["completion_tokens"] > 0


@pytest.mark.parametrize(
    "query",
    ["status=bogus", "limit=0", "limit=101", "limit=x", "since=yesterday", "until=soon"],
)
async def test_bad_parameters_are_400(gw: GatewayUnderTest, query: str) -> None:
    status, body = await get(gw, f"/v1/conversations?{query}")
    assert status == 400
    assert body["error"]["param"] == query.split("=")[0]
