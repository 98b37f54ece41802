"""GET /v1/conversations: filters, search, cursor pagination and team isolation, on a real
SQLite file and a real PostgreSQL."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from gateway.conversations import listing
from gateway.storage import schema
from gateway.storage.payload import DeferredPayload
from gateway.storage.postgres import numbered
from gateway.storage.records import Conversation, NewEvent, TurnStart
from gateway.storage.store import Store
from gateway.storage.writes import USAGE_COLUMNS
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


async def test_search_matches_words_of_messages_and_dates_bound_creation(
    gw: GatewayUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    await seed_all(gw)
    store = gw.gateway.store
    answer = {
        "content": [
            {"type": "reasoning", "text": "unshownthought"},
            {"type": "text", "text": "Figs ripen in late summer."},
        ]
    }
    store.append(NewEvent("c4", "c4-t0", "assistant/message", answer))
    tool = {"tool_call_id": "call_1", "content": "weather: sunny"}
    store.append(NewEvent("c2", "c2-t0", "tool/result", tool))
    await store.flush()
    assert await ids(gw, "?q=APPLES") == ["c1"]  # a branch matches on its own messages only
    assert await ids(gw, "?q=apple") == ["c1"]  # stemmed
    assert await ids(gw, "?q=summer%20figs") == ["c4"]  # every word, from an assistant answer
    assert await ids(gw, "?q=sunny") == ["c2"]  # a tool result
    assert await ids(gw, "?q=unshownthought") == []  # reasoning is not message text
    assert await ids(gw, "?q=more%201") == ["c4"]  # any message, the first or not
    assert await ids(gw, "?q=more") == ["c6", "c4", "c3", "c2", "c1"]  # the list's order
    assert await ids(gw, "?q=deleted") == []  # a deleted conversation never matches
    assert await ids(gw, "?q=100%25%20off") == ["c2"]  # punctuation is no part of a word
    assert await ids(gw, "?q=%25") == []  # no word at all: nothing matches
    assert len(await ids(gw, "?q=%20%20")) == 6  # blank: no filter
    assert await ids(gw, "?q=more&status=error") == ["c3"]  # with the other filters
    # PostgreSQL answers a search of many matches by walking the list, of few from their ids.
    monkeypatch.setattr(listing, "_FEW_MATCHES", 1)
    assert await ids(gw, "?q=more") == ["c6", "c4", "c3", "c2", "c1"]
    assert await ids(gw, "?q=more%201") == ["c4"]
    assert await ids(gw, f"?since={T0 + 15}&until={T0 + 45}") == ["c5", "c4", "c3"]
    iso = datetime.fromtimestamp(T0 + 25, UTC).isoformat()
    assert await ids(gw, f"?until={iso.replace('+', '%2B')}") == ["c3", "c2", "c1"]


async def test_id_finds_a_conversation_by_the_request_id_it_answered_with(
    gw: GatewayUnderTest,
) -> None:
    made = []
    for user in ("alice", "bob"):
        async with aiohttp.ClientSession() as session:
            async with session.post(
                gw.url + "/v1/chat/completions",
                json={
                    "model": "demo",
                    "user": user,
                    "messages": [{"role": "user", "content": f"Hello from {user}"}],
                },
                headers={"Authorization": f"Bearer {MASTER}"},
            ) as response:
                assert response.status == 200, await response.text()
                made.append(
                    (response.headers["X-Request-Id"], response.headers["X-Conversation-Id"])
                )
    await gw.flush()
    (alice_request, alice), (bob_request, bob) = made
    assert alice != bob
    assert await ids(gw, f"?id={alice_request}") == [alice]
    assert await ids(gw, f"?id={bob_request}") == [bob]
    assert await ids(gw, f"?id={bob}") == [bob]  # the conversation's own id still
    assert await ids(gw, f"?id={bob_request[:-1]}") == []  # exact, not a prefix
    assert await ids(gw, "?user=alice") == [alice]
    assert await ids(gw, "?user=carol") == []
    assert await ids(gw, "?q=hello%20bob") == [bob]


def usage_row(turn: str, cid: str, n: int, **values: Any) -> dict[str, Any]:
    """An attempt's usage record, as the meter writes it."""
    return {
        "id": f"{turn}:{n}",
        "turn_id": turn,
        "conversation_id": cid,
        "team_id": "A",
        "key_id": "kA1",
        "user": None,
        "alias": "m1",
        "deployment": "d",
        "provider": "openai",
        "model": "x",
        "created_at": T0,
        "status": values.get("status", "completed"),
        "prompt_tokens": values.get("prompt", 10),
        "completion_tokens": values.get("completion", 5),
        "completion_delivered": 5,
        "reasoning_tokens": 0,
        "cached_tokens": 0,
        "usage_source": "provider",
        "cost_usd": values.get("cost"),
        "ttft_ms": values.get("ttft"),
        "duration_ms": values.get("duration"),
        "cache_write_5m_tokens": 0,
        "cache_write_1h_tokens": 0,
    }


