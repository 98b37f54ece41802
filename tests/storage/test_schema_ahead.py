"""A store whose schema is newer than this code (a newer release migrated it, then was rolled
back) is never written to. `gateway serve` and `gateway migrate` on such a store exit 1 saying
so (tests/test_cli_ops.py). Here, the case only a replica started during a store outage meets:
PostgreSQL comes back already migrated by a newer release. The replica keeps its writes in the
spool, `/health/ready` answers 503 with the reason, and what needs the store answers 503
`store_unavailable`, as docs/operations.md says."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import aiohttp
import asyncpg
import pytest

from gateway.config import parse_config
from gateway.storage import schema
from gateway.storage.backends import make_backend
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.postgres_server import PostgresServer, throwaway_postgres


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A cluster of this test's own: it is stopped and started again."""
    with throwaway_postgres("gw-pg-ahead-") as server:
        yield server


async def get(gw: GatewayUnderTest, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(gw.url + path) as response:
        return response.status, await response.json()


async def test_a_replica_that_meets_a_newer_schema_late_keeps_spooling_and_is_not_ready(
    own_postgres: PostgresServer, make_gateway: MakeGateway
) -> None:
    url = own_postgres.create_database()
    # Migrated by this release, then by a newer one.
    backend = make_backend(parse_config({"store": {"url": url}}).config.store)
    await backend.start()
    try:
        await backend.transact(schema.migrate)
    finally:
        await backend.close()
    newer = schema.latest("postgresql") + 1
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES ($1, 'future', 0)",
            newer,
        )
    finally:
        await connection.close()

    await asyncio.to_thread(own_postgres.stop)
    gw = await make_gateway(store={"url": url})
    store = gw.gateway.store
    status, body = await get(gw, "/health/ready")
    assert status == 200, body  # started during the outage: ready, spooling
    answer = await gw.client().chat.completions.create(
        model="demo", messages=[{"role": "user", "content": "hello"}]
    )
    assert answer.choices[0].message.content
    await store.flush()
    assert store.spooling and store.spooled_bytes() > 0

    await asyncio.to_thread(own_postgres.start)
    async with asyncio.timeout(30):  # the replica tries to connect again, backing off to 5 s
        while (await get(gw, "/health/ready"))[0] == 200:
            await asyncio.sleep(0.1)
    status, body = await get(gw, "/health/ready")
    assert status == 503
    assert f"schema version {newer}, newer than this gateway knows" in body["error"]["message"]
    status, body = await get(gw, "/v1/usage")
    assert (status, body["error"]["code"]) == (503, "store_unavailable")

    # Nothing went into the newer schema: the turn waits in the spool.
    assert store.spooling and store.spooled_bytes() > 0
    connection = await asyncpg.connect(url)
    try:
        assert await connection.fetchval("SELECT count(*) FROM events") == 0
    finally:
        await connection.close()
