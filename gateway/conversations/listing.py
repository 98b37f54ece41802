"""Listing conversations for operators: a request log with filters, search, sorts and cursors.

One query, in SQL both SQLite and PostgreSQL accept (the JSON accessor and the text search
differ). A conversation's status is its last turn's outcome: `turn/end` `completed` is
completed, `aborted` (the client left or cancelled) is interrupted, `error` is error, and a turn
still open is active.

What the list sorts and filters by is kept on each conversation's row (gateway.storage.writes):
its attempts' totals and its last activity, so a sort is a scan of one table. `q` is full-text
search over message text: an FTS5 table on SQLite, a stored `tsvector` column on PostgreSQL
(gateway.storage.schema, version 9 and 6). A page continues from a cursor (`after`) that
names its sort, the key of the last row and its id: keyset pagination, stable under ties.
"""

from __future__ import annotations

import base64
import binascii
import re
import time
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.metering.reports import parse_time
from gateway.storage.db import Db, Dialect
from gateway.storage.records import UserMessagePayload
from gateway.storage.schema import SEARCHED_TYPES
from gateway.storage.store import Store

STATUSES = {
    "completed": "completed",
    "interrupted": "aborted",
    "error": "error",
}
_FROM_TURN_STATUS = {turn: shown for shown, turn in STATUSES.items()}
# The statuses a conversation has when any turn had it (the others: its last turn's).
_ANY_TURN = ("interrupted", "error")
MAX_LIMIT = 100
PREVIEW_CHARS = 160
_PARENT_HOPS = 16  # how far up a branch chain the preview is looked for

# Each sort's key, and whether it can be NULL (no attempt had one): NULLs come last in either
# order. TTFT and duration are those `include=usage` shows: the average time to first token
# over the attempts that had one, and the attempts' durations summed.
SORTS: dict[str, tuple[str, bool]] = {
    "created": ("c.created_at", False),
    "updated": ("COALESCE(c.updated_at, c.created_at)", False),
    "cost": ("c.cost_usd", True),
    "tokens": ("(c.prompt_tokens + c.completion_tokens)", False),
    "duration": ("c.duration_ms", True),
    "ttft": ("c.ttft_ms", True),
    "attempts": ("c.attempts", False),
}
_INTEGER_SORTS = {"tokens", "attempts"}
ORDERS = ("desc", "asc")
# Range filters over the same totals: (parameter, column, comparison). A conversation without
# the value (no priced attempt, no attempt) is in no range.
RANGES: dict[str, tuple[str, str]] = {
    "min_cost": ("c.cost_usd", ">="),
    "max_cost": ("c.cost_usd", "<="),
    "min_duration_ms": ("c.duration_ms", ">="),
    "max_duration_ms": ("c.duration_ms", "<="),
    "min_ttft_ms": ("c.ttft_ms", ">="),
    "max_ttft_ms": ("c.ttft_ms", "<="),
}
_CURSOR_PREFIX = "cur1_"


class BadCursor(ValueError):
    """An `after` cursor made for another sort or order, or one that is not the gateway's."""


@dataclass(frozen=True)
class Cursor:
    """Where a page ends: its sort and order, the last row's key and its id."""

    sort: str
    order: str
    value: float | int | None
    id: str

    def encode(self) -> str:
        raw = orjson.dumps([self.sort, self.order, self.value, self.id])
        return _CURSOR_PREFIX + base64.urlsafe_b64encode(raw).decode().rstrip("=")

    @staticmethod
    def decode(text: str) -> Cursor | None:
        """The cursor `text` encodes; None when it is not one (a conversation id, then)."""
        if not text.startswith(_CURSOR_PREFIX):
            return None
        body = text[len(_CURSOR_PREFIX) :]
        try:
            made = orjson.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        except (ValueError, binascii.Error):
            return None
        if not (isinstance(made, list) and len(made) == 4):
            return None
        sort, order, value, id_ = made
        if not (isinstance(sort, str) and sort in SORTS and order in ORDERS):
            raise BadCursor("'after' is a cursor of no sort this list has.")
        integer = sort in _INTEGER_SORTS
        if value is None:
            fits = SORTS[sort][1]
        elif integer:
            fits = type(value) is int and abs(value) < 2**63
        else:
            fits = type(value) in (int, float)
        if not (fits and isinstance(id_, str)):
            raise BadCursor("'after' is not a cursor this list made.")
        return Cursor(sort, order, value if integer or value is None else float(value), id_)