# Per conversation: its attempts (cost, ttft, duration, completion tokens), ties and gaps
# included: two share a cost, two have no price, one no attempt at all.
ATTEMPTS: dict[str, list[tuple[float | None, float | None, float | None, int]]] = {
    "s0": [(0.5, 100.0, 1000.0, 5)],
    "s1": [(0.1, 300.0, 200.0, 50), (0.2, None, 50.0, 0)],
    "s2": [(0.5, 200.0, 700.0, 5)],
    "s3": [(None, 150.0, 90.0, 7)],
    "s4": [(0.25, 100.0, 1000.0, 20)],
    "s5": [],
    "s6": [(None, None, 10.0, 0), (0.05, 120.0, 400.0, 1), (0.01, 80.0, 30.0, 1)],
}


async def seed_sortable(gw: GatewayUnderTest) -> None:
    store = gw.gateway.store
    for n, (cid, attempts) in enumerate(ATTEMPTS.items()):
        # Creation and activity in different orders; s5 and s6 made at the same moment.
        store.create_conversation(Conversation(cid, T0 + min(n, 5), team_id="A", key_id="kA1"))
        turn = f"{cid}-t"
        store.start_turn(TurnStart(turn, cid, T0 + 100 - n * 7 % 5, {"model": "m1"}, "A", "kA1"))
        for a, (cost, ttft, duration, completion) in enumerate(attempts, 1):
            row = usage_row(
                turn, cid, a, cost=cost, ttft=ttft, duration=duration, completion=completion
            )
            store.write("usage", row)
    await store.flush()


def _expected(rows: list[dict[str, Any]], sort: str, order: str) -> list[str]:
    """The rows in `sort` order computed here from what each row shows: NULLs last either
    way, ties by id in the same direction."""

    def key(row: dict[str, Any]) -> Any:
        usage = row["usage"]
        return {
            "created": row["created_at"],
            "updated": row["last_activity"],
            "cost": usage["cost_usd"],
            "tokens": usage["prompt_tokens"] + usage["completion_tokens"],
            "duration": usage["duration_ms"],
            "ttft": usage["ttft_ms"],
            "attempts": usage["attempts"],
        }[sort]

    present = [r for r in rows if key(r) is not None]
    missing = [r for r in rows if key(r) is None]
    backwards = order == "desc"
    present.sort(key=lambda r: (key(r), r["id"]), reverse=backwards)
    missing.sort(key=lambda r: r["id"], reverse=backwards)
    return [r["id"] for r in present + missing]


SORT_NAMES = ("created", "updated", "cost", "tokens", "duration", "ttft", "attempts")


async def test_each_sort_pages_through_every_conversation_once(gw: GatewayUnderTest) -> None:
    await seed_sortable(gw)
    status, body = await get(gw, "/v1/conversations?include=usage&limit=100")
    assert status == 200
    rows = body["data"]
    assert {r["id"]: r["usage"]["attempts"] for r in rows} == {
        cid: len(attempts) for cid, attempts in ATTEMPTS.items()
    }
    for sort in SORT_NAMES:
        for order in ("desc", "asc"):
            expected = _expected(rows, sort, order)
            seen: list[str] = []
            after = ""
            for _ in range(len(ATTEMPTS)):
                status, body = await get(
                    gw, f"/v1/conversations?sort={sort}&order={order}&limit=2{after}"
                )
                assert status == 200, body
                seen += [c["id"] for c in body["data"]]
                if not body["has_more"]:
                    break
                after = f"&after={body['cursor']}"
            assert seen == expected, (sort, order)
    # Without `order`, newest (or most) first; without `sort`, by creation.
    assert await ids(gw, "?sort=cost") == _expected(rows, "cost", "desc")
    assert await ids(gw, "?order=asc") == _expected(rows, "created", "asc")
    # A conversation's id as `after` continues from where that row is now.
    by_cost = _expected(rows, "cost", "desc")
    assert await ids(gw, f"?sort=cost&after={by_cost[2]}") == by_cost[3:]
    # A cursor carries its sort: another sort or order will not take it.
    status, body = await get(gw, "/v1/conversations?sort=cost&limit=2")
    cursor = body["cursor"]
    for other in ("sort=tokens", "sort=cost&order=asc", ""):
        status, body = await get(gw, f"/v1/conversations?{other}&after={cursor}")
        assert status == 400 and body["error"]["param"] == "after", other


