"""Usage records one by one, for a bill: every upstream attempt and API call in a time range,
with the names of its team and key, what it was charged at, and the request's metadata tags.

Read in pages by (created_at, id), so that a year's export holds one page in memory, and each
page is written to the client as it comes (gateway.http.usage_export). Every record is one
row, so the rows sum to exactly what `/v1/usage` reports for the same range and team.
"""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import orjson

from gateway.metering.reports import inert
from gateway.storage.db import Db, Row
from gateway.storage.store import Store

PAGE = 1000
# A row of the export, in its order (docs/api.md, "Usage export").
FIELDS = (
    "created_at",
    "id",
    "turn_id",
    "conversation_id",
    "team_id",
    "team_name",
    "key_id",
    "key_name",
    "user",
    "endpoint",
    "model",
    "deployment",
    "provider",
    "upstream_model",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "reasoning_tokens",
    "cached_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "audio_prompt_tokens",
    "audio_completion_tokens",
    "completion_delivered",
    "cost_usd",
    "usage_source",
    "price_source",
    "prices",
    "tags",
)
_SELECT = (
    "SELECT u.created_at, u.id, u.turn_id, u.conversation_id, u.team_id, t.name, u.key_id,"
    ' k.name, u."user", u.endpoint, u.alias, u.deployment, u.provider, u.model, u.status,'
    " u.prompt_tokens, u.completion_tokens, u.reasoning_tokens, u.cached_tokens,"
    " COALESCE(u.cache_write_5m_tokens, 0), COALESCE(u.cache_write_1h_tokens, 0),"
    " COALESCE(u.audio_prompt_tokens, 0), COALESCE(u.audio_completion_tokens, 0),"
    " u.completion_delivered, u.cost_usd, u.usage_source, u.price_source, u.prices, u.tags"
    " FROM usage u LEFT JOIN teams t ON t.id = u.team_id LEFT JOIN keys k ON k.id = u.key_id"
    " WHERE u.created_at >= ? AND u.created_at < ?"
)


async def records(
    store: Store, start: float, end: float, team_id: str | None
) -> AsyncIterator[list[dict[str, Any]]]:
    """The usage records of [start, end) (of one team, or all), oldest first, a page at a
    time. A record written meanwhile with a time the export has passed is not in it."""
    team = " AND u.team_id = ?" if team_id is not None else ""
    teams = [team_id] if team_id is not None else []
    after: tuple[float, str] | None = None
    while True:
        args: list[Any] = [start, end, *teams]
        page = ""
        if after is not None:
            page = " AND (u.created_at > ? OR (u.created_at = ? AND u.id > ?))"
            args += [after[0], after[0], after[1]]
        sql = f"{_SELECT}{team}{page} ORDER BY u.created_at, u.id LIMIT {PAGE}"

        async def op(db: Db, sql: str = sql, args: list[Any] = args) -> list[Row]:
            return await db.fetch(sql, *args)

        rows = await store.run(op)
        if not rows:
            return
        yield [_record(row) for row in rows]
        if len(rows) < PAGE:
            return
        after = (rows[-1][0], rows[-1][1])


def _record(row: Row) -> dict[str, Any]:
    record = dict(zip(FIELDS, row, strict=True))
    record["created_at"] = datetime.fromtimestamp(row[0], UTC).isoformat()
    record["endpoint"] = row[9] or "turn"  # a turn's attempt; else the API call's endpoint
    for name in ("prices", "tags"):
        value = record[name]
        record[name] = orjson.loads(value) if value else None
    return record


def jsonl(page: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(record) + b"\n" for record in page)


def csv_header() -> bytes:
    return (",".join(FIELDS) + "\r\n").encode()


def csv_rows(page: list[dict[str, Any]]) -> bytes:
    """Each record as a CSV line; its prices and tags as their JSON, and every text cell a
    spreadsheet would run as a formula made inert (gateway.metering.reports.inert)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    for record in page:
        writer.writerow(
            [inert(orjson.dumps(v).decode() if isinstance(v, dict) else v) for v in record.values()]
        )
    return buffer.getvalue().encode()
