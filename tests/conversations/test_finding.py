"""Finding conversations in the list (GET /v1/conversations) by what the admin UI shows: a part of
a user's name, the end of an id, a status any turn had; and a date range that cannot hold
anything, said to be so. On a real SQLite file and a real PostgreSQL."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from gateway.conversations import listing
from gateway.storage.records import Conversation, NewEvent, TurnStart
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "sk-finding-master-0123456789"
T0 = 1_780_000_000.0


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(request: pytest.FixtureRequest, make_gateway: MakeGateway) -> GatewayUnderTest:
    store = {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    return await make_gateway(auth={"master_key": MASTER}, store=store)


async def get(gw: GatewayUnderTest, query: dict[str, str]) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(
            gw.url + "/v1/conversations",
            params={"limit": "100", **query},
            headers={"Authorization": f"Bearer {MASTER}"},
        ) as response:
            return response.status, await response.json()


async def ids(gw: GatewayUnderTest, **query: str) -> list[str]:
    status, body = await get(gw, query)
    assert status == 200, body
    return [c["id"] for c in body["data"]]


def seed(
    gw: GatewayUnderTest,
    cid: str,
    at: float,
    turns: list[tuple[str, str | None, str | None]],  # (turn id, user, turn/end status)
) -> None:
    store = gw.gateway.store
    store.create_conversation(Conversation(cid, at))
    for n, (turn, user, status) in enumerate(turns):
        request = {"model": "m", **({"user": user} if user else {})}
        store.start_turn(TurnStart(turn, cid, at + n + 1, request))
        store.append(NewEvent(cid, turn, "user/message", {"content": f"hello {n}"}))
        if status is not None:
            store.append(NewEvent(cid, turn, "turn/end", {"status": status}))


def conv(n: int) -> str:
    return f"conv_{int(T0 * 1000) + n:012x}{n:0>12}{'ab12cd3' + str(n)}"


def turn(n: int, k: int) -> str:
    return f"turn_{int(T0 * 1000) + n:012x}{n:0>12}{'ef45' + str(n) + str(k) + '9a'}"


@pytest.mark.parametrize("read_all", [True, False])
async def test_the_user_filter_matches_a_part_of_a_name_in_any_case(
    gw: GatewayUnderTest, monkeypatch: pytest.MonkeyPatch, read_all: bool
) -> None:
    if not read_all:  # more users than the list reads: each turn's user is tested instead
        monkeypatch.setattr(listing, "_USERS_READ", 2)
    seed(gw, "u1", T0, [("u1-t0", "carol@acme.io", "completed")])
    seed(gw, "u2", T0 + 10, [("u2-t0", "bob@acme.io", "completed")])
    seed(gw, "u3", T0 + 20, [("u3-t0", "Caroline", "completed")])
    seed(gw, "u4", T0 + 30, [("u4-t0", None, "completed"), ("u4-t1", "carol@acme.io", None)])
    seed(gw, "u5", T0 + 40, [("u5-t0", "alice", "completed")])
    await gw.gateway.store.flush()
    assert await ids(gw, user="carol@acme.io") == ["u4", "u1"]  # exactly, as before
    assert await ids(gw, user="carol") == ["u4", "u3", "u1"]  # a prefix, any case
    assert await ids(gw, user="acme") == ["u4", "u2", "u1"]  # a part
    assert await ids(gw, user="CAROL@") == ["u4", "u1"]
    assert await ids(gw, user=" alice ") == ["u5"]
    assert await ids(gw, user="dave") == []
    assert await ids(gw, user="carol", sort="cost") == ["u4", "u3", "u1"]


async def test_the_end_of_an_id_as_the_list_shows_it_finds_its_conversation(
    gw: GatewayUnderTest,
) -> None:
    for n in range(1, 4):
        seed(gw, conv(n), T0 + n, [(turn(n, 0), None, "completed"), (turn(n, 1), None, None)])
    await gw.gateway.store.flush()
    two = conv(2)
    assert await ids(gw, id_tail="conv_…" + two[-8:]) == [two]  # as the list shows it
    assert await ids(gw, id_tail="…" + two[-8:]) == [two]
    assert await ids(gw, id_tail=two[-8:].upper()) == [two]
    assert await ids(gw, id_tail="turn_…" + turn(3, 1)[-8:]) == [conv(3)]  # a turn's
    assert await ids(gw, id_tail="conv_…" + turn(3, 1)[-8:]) == []  # not a conversation's
    assert await ids(gw, id_tail="…d3_%") == []  # LIKE's wildcards are only characters
    assert await ids(gw, id_tail="…" + two[-12:-4]) == []  # the end, not the middle
    status, body = await get(gw, {"id_tail": "…1a"})
    assert status == 400 and body["error"]["param"] == "id_tail"


async def test_interrupted_and_error_consider_every_turn(gw: GatewayUnderTest) -> None:
    seed(gw, "s1", T0, [("s1-t0", None, "aborted"), ("s1-t1", None, "completed")])
    seed(gw, "s2", T0 + 10, [("s2-t0", None, "error"), ("s2-t1", None, "completed")])
    seed(gw, "s3", T0 + 20, [("s3-t0", None, "completed"), ("s3-t1", None, "aborted")])
    seed(gw, "s4", T0 + 30, [("s4-t0", None, "completed")])
    await gw.gateway.store.flush()
    assert await ids(gw, status="interrupted") == ["s3", "s1"]  # s1's first turn was stopped
    assert await ids(gw, status="error") == ["s2"]
    assert await ids(gw, status="completed") == ["s4", "s2", "s1"]  # the last turn's


async def test_a_to_date_before_from_is_explained(gw: GatewayUnderTest) -> None:
    status, body = await get(gw, {"since": "2026-02-01", "until": "2026-01-01"})
    assert status == 400
    assert body["error"]["param"] == "until"
    assert "before 'since'" in body["error"]["message"]
    assert await ids(gw, since="2026-01-01", until="2026-01-01") == []  # a day is a range