async def test_user_metadata_and_range_filters(gw: GatewayUnderTest) -> None:
    await seed_sortable(gw)
    store = gw.gateway.store
    store.create_conversation(
        Conversation("m1", T0 + 50, team_id="A", metadata={"app": "web", "env": "prod"})
    )
    store.create_conversation(
        Conversation("m2", T0 + 51, team_id="A", metadata={"app": "cli", 'we"ird': "x y"})
    )
    store.create_conversation(Conversation("m3", T0 + 52, team_id="A", metadata={"app": 5}))
    store.start_turn(TurnStart("m1-t", "m1", T0 + 60, {"model": "m1", "user": "alice"}))
    store.start_turn(TurnStart("m2-t", "m2", T0 + 61, {"model": "m1", "user": "bob"}))
    store.start_turn(TurnStart("m2-t2", "m2", T0 + 62, {"model": "m1", "user": "alice"}))
    await store.flush()
    assert await ids(gw, "?user=alice") == ["m2", "m1"]  # any turn for that user
    assert await ids(gw, "?user=bob") == ["m2"]
    assert await ids(gw, "?metadata.app=web") == ["m1"]
    assert await ids(gw, "?metadata.app=cli&metadata.we%22ird=x%20y") == ["m2"]
    assert await ids(gw, "?metadata.app=web&metadata.env=dev") == []  # each must hold
    assert await ids(gw, "?metadata.app=5") == []  # string values only
    assert await ids(gw, "?metadata.missing=web") == []
    # Ranges over each conversation's totals; one without the value is in no range.
    assert sorted(await ids(gw, "?min_cost=0.25")) == ["s0", "s1", "s2", "s4"]
    assert sorted(await ids(gw, "?min_cost=0.05&max_cost=0.31")) == ["s1", "s4", "s6"]
    assert sorted(await ids(gw, "?max_cost=0.07")) == ["s6"]
    assert sorted(await ids(gw, "?min_duration_ms=700")) == ["s0", "s2", "s4"]
    assert sorted(await ids(gw, "?max_duration_ms=100")) == ["s3"]
    assert sorted(await ids(gw, "?min_ttft_ms=150&max_ttft_ms=300")) == ["s1", "s2", "s3"]
    # The average over the attempts that had a first token: s6's is (120 + 80) / 2.
    assert sorted(await ids(gw, "?max_ttft_ms=100")) == ["s0", "s4", "s6"]
    assert await ids(gw, "?min_cost=0.3&user=alice") == []