@dataclass(frozen=True)
class ListQuery:
    team_id: str | None = None  # a team key's own team, or the admin's filter
    key_id: str | None = None
    model: str | None = None
    status: str | None = None  # completed | interrupted | error | active
    since: float | None = None
    until: float | None = None
    q: str | None = None  # words, searched in the text of messages
    parent_id: str | None = None  # the branches made from one conversation
    id: str | None = None  # one conversation's row, by its stored id
    lookup: str | None = None  # ... or by the id of one of its turns, responses or requests
    user: str | None = None  # conversations with a turn for a user this is a part of
    id_tail: str | None = None  # ... whose id, or a turn's, ends so (`conv_…3f9a0c1d` as shown)
    metadata: tuple[tuple[str, str], ...] = ()  # (key, value): metadata equality, each
    ranges: tuple[tuple[str, float], ...] = ()  # (a RANGES parameter, its bound)
    sort: str = "created"
    order: str = "desc"
    limit: int = 20
    after: str | Cursor | None = None  # the previous page's cursor, or its last row's id
    with_usage: bool = False  # each row's attempts, tokens, cost and timings (`usage`)
    stopped: bool = False  # only conversations with a turn that ended interrupted, any turn
    failed: bool = False  # only conversations with a failed attempt (a recovered one included)


@dataclass(frozen=True)
class Page:
    data: list[dict[str, Any]]
    has_more: bool
    cursor: str | None = None  # `after` for the next page

    @property
    def last_id(self) -> str | None:
        return self.data[-1]["id"] if self.data else None


def _json_text(dialect: Dialect, column: str, field: str) -> str:
    if dialect == "postgresql":
        # PostgreSQL text holds no NUL, so a `\u0000` escape (stored JSON keeps what a client
        # sent) makes the cast fail, and every search with it: read as U+FFFD there instead.
        return f"(CAST(REPLACE({column}, '\\u0000', '\\ufffd') AS jsonb) ->> '{field}')"
    return f"json_extract({column}, '$.{field}')"


# SQLite's tokenizer (unicode61) keeps letters and digits and splits on everything else.
_WORD = re.compile(r"[^\W_]+")


_POSTGRES_MATCHES = (
    "FROM events e WHERE e.search IS NOT NULL AND e.search @@ plainto_tsquery('gateway_search', ?)"
)
# How `q` and `user`, which name conversations through their messages or turns, find them. At
# most `_FEW_MATCHES` messages or turns match: their conversations are found first and only they
# are sorted. More: the list is walked in its order and each conversation checked until a page
# is full, which the index of the list's order (created, a team's created) keeps short; a sort
# without one checks every conversation, so there the matches come first however many. The count
# is taken rather than left to a planner's guess: a rare word taken for a common one has the walk
# visit every conversation for a page it never fills, a common one taken for rare has every
# match read and sorted.
_FEW_MATCHES = 2000
# On SQLite, a walk checks a conversation's messages against the set of matching messages
# (their rowids, read from the index alone); past this many matches, building that set costs
# more than asking the index about each message walked, which for a word this common finds a
# match within the first few conversations.
_MANY_MATCHES = 50_000
_WALKED_SORTS = ("created",)
_SEARCHED_IN = "(" + ", ".join(f"'{kind}'" for kind in SEARCHED_TYPES) + ")"


@dataclass(frozen=True)
class _Plan:
    """How a page's `q` and `user` find their conversations (`_plan`)."""

    search: str = "first"  # first | walk | probe (SQLite only)
    few: list[str] | None = None  # PostgreSQL: the conversations matching `q`, when few
    user_walk: bool = False
    users: list[str] | None = None  # the users `user` names, when they could be listed


async def _plan(db: Db, query: ListQuery) -> _Plan:
    walked = query.sort in _WALKED_SORTS
    search, few = "first", None
    if query.q and db.dialect == "postgresql":
        few = await _few_matches(db, query.q)
        search = "walk" if few is None and walked else "first"
    elif query.q and walked and _WORD.search(query.q):
        matches = await db.fetchval(
            "SELECT COUNT(*) FROM (SELECT rowid FROM message_text WHERE message_text MATCH ?"
            " LIMIT ?)",
            _fts_match(query.q),
            _MANY_MATCHES + 1,
        )
        if matches > _MANY_MATCHES:
            search = "probe"
        elif matches > _FEW_MATCHES:
            search = "walk"
    user_walk, users = False, None
    if query.user is not None:
        users = await _users(db, query.user)
    if users and walked and db.dialect == "sqlite":
        marks = ", ".join("?" for _ in users)
        turns = await db.fetchval(
            f'SELECT COUNT(*) FROM (SELECT 1 FROM turns WHERE "user" IN ({marks}) LIMIT ?)',
            *users,
            _FEW_MATCHES + 1,
        )
        user_walk = turns > _FEW_MATCHES
    return _Plan(search, few, user_walk, users)


