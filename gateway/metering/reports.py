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
# What each field of a report row means (docs/api.md, "Usage reports"). Counts of requests are
# turns (an embeddings call is one too), each counted once, in the group and period of its last
# attempt (for `deployment`: the deployment that answered, or last failed); attempts, tokens and
# cost belong to the attempt that made them. Every count of requests is at most `requests`, and
# `failed_attempts` at most `attempts`, so no rate made of them passes 100%.
COLUMNS = [
    "period_start",
    "group",
    "requests",  # turns
    "attempts",  # upstream attempts, the first included
    "failed_attempts",  # attempts that failed (retried, or the request's error)
    "interrupted",  # turns whose answer was cut short by the client
    "errors",  # turns that ended in an error
    "prompt_tokens",
    "completion_tokens",
    "completion_delivered",
    "reasoning_tokens",
    "cached_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "estimated",  # turns with an attempt metered by estimate
    "unpriced_requests",  # turns with an attempt on an unpriced deployment (cost unknown)
    "unpriced_prompt_tokens",  # the tokens of those attempts, which cost_usd leaves out
    "unpriced_completion_tokens",
    "cost_usd",  # the priced attempts' cost; null when none is priced
]
# Cells a spreadsheet would run as a formula when they start with one of these.
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


class UsageStore:
    def __init__(self, store: Store) -> None:
        self._store = store

    def write(self, record: UsageRecord) -> None:
        # A call's row has columns a turn's attempt never fills: written by the longer insert.
        self._store.write("usage" if record.endpoint is None else "call", record.row())

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
            last = "u.attempt = t.last"
            sql = (
                # Each attempt, with its number (its id is `<turn_id>:<number>`).
                f"WITH u AS (SELECT {period} AS period, {column} AS grp, turn_id, status,"
                " usage_source, cost_usd, prompt_tokens, completion_tokens,"
                " completion_delivered, reasoning_tokens, cached_tokens,"
                " COALESCE(cache_write_5m_tokens, 0) AS write_5m,"
                " COALESCE(cache_write_1h_tokens, 0) AS write_1h,"
                " CAST(SUBSTR(id, LENGTH(turn_id) + 2) AS INTEGER) AS attempt"
                f" FROM usage WHERE {where}),"
                # Each turn: its last attempt, and whether any attempt was unpriced or estimated.
                " t AS (SELECT turn_id, MAX(attempt) AS last,"
                " MAX(CASE WHEN cost_usd IS NULL THEN 1 ELSE 0 END) AS unpriced,"
                " MAX(CASE WHEN usage_source <> 'provider'"
                " AND prompt_tokens + completion_tokens > 0 THEN 1 ELSE 0 END) AS estimated"
                " FROM u GROUP BY turn_id)"
                " SELECT u.period, u.grp,"
                f" SUM(CASE WHEN {last} THEN 1 ELSE 0 END),"
                " COUNT(*),"
                " SUM(CASE WHEN u.status = 'error' THEN 1 ELSE 0 END),"
                f" SUM(CASE WHEN {last} AND u.status = 'interrupted' THEN 1 ELSE 0 END),"
                f" SUM(CASE WHEN {last} AND u.status = 'error' THEN 1 ELSE 0 END),"
                " SUM(u.prompt_tokens), SUM(u.completion_tokens), SUM(u.completion_delivered),"
                " SUM(u.reasoning_tokens), SUM(u.cached_tokens), SUM(u.write_5m),"
                " SUM(u.write_1h),"
                f" SUM(CASE WHEN {last} THEN t.estimated ELSE 0 END),"
                f" SUM(CASE WHEN {last} THEN t.unpriced ELSE 0 END),"
                " SUM(CASE WHEN u.cost_usd IS NULL THEN u.prompt_tokens ELSE 0 END),"
                " SUM(CASE WHEN u.cost_usd IS NULL THEN u.completion_tokens ELSE 0 END),"
                " SUM(u.cost_usd)"
                " FROM u JOIN t ON t.turn_id = u.turn_id"
                " GROUP BY u.period, u.grp ORDER BY u.period, u.grp"
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
    """The rows as CSV, every text cell a spreadsheet would run as a formula (`=`, `+`, `-`,
    `@`, a tab or a carriage return first: a key's name, a user) made inert with a `'` first,
    as OWASP advises."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS)
    writer.writeheader()
    writer.writerows({k: _inert(v) for k, v in row.items()} for row in rows)
    return buffer.getvalue()


def _inert(value: Any) -> Any:
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


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
