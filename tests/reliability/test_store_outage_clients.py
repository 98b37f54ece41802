"""A PostgreSQL outage as real clients see it (team keys): completions keep succeeding from the
key cache and the spool, a conversation continued by id goes ahead on the client's history, a
read that needs the store is a retryable 503 `store_unavailable`, and a replica started while
the store is down serves. Once PostgreSQL is back every turn is there exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, cast

import aiohttp
import asyncpg
import openai
import pytest

from gateway.metering import auth
from gateway.metering.auth import Authenticator
from gateway.metering.keys import KeyRecord, Team
from gateway.storage.db import StoreUnavailable
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, completion
from tests.postgres_server import PostgresServer, throwaway_postgres

MASTER = "master-key-for-tests-0123456789"


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A cluster of this test's own: it is stopped and started again."""
    with throwaway_postgres("gw-pg-clients-") as server:
        yield server


async def wait_for(condition: Any, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.02)


async def call(
    gw: GatewayUnderTest, method: str, path: str, key: str, body: Any = None
) -> tuple[int, dict[str, str], Any]:
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gw.url + path, json=body, headers=headers) as response,
    ):
        return response.status, dict(response.headers), await response.json()


async def team_key(gw: GatewayUnderTest, team: str) -> str:
    body = {"id": team, "name": team}
    status, _, body = await call(gw, "POST", "/v1/gateway/teams", MASTER, body)
    assert status == 201, body
    status, _, body = await call(gw, "POST", "/v1/gateway/keys", MASTER, {"team_id": team})
    assert status == 201, body
    return str(body["key"])


async def rows(url: str, sql: str) -> list[Any]:
    connection = await asyncpg.connect(url)
    try:
        return [tuple(r) for r in await connection.fetch(sql)]
    finally:
        await connection.close()


async def test_team_keys_ride_through_a_postgres_stop_and_restart(
    own_postgres: PostgresServer, make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    url = own_postgres.create_database()
    # A short key cache: it expires during the outage, which the stale window must cover.
    gw = await make_gateway(
        upstream=upstream,
        store={"url": url},
        auth={"master_key": MASTER, "key_cache_s": 0.2, "key_stale_s": 900},
    )
    store = gw.gateway.store
    keys = [await team_key(gw, team) for team in ("red", "blue")]
    clients = [openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=k, max_retries=0) for k in keys]
    gw.clients.extend(clients)
    statuses: list[int] = []
    conversations: list[str] = []

    async def ask(i: int, **extra: Any) -> Any:
        response = await clients[i % 2].chat.completions.with_raw_response.create(
            model="fake", messages=[{"role": "user", "content": f"question {i}"}], **extra
        )
        statuses.append(response.http_response.status_code)
        conversations.append(response.headers["X-Conversation-Id"])
        return response.parse()

    upstream.push(*[completion("the answer")] * 64)
    for i in range(8):  # before: every key cached once
        await ask(i)
    continued = conversations[0]  # red's first conversation, continued during the outage

    await asyncio.to_thread(own_postgres.stop)
    await asyncio.sleep(0.3)  # every key's cache entry has expired: only the stale window
    for i in range(8, 40):
        await ask(i)
    assert store.spooling
    # Continuing a conversation by id: the join cannot read it, the turn goes ahead anyway.
    response = await clients[0].chat.completions.with_raw_response.create(
        model="fake",
        messages=[
            {"role": "user", "content": "question 0"},
            {"role": "assistant", "content": "the answer"},
            {"role": "user", "content": "and then?"},
        ],
        extra_headers={"X-Conversation-Id": continued},
    )
    statuses.append(response.http_response.status_code)
    assert response.headers["X-Conversation-Id"] == continued
    # Reading a conversation needs the store: a retryable 503, never a 500.
    status, headers, body = await call(gw, "GET", f"/v1/conversations/{continued}", keys[0])
    assert status == 503, body
    assert body["error"]["code"] == "store_unavailable"
    assert int(headers["Retry-After"]) > 0
    # Ready all along: the replica serves (and says it spools).
    status, _, body = await call(gw, "GET", "/health/ready", keys[0])
    assert (status, body["store"]) == (200, "spooling")

    await asyncio.to_thread(own_postgres.start)
    for i in range(40, 48):
        await ask(i)
    await wait_for(lambda: not store.spooling)
    await gw.flush()

    assert statuses == [200] * 49
    turns = await rows(url, "SELECT conversation_id, count(*) FROM turns GROUP BY 1")
    per_conversation = dict(turns)
    assert sum(per_conversation.values()) == 49  # every turn once
    assert per_conversation[continued] == 2  # the continued turn joined its conversation
    assert set(per_conversation) == set(conversations) | {continued}
    ended = await rows(url, "SELECT count(*) FROM turns WHERE ended_at IS NOT NULL")
    assert ended == [(49,)]
    assert await rows(url, "SELECT count(*) FROM usage") == [(49,)]
    events = await rows(
        url,
        f"SELECT type, count(*) FROM events WHERE conversation_id = '{continued}' GROUP BY 1",
    )
    # The client's whole history went in as the continued turn's input.
    assert dict(events) == {"user/message": 3, "assistant/message": 3, "turn/end": 2}

    # A revocation made while the key was served from the cache applies now the store is back
    # (within key_cache_s, and the second the cache waits before asking a failed store again).
    await rows(url, "UPDATE keys SET revoked_at = 1 WHERE team_id = 'blue'")

    async def revoked() -> bool:
        status, _, body = await call(gw, "GET", "/v1/models", keys[1])
        assert status in (200, 401), body
        return status == 401

    async with asyncio.timeout(30):
        while not await revoked():
            await asyncio.sleep(0.1)