# The user filter names every user its text is a part of (any case): the distinct users are read
# in order through the index of turns' users, one seek each, up to this many; a store with more
# has its turns' users tested one by one instead (a prefix as typed through the index, else a
# scan). Up to `_USERS_LISTED` users so found are a list the index is asked about.
_USERS_READ = 2000
_USERS_LISTED = 200


def _user_column(dialect: Dialect, table: str = "") -> str:
    # Byte order, whatever the database's collation: a prefix's range holds exactly the values
    # that start with it (PostgreSQL's `turns_by_user_bytes` index; SQLite compares bytes).
    column = f'{table}"user"'
    return f'({column} COLLATE "C")' if dialect == "postgresql" else column


async def _users(db: Db, text: str) -> list[str] | None:
    """The users whose name holds `text` (any case); None when there are too many users to read
    them all (`_user_test` then tests each turn's)."""
    column = _user_column(db.dialect)
    rows = await db.fetch(
        f"WITH RECURSIVE u(v, n) AS (SELECT MIN({column}), 1 FROM turns"
        f' WHERE "user" IS NOT NULL UNION ALL SELECT (SELECT MIN({column}) FROM turns'
        f" WHERE {column} > u.v), u.n + 1 FROM u WHERE u.v IS NOT NULL AND u.n <= ?)"
        " SELECT v FROM u WHERE v IS NOT NULL",
        _USERS_READ,
    )
    if len(rows) > _USERS_READ:
        return None
    wanted = text.casefold()
    found = [row[0] for row in rows if wanted in row[0].casefold()]
    return found if len(found) <= _USERS_LISTED else None


def _prefix_end(text: str) -> str:
    """The least string after every string that starts with `text`, in code point order."""
    last = ord(text[-1])
    return text[:-1] + chr(last + 1) if last < 0xD7FF else text + "\U0010ffff"


def _user_test(dialect: Dialect, text: str) -> tuple[str, list[Any]]:
    """A turn `t` whose user starts with `text`, or holds it in any case."""
    column = _user_column(dialect, "t.")
    lowered = 'lower(t."user")'
    holds = f"strpos({lowered}, ?) > 0" if dialect == "postgresql" else f"instr({lowered}, ?) > 0"
    return (
        f"(({column} >= ? AND {column} < ?) OR {holds})",
        [text, _prefix_end(text), text.lower()],
    )


def _id_tail(fragment: str) -> tuple[str, list[Any]]:
    """The conversation whose id, or one of whose turns' ids, ends in the fragment's tail, as the
    list shows ids (`conv_…3f9a0c1d`: a prefix, an ellipsis, the random tail). A scan of the ids,
    which no index orders by their ends."""
    prefix, _, tail = fragment.rpartition("…")
    prefix = prefix.rstrip("_").lower()
    tail = tail.lower()
    pattern = "%" + tail.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    parts, args = [], []
    if prefix in ("", "conv"):
        parts.append("SELECT c2.id FROM conversations c2 WHERE c2.id LIKE ? ESCAPE '\\'")
        args.append(pattern)
    if prefix in ("", "turn"):
        parts.append("SELECT t.conversation_id FROM turns t WHERE t.id LIKE ? ESCAPE '\\'")
        args.append(pattern)
    if not parts or not tail:
        return "1 = 0", []
    return f"c.id IN ({' UNION ALL '.join(parts)})", args


async def _few_matches(db: Db, q: str) -> list[str] | None:
    """On PostgreSQL, the conversations whose messages match `q`, when they are few (found
    through the index); None when they are many."""
    rows = await db.fetch(
        f"SELECT e.conversation_id {_POSTGRES_MATCHES} LIMIT {_FEW_MATCHES + 1}", _tsquery_text(q)
    )
    if len(rows) > _FEW_MATCHES:
        return None
    return list({row[0]: None for row in rows})


def _tsquery_text(q: str) -> str:
    return q.replace("\x00", " ")


