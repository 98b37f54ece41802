"""`python -m bench.store_scale`: do the store's reads stay fast at millions of rows?

Fills a throwaway PostgreSQL (or `--url`) with `--events` events over conversations of 10
events each and `--usage` usage rows over 50 teams and 90 days, through the real schema
migrations, then times the two reads that must not grow with the table: one conversation's
events, and one team's usage report for a month. Prints each query's plan and median time.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time

import asyncpg

from gateway.config import StoreConfig
from gateway.metering.reports import UsageStore
from gateway.storage.backends import make_store


async def main(url: str, events: int, usage: int) -> None:
    store = make_store(StoreConfig(url=url, spool_path=tempfile.mkdtemp()), "bench")
    await store.start()
    conn = await asyncpg.connect(url)
    conversations = events // 10
    t0 = time.perf_counter()
    await conn.execute(
        "INSERT INTO conversations (id, created_at, team_id)"
        " SELECT 'c' || i, 1.7e9 + i, 'team' || (i % 50) FROM generate_series(1, $1) i",
        conversations,
    )
    await conn.execute(
        "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload, uid)"
        " SELECT 'c' || (i / 10 + 1), i % 10 + 1, 't' || (i / 2), 'user/message', 1.7e9 + i,"
        ' \'{"role":"user","content":"hello there"}\', \'u\' || i'
        " FROM generate_series(0, $1 - 1) i",
        events,
    )
    await conn.execute(
        "INSERT INTO usage (id, turn_id, conversation_id, team_id, key_id, alias, deployment,"
        " provider, model, created_at, status, prompt_tokens, completion_tokens,"
        " completion_delivered, reasoning_tokens, cached_tokens, usage_source, cost_usd)"
        " SELECT 'u' || i, 't' || i, 'c' || (i % 1000), 'team' || (i % 50), 'key' || (i % 500),"
        " 'gpt', 'dep' || (i % 4), 'openai', 'm', 1.7e9 + (i::float / $1) * 90 * 86400,"
        " 'completed', 100, 50, 50, 0, 0, 'provider', 0.001 FROM generate_series(0, $1 - 1) i",
        usage,
    )
    await conn.execute("ANALYZE")
    print(
        f"filled {events:,} events, {conversations:,} conversations, {usage:,} usage rows"
        f" in {time.perf_counter() - t0:.1f} s"
    )
    middle = f"c{conversations // 2}"
    plan = await conn.fetch(
        "EXPLAIN SELECT seq, turn_id, type, created_at, payload FROM events"
        " WHERE conversation_id = $1 AND seq <= $2 ORDER BY seq",
        middle,
        2**62,
    )
    print("events plan:", " | ".join(r[0].strip() for r in plan))
    month_start = 1.7e9 + 30 * 86400
    plan = await conn.fetch(
        "EXPLAIN SELECT count(*) FROM usage WHERE created_at >= $1 AND created_at < $2"
        " AND team_id = $3",
        month_start,
        month_start + 30 * 86400,
        "team7",
    )
    print("usage plan: ", " | ".join(r[0].strip() for r in plan))
    await conn.close()

    async def timed(make: object, n: int) -> float:
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await make()  # type: ignore[operator]
            times.append((time.perf_counter() - t) * 1000)
        return statistics.median(times)

    reads = await timed(lambda: store.events(middle), 50)
    reports = UsageStore(store)
    report = await timed(
        lambda: reports.report(
            group_by="model",
            start=month_start,
            end=month_start + 30 * 86400,
            granularity="day",
            team_id="team7",
        ),
        10,
    )
    print(f"one conversation's 10 events: median {reads:.2f} ms")
    print(f"one team's month of usage ({usage // 50 // 3:,} rows), by day: median {report:.1f} ms")
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", help="an empty PostgreSQL database (default: a throwaway one)")
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--usage", type=int, default=1_000_000)
    args = parser.parse_args()
    if args.url:
        asyncio.run(main(args.url, args.events, args.usage))
    else:
        from tests.postgres_server import throwaway_postgres

        with throwaway_postgres("gw-scale-") as server:
            asyncio.run(main(server.create_database(), args.events, args.usage))
