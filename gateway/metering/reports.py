"""Usage records in the store, and the grouped reports read from them."""

from __future__ import annotations

import csv
import io
import sqlite3
from datetime import UTC, datetime
from typing import Any

from gateway.conversations.sqlite import SQLiteStore
from gateway.metering.usage import UsageRecord

GROUPS = {
    "team": "team_id",
    "key": "key_id",
    "user": "user",
    "model": "alias",
    "deployment": "deployment",
}
GRANULARITY = {"hour": 3600, "day": 86400}
COLUMNS = [
    "period_start",
    "group",
    "requests",
    "interrupted",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "completion_delivered",
    "reasoning_tokens",
    "cached_tokens",
    "estimated",
    "cost_usd",
]


class UsageStore:
    def __init__(self, store: SQLiteStore) -> None:
        self._store = store

    def write(self, record: UsageRecord) -> None:
        row = record.row()
        columns = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        values = tuple(row.values())
        self._store.submit(
            lambda db: db.execute(
                f"INSERT OR REPLACE INTO usage ({columns}) VALUES ({marks})", values
            )
        )

    async def spent(self, kind: str, ident: str, since: float) -> float:
        """USD recorded for a key or team since a time (what a budget has used)."""
        column = "key_id" if kind == "key" else "team_id"

        def op(db: sqlite3.Connection) -> float:
            row = db.execute(
                "SELECT COALESCE(SUM(cost_usd), 0) FROM usage"
                f" WHERE {column} = ? AND created_at >= ?",
                (ident, since),
            ).fetchone()
            return float(row[0])

        return await self._store.call(op)

    async def report(
        self,
        *,
        group_by: str,
        start: float,
        end: float,
        granularity: str,
        team_id: str | None,
    ) -> list[dict[str, Any]]:
        column = GROUPS[group_by]
        bucket = GRANULARITY[granularity]
        where = "created_at >= ? AND created_at < ?"
        args: list[Any] = [start, end]
        if team_id is not None:
            where += " AND team_id = ?"
            args.append(team_id)
        sql = (
            f"SELECT CAST(created_at / {bucket} AS INTEGER) * {bucket} AS period, {column},"
            " COUNT(DISTINCT turn_id),"
            " SUM(status = 'interrupted'), SUM(status = 'error'),"
            " SUM(prompt_tokens), SUM(completion_tokens), SUM(completion_delivered),"
            " SUM(reasoning_tokens), SUM(cached_tokens), SUM(usage_source = 'estimated'),"
            " SUM(cost_usd)"
            f" FROM usage WHERE {where} GROUP BY period, {column} ORDER BY period, {column}"
        )

        def op(db: sqlite3.Connection) -> list[dict[str, Any]]:
            out = []
            for row in db.execute(sql, args):
                record = dict(zip(COLUMNS, row, strict=True))
                record["period_start"] = datetime.fromtimestamp(row[0], UTC).isoformat()
                record["cost_usd"] = round(row[-1], 10) if row[-1] is not None else None
                out.append(record)
            return out

        return await self._store.call(op)


def to_csv(rows: list[dict[str, Any]]) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()


def parse_time(value: str | None, default: float) -> float:
    """Unix seconds, or an ISO 8601 date or time (UTC when no zone is given)."""
    if value is None or value == "":
        return default
    try:
        return float(value)
    except ValueError:
        pass
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