def _fts_match(q: str) -> str:
    # Each word a quoted string: FTS5's query syntax (AND, NEAR, *, column filters) is not
    # the user's to write, and a word in quotes is only a word.
    # A word said twice asks nothing more, and costs a scan of its matches again.
    words = dict.fromkeys(word.casefold() for word in _WORD.findall(q))
    return " ".join('"' + word.replace('"', '""') + '"' for word in words)


# SQLite: the rowids of the messages matching, which are their events' rowids; read from the
# index alone, never from the text it keeps.
_SQLITE_MATCHES = "SELECT rowid FROM message_text WHERE message_text MATCH ?"


def _search(dialect: Dialect, q: str, plan: _Plan) -> tuple[str, list[Any]]:
    """A message of the conversation's own holds every word of `q` (stemmed: English)."""
    if dialect == "postgresql":
        if plan.few is not None:
            return "c.id = ANY(?)", [plan.few]
        # Its own parser splits the words, as it did the indexed text (a host name stays one).
        return f"c.id IN (SELECT e.conversation_id {_POSTGRES_MATCHES})", [_tsquery_text(q)]
    if not _WORD.search(q):
        return "1 = 0", []
    match = _fts_match(q)
    if plan.search == "walk":
        return (
            "EXISTS (SELECT 1 FROM events e WHERE e.conversation_id = c.id"
            f" AND e.rowid IN ({_SQLITE_MATCHES}))",
            [match],
        )
    if plan.search == "probe":
        return (
            "EXISTS (SELECT 1 FROM events e, message_text m WHERE e.conversation_id = c.id"
            f" AND e.type IN {_SEARCHED_IN} AND m.rowid = e.rowid AND m.message_text MATCH ?)",
            [match],
        )
    return (
        f"c.id IN (SELECT e.conversation_id FROM events e WHERE e.rowid IN ({_SQLITE_MATCHES}))",
        [match],
    )


def _metadata(dialect: Dialect, key: str, value: str) -> tuple[str, list[Any]]:
    """The conversation's metadata holds `key` with the string `value`. Metadata is stored as
    orjson writes it, so the value's JSON is in its text: looked for first, before the JSON is
    parsed, for the rows that have it."""
    written = orjson.dumps(value).decode()
    if dialect == "postgresql":
        document = "CAST(REPLACE(c.metadata, '\\u0000', '\\ufffd') AS jsonb)"
        return (
            f"(strpos(c.metadata, ?) > 0 AND {document} -> CAST(? AS TEXT)"
            " = to_jsonb(CAST(? AS TEXT)))",
            [written, key, value],
        )
    if '"' in key or "\\" in key:  # not a key a JSON path can quote
        return (
            "(instr(c.metadata, ?) > 0 AND EXISTS (SELECT 1 FROM json_each(c.metadata) m"
            " WHERE m.key = ? AND m.type = 'text' AND m.atom = ?))",
            [written, key, value],
        )
    path = f'$."{key}"'
    return (
        "(instr(c.metadata, ?) > 0 AND json_type(c.metadata, ?) = 'text'"
        " AND json_extract(c.metadata, ?) = ?)",
        [written, path, path, value],
    )


def _lookup(stored: str, value: str) -> tuple[str, list[Any]]:
    """The conversation with the id `stored`, or of the turn, response or request with the id
    `value` (a response's: the one its client was sent, or the provider's own for it): index
    lookups each, their few rows then found by primary key."""
    return (
        "c.id IN (SELECT CAST(? AS TEXT) UNION ALL SELECT t.conversation_id FROM turns t"
        " WHERE t.id = ? UNION ALL SELECT t.conversation_id FROM turns t WHERE t.request_id = ?"
        " UNION ALL SELECT t.conversation_id FROM turns t WHERE t.response_id = ?"
        " UNION ALL SELECT t.conversation_id FROM turns t WHERE t.upstream_id = ?"
        " UNION ALL SELECT r.conversation_id FROM responses r WHERE r.id = ?)",
        [stored, value, value, value, value, value],
    )


_LAST_TURN = (
    "(SELECT t.{col} FROM turns t WHERE t.conversation_id = c.id"
    " ORDER BY t.started_at DESC, t.id DESC LIMIT 1)"
)
_FIRST_USER = (
    "(SELECT e.payload FROM events e WHERE e.conversation_id = {cid}"
    " AND e.type = 'user/message' ORDER BY e.seq LIMIT 1)"
)
_TOTALS = (
    "c.attempts, c.failed_attempts, c.cost_usd, c.unpriced_attempts, c.prompt_tokens,"
    " c.completion_tokens, c.completion_delivered, c.ttft_ms, c.duration_ms"
)


