"""A store outage in the middle of a load: requests keep succeeding, writes wait in the spool,
and once PostgreSQL is back every turn is there exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import asyncpg
import pytest

from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream, completion
from tests.postgres_server import PostgresServer, throwaway_postgres


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A cluster of this test's own: it is stopped and started again."""
    with throwaway_postgres("gw-pg-outage-") as server:
        yield server


async def wait_for(condition: object, timeout: float = 30) -> None:
    async with asyncio.timeout(timeout):
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def test_postgres_stopped_mid_load_loses_and_duplicates_nothing(
    own_postgres: PostgresServer, make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    url = own_postgres.create_database()
    gw = await make_gateway(upstream=upstream, store={"url": url})
    store = gw.gateway.store
    client = gw.client()
    finished: list[tuple[str, str]] = []  # (conversation id, answer)
    phase = {"n": 0}
    outage_started = asyncio.Event()
    resume = asyncio.Event()

    async def one(i: int) -> None:
        response = await client.chat.completions.with_raw_response.create(
            model="fake", messages=[{"role": "user", "content": f"question {i}"}]
        )
        completion = response.parse()
        finished.append(
            (response.headers["X-Conversation-Id"], completion.choices[0].message.content or "")
        )

    async def worker(w: int) -> None:
        for k in range(30):
            await one(w * 1000 + k)
            phase["n"] += 1
            if phase["n"] == 40:
                outage_started.set()
            if phase["n"] >= 120 and not resume.is_set():
                await resume.wait()

    upstream.push(*[completion("the answer")] * 180)
    workers = [asyncio.create_task(worker(w)) for w in range(6)]
    await outage_started.wait()
    await asyncio.to_thread(own_postgres.stop)
    await wait_for(lambda: store.spooling)  # the writer noticed, and spools
    await wait_for(lambda: phase["n"] >= 120)  # requests went on succeeding meanwhile
    spooled = store.spooled_bytes()
    assert spooled > 0
    await asyncio.to_thread(own_postgres.start)
    resume.set()
    await asyncio.gather(*workers)
    await wait_for(lambda: not store.spooling)
    await gw.flush()

    assert len(finished) == 180
    assert all(answer == "the answer" for _, answer in finished)
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch(
            "SELECT conversation_id, type, count(*) FROM events GROUP BY conversation_id, type"
        )
        turns = await connection.fetchval("SELECT count(*) FROM turns WHERE ended_at IS NOT NULL")
        usage = await connection.fetchval("SELECT count(*) FROM usage")
    finally:
        await connection.close()
    per_conversation: dict[str, dict[str, int]] = {}
    for cid, kind, count in rows:
        per_conversation.setdefault(cid, {})[kind] = count
    expected = {"user/message": 1, "assistant/message": 1, "turn/end": 1}
    assert set(per_conversation) == {cid for cid, _ in finished}
    assert all(kinds == expected for kinds in per_conversation.values()), per_conversation
    assert turns == 180
    assert usage == 180
