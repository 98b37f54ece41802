"""Listing conversations for operators: filters, search and cursor pagination.

One query, in SQL both SQLite and PostgreSQL accept (only the JSON accessor differs), newest
first. A conversation's status is its last turn's outcome: `turn/end` `completed` is
completed, `aborted` (the client left or cancelled) is interrupted, `error` is error, and a turn
still open is active.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.metering.reports import parse_time
from gateway.storage.db import Db, Dialect
from gateway.storage.store import Store

STATUSES = {
    "completed": "completed",
    "interrupted": "aborted",
    "error": "error",
}
_FROM_TURN_STATUS = {turn: shown for shown, turn in STATUSES.items()}
MAX_LIMIT = 100
PREVIEW_CHARS = 160
_PARENT_HOPS = 16  # how far up a branch chain the preview is looked for


@dataclass(frozen=True)
class ListQuery:
    team_id: str | None = None  # a team key's own team, or the admin's filter
    key_id: str | None = None
    model: str | None = None
    status: str | None = None  # completed | interrupted | error | active
    since: float | None = None
    until: float | None = None
    q: str | None = None
    parent_id: str | None = None  # the branches made from one conversation
    id: str | None = None  # one conversation's row
    limit: int = 20
    after: str | None = None  # the last id of the previous page
    with_usage: bool = False  # each row's attempts, tokens, cost and timings (`usage`)
    stopped: bool = False  # only conversations with a turn that ended interrupted, any turn
    failed: bool = False  # only conversations with a failed attempt (a recovered one included)


@dataclass(frozen=True)
class Page:
    data: list[dict[str, Any]]
    has_more: bool

    @property
    def last_id(self) -> str | None:
        return self.data[-1]["id"] if self.data else None


def _json_text(dialect: Dialect, column: str, field: str) -> str:
    if dialect == "postgresql":
        # PostgreSQL text holds no NUL, so a `\u0000` escape (stored JSON keeps what a client
        # sent) makes the cast fail, and every search with it: read as U+FFFD there instead.
        return f"(CAST(REPLACE({column}, '\\u0000', '\\ufffd') AS jsonb) ->> '{field}')"
    return f"json_extract({column}, '$.{field}')"


def _like(value: str) -> str:
    escaped = value.lower().replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


_LAST_TURN = (
    "(SELECT t.{col} FROM turns t WHERE t.conversation_id = c.id"
    " ORDER BY t.started_at DESC, t.id DESC LIMIT 1)"
)
# A turn's attempts: their usage records' ids are `<turn_id>:<attempt>`, so the range is a
# primary-key range scan per turn (turns are found by their conversation index), and `turn_id =
# t.id` keeps exactly the turn's records whatever the collation orders `:` among. No scan of the
# usage table, on either backend.
_TURN_ATTEMPTS = (
    "turns t {join} usage u ON u.id >= t.id || ':' AND u.id <= t.id || ':99999'"
    " AND u.turn_id = t.id"
)
_FIRST_USER = (
    "(SELECT e.payload FROM events e WHERE e.conversation_id = {cid}"
    " AND e.type = 'user/message' ORDER BY e.seq LIMIT 1)"
)


def _sql(dialect: Dialect, query: ListQuery) -> tuple[str, list[Any]]:
    where = ["c.deleted_at IS NULL"]
    args: list[Any] = []
    if query.team_id is not None:
        where.append("c.team_id = ?")
        args.append(query.team_id)
    if query.key_id is not None:
        where.append(
            "(c.key_id = ? OR EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id"
            " AND t.key_id = ?))"
        )
        args += [query.key_id, query.key_id]
    if query.model is not None:
        model = _json_text(dialect, "t.request", "model")
        where.append(
            f"EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id AND {model} = ?)"
        )
        args.append(query.model)
    if query.since is not None:
        where.append("c.created_at >= ?")
        args.append(query.since)
    if query.until is not None:
        where.append("c.created_at < ?")
        args.append(query.until)
    if query.id is not None:
        where.append("c.id = ?")
        args.append(query.id)
    if query.parent_id is not None:
        where.append("c.parent_id = ?")
        args.append(query.parent_id)
    if query.q:
        pattern = _like(query.q)
        content = _json_text(dialect, "e.payload", "content")
        # The first user message of the conversation itself, or (a branch) of its parent.
        # Or exactly a turn's id or a response's id: the conversation it belongs to (primary-key
        # lookups, made once).
        where.append(
            "(LOWER(c.id) LIKE ? ESCAPE '\\' OR EXISTS (SELECT 1 FROM events e"
            " WHERE e.conversation_id IN (c.id, c.parent_id) AND e.type = 'user/message'"
            " AND e.seq = (SELECT MIN(f.seq) FROM events f WHERE f.conversation_id ="
            " e.conversation_id AND f.type = 'user/message')"
            f" AND LOWER({content}) LIKE ? ESCAPE '\\')"
            " OR c.id IN (SELECT t.conversation_id FROM turns t WHERE t.id = ?)"
            " OR c.id IN (SELECT r.conversation_id FROM responses r WHERE r.id = ?))"
        )
        args += [pattern, pattern, query.q.strip(), query.q.strip()]
    if query.stopped:
        where.append(
            "EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id AND t.status = 'aborted')"
        )
    if query.failed:
        attempts = _TURN_ATTEMPTS.format(join="JOIN")
        where.append(
            f"EXISTS (SELECT 1 FROM {attempts} WHERE t.conversation_id = c.id"
            " AND u.status = 'error')"
        )
    status = _LAST_TURN.format(col="status")
    ended = _LAST_TURN.format(col="ended_at")
    if query.status == "active":
        # Turns that have started and not ended; a conversation with no turn is not active.
        where.append(
            f"EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id) AND {ended} IS NULL"
        )
    elif query.status is not None:
        where.append(f"{status} = ?")
        args.append(STATUSES[query.status])
    if query.after is not None:
        # Newest first, ties broken by id: the page after the row with this id. Only a row
        # of the team listed counts (another team's id as a cursor gives an empty page, and
        # never its creation time).
        cursor = "SELECT a.created_at FROM conversations a WHERE a.id = ?"
        cursor_args: list[Any] = [query.after]
        if query.team_id is not None:
            cursor += " AND a.team_id = ?"
            cursor_args.append(query.team_id)
        where.append(f"(c.created_at < ({cursor}) OR (c.created_at = ({cursor}) AND c.id < ?))")
        args += [*cursor_args, *cursor_args, query.after]
    sql = (
        "SELECT c.id, c.created_at, c.team_id, c.key_id, c.parent_id, c.parent_seq,"
        " (SELECT COUNT(*) FROM turns t WHERE t.conversation_id = c.id),"
        f" {status}, {ended}, {_LAST_TURN.format(col='request')},"
        " (SELECT MAX(COALESCE(t.ended_at, t.started_at)) FROM turns t"
        " WHERE t.conversation_id = c.id),"
        f" {_FIRST_USER.format(cid='c.id')}"
        f" FROM conversations c WHERE {' AND '.join(where)}"
        " ORDER BY c.created_at DESC, c.id DESC LIMIT ?"
    )
    args.append(max(1, min(MAX_LIMIT, query.limit)) + 1)
    return sql, args


# Each listed conversation's own turns, with their attempts' usage records.
_USAGE_OF_PAGE = (
    "SELECT t.conversation_id, COUNT(u.id),"
    " SUM(CASE WHEN u.status = 'error' THEN 1 ELSE 0 END),"
    " SUM(u.cost_usd), SUM(CASE WHEN u.id IS NOT NULL AND u.cost_usd IS NULL THEN 1 ELSE 0 END),"
    " SUM(u.prompt_tokens), SUM(u.completion_tokens), SUM(u.completion_delivered),"
    " AVG(u.ttft_ms), SUM(u.duration_ms),"
    " MAX(CASE WHEN t.status = 'aborted' THEN 1 ELSE 0 END)"
    f" FROM {_TURN_ATTEMPTS.format(join='LEFT JOIN')}"
    " WHERE t.conversation_id IN ({marks}) GROUP BY t.conversation_id"
)
_NO_USAGE = {
    "attempts": 0,
    "failed_attempts": 0,
    "cost_usd": None,
    "unpriced_attempts": 0,
    "prompt_tokens": 0,
    "completion_tokens": 0,
    "completion_delivered": 0,
    "ttft_ms": None,
    "duration_ms": None,
    "stopped_turn": False,
}


def _usage_row(row: Any) -> dict[str, Any]:
    attempts, failed, cost, unpriced, prompt, completion, delivered, ttft, duration, stopped = row
    return {
        "attempts": int(attempts or 0),
        "failed_attempts": int(failed or 0),
        "cost_usd": None if cost is None else float(cost),
        "unpriced_attempts": int(unpriced or 0),
        "prompt_tokens": int(prompt or 0),
        "completion_tokens": int(completion or 0),
        "completion_delivered": int(delivered or 0),
        "ttft_ms": None if ttft is None else float(ttft),
        "duration_ms": None if duration is None else float(duration),
        "stopped_turn": bool(stopped),
    }


def _text_of(payload: str | None) -> str | None:
    if payload is None:
        return None
    content = orjson.loads(payload).get("content")
    if isinstance(content, list):
        content = " ".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    if not isinstance(content, str):
        return None
    text = " ".join(content.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


def _model_of(request: str | None) -> str | None:
    if request is None:
        return None
    model = orjson.loads(request).get("model")
    return model if isinstance(model, str) else None


async def list_conversations(store: Store, query: ListQuery) -> Page:
    if query.status is not None and query.status not in (*STATUSES, "active"):
        raise ValueError(f"unknown status {query.status!r}")
    limit = max(1, min(MAX_LIMIT, query.limit))

    async def op(db: Db) -> tuple[list[Any], dict[str, str | None], dict[str, dict[str, Any]]]:
        sql, args = _sql(db.dialect, query)
        rows = await db.fetch(sql, *args)
        usage: dict[str, dict[str, Any]] = {}
        if query.with_usage and rows[:limit]:
            page_ids = [row[0] for row in rows[:limit]]
            marks = ", ".join("?" for _ in page_ids)
            for totals in await db.fetch(_USAGE_OF_PAGE.format(marks=marks), *page_ids):
                usage[totals[0]] = _usage_row(totals[1:])
        # A branch without its own user message shows its nearest ancestor's first one.
        previews: dict[str, str | None] = {}
        ancestors: dict[str, tuple[str | None, str | None]] = {}  # id -> (parent, first user)
        for row in rows[:limit]:
            parent, hops = row[4], 0
            while row[11] is None and parent is not None and hops < _PARENT_HOPS:
                if parent not in ancestors:
                    found = await db.fetchrow(
                        "SELECT c.parent_id, "
                        + _FIRST_USER.format(cid="c.id")
                        + " FROM conversations c WHERE c.id = ?",
                        parent,
                    )
                    ancestors[parent] = (found[0], found[1]) if found else (None, None)
                grandparent, first_user = ancestors[parent]
                if first_user is not None:
                    previews[row[0]] = first_user
                    break
                parent, hops = grandparent, hops + 1
        return rows, previews, usage

    rows, inherited, usage = await store.run(op)
    data = []
    for row in rows[:limit]:
        (
            id_,
            created,
            team,
            key,
            parent,
            parent_seq,
            turns,
            status,
            ended,
            request,
            last,
            first_user,
        ) = row
        open_turn = turns and ended is None
        data.append(
            {
                "id": id_,
                "object": "conversation",
                "created_at": created,
                "team_id": team,
                "key_id": key,
                "model": _model_of(request),
                "status": "active" if open_turn else _FROM_TURN_STATUS.get(status, status),
                "turns": int(turns),
                "last_activity": last if last is not None else created,
                "preview": _text_of(first_user if first_user is not None else inherited.get(id_)),
                "parent_id": parent,
                "parent_seq": parent_seq,
            }
        )
        if query.with_usage:
            data[-1]["usage"] = usage.get(id_, _NO_USAGE)
    return Page(data, has_more=len(rows) > limit)


async def attempt_usage(store: Store, conversation_ids: list[str]) -> list[dict[str, Any]]:
    """The usage records (one per attempt) of some conversations, oldest first."""
    if not conversation_ids:
        return []
    columns = (
        "id, turn_id, conversation_id, alias, deployment, provider, model, created_at, status,"
        " prompt_tokens, completion_tokens, completion_delivered, reasoning_tokens,"
        " cached_tokens, usage_source, cost_usd, ttft_ms, duration_ms"
    )
    names = [c.strip() for c in columns.split(",")]
    marks = ", ".join("?" for _ in conversation_ids)

    async def op(db: Db) -> list[dict[str, Any]]:
        rows = await db.fetch(
            f"SELECT {columns} FROM usage WHERE conversation_id IN ({marks})"
            " ORDER BY created_at, id",
            *conversation_ids,
        )
        return [dict(zip(names, row, strict=True)) for row in rows]

    return await store.run(op)


def parse_when(value: str | None) -> float | None:
    """Unix seconds or an ISO 8601 date or time (UTC without a zone); None when absent."""
    if value is None or value == "":
        return None
    return parse_time(value, time.time())