def _sql(
    dialect: Dialect,
    query: ListQuery,
    cursor: tuple[Any, str] | None,
    plan: _Plan = _Plan(),
) -> tuple[str, list[Any]]:
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
    if query.id is not None and query.lookup is not None:
        found, found_args = _lookup(query.id, query.lookup)
        where.append(found)
        args += found_args
    elif query.id is not None:
        where.append("c.id = ?")
        args.append(query.id)
    if query.parent_id is not None:
        where.append("c.parent_id = ?")
        args.append(query.parent_id)
    for key, value in query.metadata:
        found, found_args = _metadata(dialect, key, value)
        where.append(found)
        args += found_args
    for name, bound in query.ranges:
        column, comparison = RANGES[name]
        where.append(f"{column} {comparison} ?")
        args.append(bound)
    if query.id_tail is not None:
        found, found_args = _id_tail(query.id_tail)
        where.append(found)
        args += found_args
    if query.stopped:
        where.append(
            "EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id AND t.status = 'aborted')"
        )
    if query.failed:
        where.append("c.failed_attempts > 0")
    status = _LAST_TURN.format(col="status")
    ended = _LAST_TURN.format(col="ended_at")
    if query.status == "active":
        # Turns that have started and not ended; a conversation with no turn is not active.
        where.append(
            f"EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id) AND {ended} IS NULL"
        )
    elif query.status in _ANY_TURN:
        # Any of its turns, not only the last: a conversation with a stopped first turn is an
        # interrupted one, whatever came after.
        where.append(
            "EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id AND t.status = ?)"
        )
        args.append(STATUSES[query.status])
    elif query.status is not None:
        where.append(f"{status} = ?")
        args.append(STATUSES[query.status])
    key, nullable = SORTS[query.sort]
    direction, beyond = ("DESC", "<") if query.order == "desc" else ("ASC", ">")
    if cursor is not None:
        # The rows after the cursor's in this order: NULL keys last, ties broken by id.
        value, last = cursor
        if value is None:
            where.append(f"({key} IS NULL AND c.id {beyond} ?)")
            args.append(last)
        else:
            later_nulls = f" OR {key} IS NULL" if nullable else ""
            where.append(f"({key} {beyond} ? OR ({key} = ? AND c.id {beyond} ?){later_nulls})")
            args += [value, value, last]
            if not nullable:
                # The same bound alone, which an index on the key can seek to (the OR above
                # it cannot): a page deep in the list starts there, not at the top.
                where.append(f"{key} {beyond}= ?")
                args.append(value)
    # Last, after the cheaper tests of the row itself: on a walk, each is asked of every row
    # the others let through.
    if query.user is not None and plan.users is not None:
        if not plan.users:
            where.append("1 = 0")
        else:
            marks = ", ".join("?" for _ in plan.users)
            if plan.user_walk:
                where.append(
                    f'EXISTS (SELECT 1 FROM turns t WHERE t."user" IN ({marks})'
                    " AND t.conversation_id = c.id)"
                )
            else:
                where.append(
                    f'c.id IN (SELECT t.conversation_id FROM turns t WHERE t."user" IN ({marks}))'
                )
            args += plan.users
    elif query.user is not None:
        found, found_args = _user_test(dialect, query.user)
        where.append(f"c.id IN (SELECT t.conversation_id FROM turns t WHERE {found})")
        args += found_args
    if query.q:
        found, found_args = _search(dialect, query.q, plan)
        where.append(found)
        args += found_args
    nulls_last = f"({key} IS NULL), " if nullable else ""
    # Only the key: the rest of a row is read for the page's rows alone (`_ROWS`), never for
    # every row a sort or a search orders.
    sql = (
        f"SELECT c.id, {key} FROM conversations c WHERE {' AND '.join(where)}"
        f" ORDER BY {nulls_last}{key} {direction}, c.id {direction} LIMIT ?"
    )
    args.append(max(1, min(MAX_LIMIT, query.limit)) + 1)
    return sql, args


