"""Usage records in the store, and the grouped reports read from them."""

from __future__ import annotations

import csv
import io
import math
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

from gateway.metering.usage import UsageRecord
from gateway.storage.db import Db
from gateway.storage.store import Store

GROUPS = {
    "team": "team_id",
    "key": "key_id",
    "user": '"user"',
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
    def __init__(self, store: Store) -> None:
        self._store = store

    def write(self, record: UsageRecord) -> None:
        self._store.write("usage", record.row())

    async def spent(self, kind: str, ident: str, since: float) -> float:
        """USD recorded for a key or team since a time (what a budget has used)."""
        column = "key_id" if kind == "key" else "team_id"

        async def op(db: Db) -> float:
            value = await db.fetchval(
                f"SELECT COALESCE(SUM(cost_usd), 0) FROM usage WHERE {column} = ?"
                " AND created_at >= ?",
                ident,
                since,
            )
            return float(value)

        return await self._store.run(op)

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

        async def op(db: Db) -> list[dict[str, Any]]:
            # Truncate to the bucket: SQLite's integer CAST truncates, PostgreSQL's rounds.
            floor = "FLOOR" if db.dialect == "postgresql" else ""
            period = f"CAST({floor}(created_at / {bucket}) AS BIGINT) * {bucket}"
            sql = (
                f"SELECT {period} AS period, {column},"
                " COUNT(DISTINCT turn_id),"
                " SUM(CASE WHEN status = 'interrupted' THEN 1 ELSE 0 END),"
                " SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END),"
                " SUM(prompt_tokens), SUM(completion_tokens), SUM(completion_delivered),"
                " SUM(reasoning_tokens), SUM(cached_tokens),"
                " SUM(CASE WHEN usage_source = 'estimated' THEN 1 ELSE 0 END),"
                " SUM(cost_usd)"
                f" FROM usage WHERE {where} GROUP BY period, {column} ORDER BY period, {column}"
            )
            out = []
            for row in await db.fetch(sql, *args):
                record = dict(zip(COLUMNS, (_plain(v) for v in row), strict=True))
                record["period_start"] = datetime.fromtimestamp(row[0], UTC).isoformat()
                record["cost_usd"] = round(row[-1], 10) if row[-1] is not None else None
                out.append(record)
            return out

        return await self._store.run(op)


def _plain(value: Any) -> Any:
    """PostgreSQL's SUM of integers is a Decimal: report plain ints like SQLite does."""
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    return value


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
        seconds = float(value)
    except ValueError:
        pass
    else:
        # nan and inf parse as floats, and were echoed into the JSON answer as bare NaN and
        # Infinity, which is not JSON: a 400 instead.
        if not math.isfinite(seconds):
            raise ValueError(f"not a finite time: {value!r}")
        return seconds
    moment = datetime.fromisoformat(value)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