class _Keys:
    """A key store that answers once, then is down."""

    def __init__(self) -> None:
        self.lookups = 0
        self.down = False

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        self.lookups += 1
        if self.down:
            raise StoreUnavailable("down")
        return KeyRecord("key_1", key_hash, "gw-abcd", "red", 0.0)

    async def team(self, team_id: str) -> Team | None:
        return None


async def test_a_hanging_store_is_asked_once_a_second_not_once_a_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(auth, "_STORE_RETRY_S", 3600.0)
    keys = _Keys()
    authenticator = Authenticator(MASTER, cast(Any, keys), cache_s=0, stale_s=900)
    headers = {"Authorization": "Bearer gw-some-team-key"}
    assert (await authenticator.principal(headers)).team_id == "red"
    keys.down = True
    for _ in range(5):
        assert (await authenticator.principal(headers)).team_id == "red"
    assert keys.lookups == 2  # the first after the failure, then none until the retry time
    other = {"Authorization": "Bearer gw-never-seen"}
    with pytest.raises(StoreUnavailable):
        await authenticator.principal(other)


async def test_a_key_never_looked_up_gets_503_during_an_outage(
    own_postgres: PostgresServer, make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    url = own_postgres.create_database()
    gw = await make_gateway(upstream=upstream, store={"url": url}, auth={"master_key": MASTER})
    key = await team_key(gw, "red")
    await asyncio.to_thread(own_postgres.stop)
    status, headers, body = await call(gw, "GET", "/v1/models", key)
    assert status == 503, body
    assert body["error"]["code"] == "store_unavailable"
    assert "Retry-After" in headers


async def test_a_gateway_started_while_postgres_is_down_serves_completions(
    own_postgres: PostgresServer, make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    url = own_postgres.create_database()
    await asyncio.to_thread(own_postgres.stop)
    gw = await make_gateway(upstream=upstream, store={"url": url}, auth={"master_key": MASTER})
    store = gw.gateway.store
    assert not store.connected.is_set()
    status, _, body = await call(gw, "GET", "/health/ready", MASTER)
    assert status == 200 and body["store"] == "spooling", body
    upstream.push(*[completion("the answer")] * 5)
    client = gw.client(MASTER)
    ids = []
    for i in range(5):
        response = await client.chat.completions.with_raw_response.create(
            model="fake", messages=[{"role": "user", "content": f"question {i}"}]
        )
        assert response.parse().choices[0].message.content == "the answer"
        ids.append(response.headers["X-Conversation-Id"])
    assert store.spooled_bytes() > 0

    await asyncio.to_thread(own_postgres.start)
    await wait_for(lambda: store.connected.is_set() and not store.spooling)
    await gw.flush()
    status, _, body = await call(gw, "GET", "/health/ready", MASTER)
    assert (status, body["store"]) == (200, "ok")
    turns = await rows(url, "SELECT conversation_id FROM turns WHERE ended_at IS NOT NULL")
    assert sorted(t[0] for t in turns) == sorted(ids)
    status, _, body = await call(gw, "GET", f"/v1/conversations/{ids[0]}", MASTER)
    assert status == 200, body