_ROWS = (
    "SELECT c.id, c.created_at, c.team_id, c.key_id, c.parent_id, c.parent_seq,"
    " (SELECT COUNT(*) FROM turns t WHERE t.conversation_id = c.id),"
    f" {_LAST_TURN.format(col='status')}, {_LAST_TURN.format(col='ended_at')},"
    f" {_LAST_TURN.format(col='request')}, COALESCE(c.updated_at, c.created_at),"
    f" {_FIRST_USER.format(cid='c.id')}, {_TOTALS},"
    " EXISTS (SELECT 1 FROM turns t WHERE t.conversation_id = c.id AND t.status = 'aborted')"
    " FROM conversations c WHERE c.id IN ({marks})"
)


async def _cursor_of(db: Db, query: ListQuery) -> tuple[Any, str] | None:
    """The key and id the page starts after; None when it starts at the top. A conversation
    id as `after` is looked up (only a row of the team listed counts: another team's id as a
    cursor gives an empty page, and never its key)."""
    after = query.after
    if after is None:
        return None
    if isinstance(after, Cursor):
        return after.value, after.id
    sql = f"SELECT {SORTS[query.sort][0]}, c.id FROM conversations c WHERE c.id = ?"
    args: list[Any] = [after]
    if query.team_id is not None:
        sql += " AND c.team_id = ?"
        args.append(query.team_id)
    row = await db.fetchrow(sql, *args)
    return (row[0], row[1]) if row is not None else _MISSING


_MISSING: tuple[Any, str] = (None, "")  # `after` names no row listed: the page is empty


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
    """A preview of a `user/message` payload's text."""
    if payload is None:
        return None
    message: UserMessagePayload = orjson.loads(payload)
    content = message.get("content")
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


async def list_conversations(store: Store, query: ListQuery, timeout_s: float = 30.0) -> Page:
    """A page of the list, read beside the store's writer and stopped past `timeout_s`
    (`ReadTimeout`)."""
    if query.status is not None and query.status not in (*STATUSES, "active"):
        raise ValueError(f"unknown status {query.status!r}")
    if isinstance(query.after, Cursor) and (query.after.sort, query.after.order) != (
        query.sort,
        query.order,
    ):
        raise BadCursor(
            f"'after' continues sort={query.after.sort}&order={query.after.order}:"
            " ask with that sort and order, or start again without 'after'."
        )
    limit = max(1, min(MAX_LIMIT, query.limit))

    async def op(db: Db) -> tuple[list[Any], dict[str, str | None], bool]:
        cursor = await _cursor_of(db, query)
        if cursor is _MISSING:
            return [], {}, False
        plan = await _plan(db, query)
        sql, args = _sql(db.dialect, query, cursor, plan)
        if plan.search == "walk" and db.dialect == "postgresql":
            # A parallel walk has each worker check conversations ahead of the page's end
            # before the first row comes back, far more than the page needs.
            await db.execute("SET max_parallel_workers_per_gather = 0")
            try:
                keys = await db.fetch(sql, *args)
            finally:
                await db.execute("RESET max_parallel_workers_per_gather")
        else:
            keys = await db.fetch(sql, *args)
        ids = [row[0] for row in keys[:limit]]
        by_id: dict[str, tuple[Any, ...]] = {}
        if ids:
            marks = ", ".join("?" for _ in ids)
            by_id = {row[0]: row for row in await db.fetch(_ROWS.format(marks=marks), *ids)}
        rows = [by_id[id_] + (key,) for id_, key in keys[:limit] if id_ in by_id]
        # A branch without its own user message shows its nearest ancestor's first one.
        previews: dict[str, str | None] = {}
        ancestors: dict[str, tuple[str | None, str | None]] = {}  # id -> (parent, first user)
        for row in rows:
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
        return rows, previews, len(keys) > limit

    rows, inherited, more = await store.read(op, timeout_s, search=query.q is not None)
    data = []
    for row in rows:
        id_, created, team, key, parent, parent_seq, turns, status, ended, request = row[:10]
        last, first_user = row[10:12]
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
                "last_activity": last,
                "preview": _text_of(first_user if first_user is not None else inherited.get(id_)),
                "parent_id": parent,
                "parent_seq": parent_seq,
            }
        )
        if query.with_usage:
            data[-1]["usage"] = _usage_row(row[12:22])
    cursor = None
    if data:
        value = rows[-1][22]
        if value is not None:
            value = int(value) if query.sort in _INTEGER_SORTS else float(value)
        cursor = Cursor(query.sort, query.order, value, data[-1]["id"]).encode()
    return Page(data, has_more=more, cursor=cursor)


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