async def test_every_way_of_finding_matches_lists_the_same_pages(
    gw: GatewayUnderTest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`q` and `user` find their conversations first when they match few, and walk the list
    when they match many (on SQLite, asking the search index about each message walked when
    they match very many): each way lists the same conversations, page by page."""
    store = gw.gateway.store
    for n in range(12):
        cid = f"w{n:02d}"
        # Pairs share a creation time: a walk breaks the tie by id as a sort does.
        word = "rare" if n % 4 == 0 else "plain"
        seed(store, cid, T0 + n // 2, team="A" if n % 3 else "B", first=f"common {word} {n}")
        user = "alice" if n % 2 else "bob"
        store.start_turn(TurnStart(f"{cid}-u", cid, T0 + 100 + n, {"model": "m1", "user": user}))
    await store.flush()

    async def pages(query: str) -> list[str]:
        seen: list[str] = []
        after = ""
        while True:
            status, body = await get(gw, f"/v1/conversations?{query}&limit=3{after}")
            assert status == 200, body
            seen += [c["id"] for c in body["data"]]
            if not body["has_more"]:
                return seen
            after = f"&after={body['cursor']}"

    queries = (
        "q=common",
        "q=rare",
        "q=common%20rare",
        "q=absent",
        "q=common&team_id=A",
        "q=common&order=asc",
        f"q=common&since={T0 + 2}",
        "q=rare&sort=cost",
        "user=alice",
        "user=alice&q=rare",
        "user=bob&team_id=B&q=common",
        "user=nobody",
    )
    first = {query: await pages(query) for query in queries}
    newest = [f"w{n:02d}" for n in range(11, -1, -1)]
    assert first["q=common"] == newest
    assert first["q=rare"] == ["w08", "w04", "w00"]
    assert first["q=common&order=asc"] == newest[::-1]
    assert first["user=alice&q=rare"] == []
    assert first["user=bob&team_id=B&q=common"] == ["w06", "w00"]
    assert first["q=absent"] == first["user=nobody"] == []

    async def plan(query: listing.ListQuery) -> Any:
        async def op(db: Any) -> Any:
            return await listing._plan(db, query)

        return await store.run(op)

    dialect = store.dialect
    ways = [("walk", 0, 10**6)] + ([("probe", 0, 0)] if dialect == "sqlite" else [])
    for way, few, many in ways:
        monkeypatch.setattr(listing, "_FEW_MATCHES", few)
        monkeypatch.setattr(listing, "_MANY_MATCHES", many)
        assert (await plan(listing.ListQuery(q="rare"))).search == way
        assert (await plan(listing.ListQuery(user="alice"))).user_walk == (dialect == "sqlite")
        for query in queries:
            assert await pages(query) == first[query], (way, query)


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
    assert await ids(gw, "?q=plums", key=b) == ["c3"]
    assert await ids(gw, "?q=plums", key=a) == []  # another team's words find nothing
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
    [
        "status=bogus",
        "limit=0",
        "limit=101",
        "limit=x",
        "since=yesterday",
        "until=soon",
        "sort=price",
        "order=up",
        "min_cost=cheap",
        "max_cost=-1",
        "min_duration_ms=nan",
        "max_duration_ms=inf",
        "min_ttft_ms=1e999",
        "metadata.=web",
        "after=cur1_WyJwcmljZSIsImRlc2MiLDEsImMxIl0",  # a cursor of no sort the list has
    ],
)
async def test_bad_parameters_are_400(gw: GatewayUnderTest, query: str) -> None:
    status, body = await get(gw, f"/v1/conversations?{query}")
    assert status == 400
    assert body["error"]["param"] == query.split("=")[0]


TRACKING = (
    "CREATE TABLE IF NOT EXISTS schema_migrations"
    " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
)
# What a gateway before the request log (SQLite 8, PostgreSQL 5) stored: a turn whose request
# names its request id and user, its messages (the answer, on SQLite, a long payload kept
# aside), and an attempt's usage.
OLD_ROWS: list[tuple[str, tuple[Any, ...]]] = [
    (
        "INSERT INTO conversations (id, created_at, team_id, key_id) VALUES (?, ?, ?, ?)",
        ("old1", T0, "A", "kA1"),
    ),
    (
        "INSERT INTO conversations (id, created_at, team_id, key_id) VALUES (?, ?, ?, ?)",
        ("old2", T0 + 1, "A", "kA1"),
    ),
    (
        "INSERT INTO turns (id, conversation_id, started_at, ended_at, status, request, team_id,"
        " key_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (
            "old1-t",
            "old1",
            T0 + 5,
            T0 + 6,
            "completed",
            '{"model":"m1","request_id":"req-old-1","user":"olduser"}',
            "A",
            "kA1",
        ),
    ),
    (
        "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload, uid)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        ("old1", 1, "old1-t", "user/message", T0 + 5, '{"content":"Bananas are yellow"}', "u1"),
    ),
    (
        "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload, uid)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        ("old2", 1, "old2-t", "user/message", T0 + 7, '{"content":"Cherries"}', "u3"),
    ),
]
OLD_ANSWER = '{"content":[{"type":"text","text":"Kiwis are green"}],"interrupted":false}'


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_the_migration_indexes_what_was_stored_before(
    backend: str, make_gateway: MakeGateway, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    usage = usage_row("old1-t", "old1", 1, cost=0.7, ttft=90.0, duration=400.0)
    # Not yet at v1: cache writes, and the prices and tags a row keeps.
    later = ("prices", "price_source", "tags")
    columns = [
        c for c in USAGE_COLUMNS if not c.startswith(("cache_write", "audio_")) and c not in later
    ]
    names = ", ".join('"' + c + '"' for c in columns)
    marks = ", ".join("?" for _ in columns)
    usage_insert = f"INSERT INTO usage ({names}) VALUES ({marks})"
    usage_values = tuple(usage[c] for c in columns)
    store: dict[str, Any] = {}
    if backend == "sqlite":
        db = sqlite3.connect(tmp_path / "gateway.db", isolation_level=None)
        db.execute(TRACKING)
        for migration in schema.MIGRATIONS["sqlite"][:8]:
            for statement in migration.statements:
                db.execute(statement)
            db.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (migration.version, "x"))
        for sql, values in OLD_ROWS:
            db.execute(sql, values)
        aside = db.execute(
            "INSERT INTO event_payloads (body) VALUES (?)", (OLD_ANSWER.encode(),)
        ).lastrowid
        db.execute(
            "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload, uid,"
            " payload_id) VALUES ('old1', 2, 'old1-t', 'assistant/message', ?, '', 'u2', ?)",
            (T0 + 6, aside),
        )
        db.execute(usage_insert, usage_values)
        db.close()
    else:
        store["url"] = url = request.getfixturevalue("pg_url")
        conn = await asyncpg.connect(url)
        await conn.execute(TRACKING)
        for migration in schema.MIGRATIONS["postgresql"][:5]:
            for statement in migration.statements:
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO schema_migrations VALUES ($1, 'x', 0)", migration.version
            )
        answer = ("old1", 2, "old1-t", "assistant/message", T0 + 6, OLD_ANSWER, "u2")
        for sql, values in [*OLD_ROWS, (OLD_ROWS[-1][0], answer), (usage_insert, usage_values)]:
            await conn.execute(numbered(sql), *values)
        await conn.close()

    gw = await make_gateway(auth={"master_key": MASTER}, store=store)
    assert await ids(gw, "?q=bananas") == ["old1"]
    assert await ids(gw, "?q=kiwi") == ["old1"]  # the answer, on SQLite a payload aside
    assert await ids(gw, "?q=cherries") == ["old2"]
    assert await ids(gw, "?id=req-old-1") == ["old1"]
    assert await ids(gw, "?user=olduser") == ["old1"]
    assert await ids(gw, "?sort=cost") == ["old1", "old2"]
    assert await ids(gw, "?sort=updated&order=asc") == ["old2", "old1"]  # old1 active at T0+6
    status, body = await get(gw, "/v1/conversations?include=usage&id=old1")
    assert status == 200
    [row] = body["data"]
    assert row["last_activity"] == T0 + 6
    assert row["usage"]["attempts"] == 1 and row["usage"]["cost_usd"] == 0.7
    # New writes are indexed as they land.
    gw.gateway.store.append(NewEvent("old2", "old2-t", "user/message", {"content": "Dates"}))
    await gw.flush()
    assert await ids(gw, "?q=dates") == ["old2"]


async def test_a_scrubbed_secret_is_no_longer_found(gw: GatewayUnderTest) -> None:
    store = gw.gateway.store
    seed(store, "c1", T0, first="my token is tok3nvalue99 please keep it")
    # An answer whose payload the store encodes as it writes it (on SQLite, into a table of
    # long payloads before its event).
    answer = DeferredPayload({"content": [{"type": "text", "text": "noted tok3nvalue99 safely"}]})
    seed(store, "c2", T0 + 1, first="hello")
    store.append(NewEvent("c2", "c2-t0", "assistant/message", answer))
    await store.flush()
    assert await ids(gw, "?q=tok3nvalue99") == ["c2", "c1"]
    assert await ids(gw, "?q=safely") == ["c2"]

    async def scrub(db: Any) -> None:
        await schema.scrub_configured(db, ["tok3nvalue99"])

    await store.transact(scrub)
    assert await ids(gw, "?q=tok3nvalue99") == []  # the index follows the rewritten text
    assert await ids(gw, "?q=please%20keep") == ["c1"]
    assert await ids(gw, "?q=noted%20safely") == ["c2"]


async def test_search_runs_under_a_parallel_postgresql_plan(
    make_gateway: MakeGateway, pg_url: str
) -> None:
    """A big table gets parallel plans; the search function must be allowed in one."""
    gw = await make_gateway(auth={"master_key": MASTER}, store={"url": pg_url})
    seed(gw.gateway.store, "c1", T0, first="Parallel apples")
    await gw.flush()
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute("SET force_parallel_mode = on")
        found = await conn.fetch(
            "SELECT conversation_id FROM events WHERE gateway_message_search(type, payload)"
            " @@ plainto_tsquery('gateway_search', 'apples')"
        )
    finally:
        await conn.close()
    assert [r[0] for r in found] == ["c1"]
