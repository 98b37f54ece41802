"""The request log of API calls that are no conversation turn (embeddings, images, audio,
moderations, rerank, files, batches): their usage rows, newest first, filtered and paged.

Each call is one usage row (gateway.pipeline.calls): its endpoint, alias, the deployment that
answered (or the first of its plan, for a call that failed on every one), status and error,
duration, what it was billed by and its cost. Pages are keyset on (created_at, id): a row never
shows twice or goes missing between pages, however many land meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.errors import InvalidRequest
from gateway.storage.db import Db
from gateway.storage.store import Store

_COLUMNS = (
    "id, turn_id, created_at, endpoint, alias, deployment, provider, model, status, error,"
    " duration_ms, cost_usd, units, prompt_tokens, completion_tokens, usage_source, team_id,"
    ' key_id, "user"'
)
STATUSES = ("completed", "error")


@dataclass
class CallFilter:
    team_id: str | None = None
    key_id: str | None = None
    endpoint: str | None = None
    status: str | None = None
    model: str | None = None
    id: str | None = None  # the request's X-Request-Id
    since: float | None = None
    until: float | None = None
    limit: int = 50
    after: tuple[float, str] | None = None  # (created_at, id) of the last row seen


def cursor_of(row: dict[str, Any]) -> str:
    return f"{row['created_at']!r}:{row['row_id']}"


def parse_cursor(value: str) -> tuple[float, str]:
    at, sep, ident = value.partition(":")
    try:
        if not sep or not ident:
            raise ValueError
        return float(at), ident
    except ValueError:
        raise InvalidRequest(
            "'after' must be the `cursor` of a previous page.", param="after"
        ) from None


async def list_calls(store: Store, query: CallFilter) -> tuple[list[dict[str, Any]], bool]:
    """A page of calls, newest first, and whether more follow."""
    where = ["endpoint IS NOT NULL"]
    args: list[Any] = []
    for column, value in (
        ("team_id", query.team_id),
        ("key_id", query.key_id),
        ("endpoint", query.endpoint),
        ("status", query.status),
        ("alias", query.model),
        ("turn_id", query.id),
    ):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if query.since is not None:
        where.append("created_at >= ?")
        args.append(query.since)
    if query.until is not None:
        where.append("created_at < ?")
        args.append(query.until)
    if query.after is not None:
        at, ident = query.after
        where.append("(created_at < ? OR (created_at = ? AND id < ?))")
        args += [at, at, ident]
    sql = (
        f"SELECT {_COLUMNS} FROM usage WHERE {' AND '.join(where)}"
        f" ORDER BY created_at DESC, id DESC LIMIT {int(query.limit) + 1}"
    )

    async def read(db: Db) -> list[Any]:
        return list(await db.fetch(sql, *args))

    rows = [_row(r) for r in await store.run(read)]
    return rows[: query.limit], len(rows) > query.limit


def _row(r: Any) -> dict[str, Any]:
    (
        row_id,
        call_id,
        created_at,
        endpoint,
        alias,
        deployment,
        provider,
        model,
        status,
        error,
        duration_ms,
        cost_usd,
        units,
        prompt_tokens,
        completion_tokens,
        usage_source,
        team_id,
        key_id,
        user,
    ) = r
    return {
        "id": call_id,
        "row_id": row_id,
        "object": "gateway.request",
        "created_at": created_at,
        "endpoint": endpoint,
        "model": alias,
        "deployment": deployment,
        "provider": provider,
        "upstream_model": model,
        "status": status,
        "error": error,
        "duration_ms": duration_ms,
        "cost_usd": cost_usd,
        "units": orjson.loads(units) if units else {},
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "usage_source": usage_source,
        "team_id": team_id,
        "key_id": key_id,
        "user": user,
    }
