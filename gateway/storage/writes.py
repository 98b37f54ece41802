"""The writes a turn makes, as plain records, and how each lands in the database.

A write is data rather than a closure so that it can wait in the spool file while the database
is away and be replayed later. Every write is idempotent (keyed by an id, `ON CONFLICT DO
NOTHING`), so a record replayed twice (applied, then the process died before noting it) lands
once.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Literal

import orjson

from gateway.storage.db import Db
from gateway.storage.payload import as_bytes, as_text
from gateway.storage.schema import SEARCHED_CHARS, SEARCHED_TYPES, sqlite_index_new_messages

Kind = Literal[
    "conversation", "turn", "event", "usage", "call", "response", "checkpoint", "checkpoint_part"
]


@dataclass(slots=True)
class Write:
    kind: Kind
    row: dict[str, Any]
    # A message event's text for SQLite's search index, made from its payload while that is
    # still an object (`search_text`; "" when it has none). Never journaled or spooled: a
    # replayed write's is taken out of its payload's JSON by SQL, as a write without it is.
    search: str | None = None
    # Its place while the store's backlog holds it (gateway.storage.backlog): its number in
    # the order of submission, its lane, the length of the JSON it carries. Kept on the write
    # rather than beside it: a tuple a write would be one more object for the collector.
    number: int = 0
    lane: Hashable = None
    weight: int = 0

    def encode(self) -> bytes:
        """One line (the spool's and the journal's), without its newline: the write as JSON,
        then, after a tab, its JSON column (an event's payload, a turn's or a response's
        request) as the text it is. Inside the row it would be a string to escape, every
        quote of it, on every turn; orjson's JSON never holds a raw tab or newline, so the
        first tab on the line is where that text starts."""
        return self.line()[:-1]

    def line(self) -> bytes:
        """`encode()` and its newline, made as one object of its own size: orjson's bytes
        keep a 4 KiB buffer however short they are, and a turn's few held at once while its
        lines were joined added up in RSS with many streams started at once."""
        row = self.row
        column = _RAW.get(self.kind)
        if column is None or (value := row.get(column)) is None:
            return orjson.dumps({"k": self.kind, "r": row}) + b"\n"
        text = value.encode() if value.__class__ is str else bytes(as_bytes(value))
        if b"\n" in text:  # not orjson's: kept escaped inside the row
            return orjson.dumps({"k": self.kind, "r": {**row, column: text.decode()}}) + b"\n"
        rest = row.copy()  # (a copy and a del: a third of a comprehension's cost)
        del rest[column]
        return b"%s\t%s\n" % (orjson.dumps({"k": self.kind, "r": rest}), text)

    @staticmethod
    def decode(line: bytes) -> Write:
        head, tab, text = line.partition(b"\t")
        data = orjson.loads(head)
        kind, row = data["k"], data["r"]
        if tab:
            row[_RAW[kind]] = text.decode()
        return Write(kind, row)  # (a line without a tab: all of it in the row)


# Each kind's column of JSON text, which a spooled line carries after its row.
_RAW: dict[str, str] = {"event": "payload", "turn": "request", "response": "request"}


def _insert(table: str, columns: tuple[str, ...], conflict: str) -> str:
    names = ", ".join(f'"{c}"' for c in columns)
    marks = ", ".join("?" for _ in columns)
    return f"INSERT INTO {table} ({names}) VALUES ({marks}) {conflict}"


_CONVERSATION = (
    "id",
    "created_at",
    "parent_id",
    "parent_seq",
    "team_id",
    "key_id",
    "metadata",
)
_TURN = (
    "id",
    "conversation_id",
    "started_at",
    "request",
    "team_id",
    "key_id",
    "owner",
    "request_id",
    "user",
)
_CHECKPOINT = ("turn_id", "conversation_id", "at", "body")
_CHECKPOINT_PART = ("turn_id", "seq", "at", "body")
_RESPONSE = (
    "id",
    "turn_id",
    "conversation_id",
    "team_id",
    "created_at",
    "request",
    "previous_response_id",
    "store",
)
USAGE_COLUMNS = (
    "id",
    "turn_id",
    "conversation_id",
    "team_id",
    "key_id",
    "user",
    "alias",
    "deployment",
    "provider",
    "model",
    "created_at",
    "status",
    "prompt_tokens",
    "completion_tokens",
    "completion_delivered",
    "reasoning_tokens",
    "cached_tokens",
    "usage_source",
    "cost_usd",
    "ttft_ms",
    "duration_ms",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "audio_prompt_tokens",
    "audio_completion_tokens",
    "prices",
    "price_source",
    "tags",
)
# An API call's usage row (gateway.pipeline.calls): a turn's attempt's columns, and the call's
# endpoint, what it was billed by and its error, which a turn's attempts leave NULL.
CALL_COLUMNS = (*USAGE_COLUMNS, "endpoint", "units", "error")

_SQL = {
    "conversation": _insert("conversations", _CONVERSATION, "ON CONFLICT (id) DO NOTHING"),
    # A turn is inserted with its end (`ended_at`, `status`) when the batch holds that too, else
    # NULLs; one stored already (a replay) takes an end it did not have, and keeps the one it has.
    "turn": _insert(
        "turns",
        (
            *_TURN,
            "ended_at",
            "status",
            "fingerprint",
            "response_id",
            "upstream_id",
            "start_fingerprint",
        ),
        "ON CONFLICT (id) DO UPDATE SET ended_at = COALESCE(excluded.ended_at, turns.ended_at),"
        " status = COALESCE(excluded.status, turns.status),"
        " fingerprint = COALESCE(excluded.fingerprint, turns.fingerprint),"
        " start_fingerprint = COALESCE(excluded.start_fingerprint, turns.start_fingerprint),"
        " response_id = COALESCE(excluded.response_id, turns.response_id),"
        " upstream_id = COALESCE(excluded.upstream_id, turns.upstream_id)",
    ),
    "response": _insert("responses", _RESPONSE, "ON CONFLICT (id) DO NOTHING"),
    # A drained stream's usage replaces the first estimate of the same attempt.
    "usage": _insert(
        "usage",
        USAGE_COLUMNS,
        "ON CONFLICT (id) DO UPDATE SET "
        + ", ".join(f'"{c}" = excluded."{c}"' for c in USAGE_COLUMNS if c != "id"),
    ),
    "call": _insert("usage", CALL_COLUMNS, "ON CONFLICT (id) DO NOTHING"),
    # A stream's delivery checkpoint, spooled while the database does not take writes
    # (Store.save_checkpoints); written straight to the database otherwise.
    "checkpoint": _insert(
        "turn_checkpoints",
        _CHECKPOINT,
        "ON CONFLICT (turn_id) DO UPDATE SET at = excluded.at, body = excluded.body",
    ),
    "checkpoint_part": _insert(
        "turn_checkpoint_parts", _CHECKPOINT_PART, "ON CONFLICT (turn_id, seq) DO NOTHING"
    ),
}
_COLUMNS: dict[str, tuple[str, ...]] = {
    "conversation": _CONVERSATION,
    "turn": _TURN,
    "response": _RESPONSE,
    "usage": USAGE_COLUMNS,
    "call": CALL_COLUMNS,
    "checkpoint": _CHECKPOINT,
    "checkpoint_part": _CHECKPOINT_PART,
}
# A row's values in its columns' order, in one C call rather than a generator of `.get`s (usage
# has 23 columns), on the store's thread, which waits for the loop's GIL between steps.
_VALUES = {kind: itemgetter(*columns) for kind, columns in _COLUMNS.items()}

# The next seq of a conversation: after its own last event, or after its branch point. The
# payload comes as its JSON text, or as that text's UTF-8 bytes: CAST stores either as the same
# text. In SQLite, a long stream's payload is in `event_payloads` (`payload_id`), written
# there by the backend before its event (gateway.storage.sqlite), and `payload` is empty.
_EVENT_INSERT = (
    "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload, uid{})"
    " VALUES (?, COALESCE((SELECT MAX(seq) FROM events WHERE conversation_id = ?),"
    " (SELECT parent_seq FROM conversations WHERE id = ?), 0) + 1, ?, ?, ?, CAST(? AS TEXT), ?{})"
    " ON CONFLICT (uid) DO NOTHING"
)
_EVENT = {
    "sqlite": _EVENT_INSERT.format(", payload_id", ", ?"),
    "postgresql": _EVENT_INSERT.format("", ""),
}
_END_TURN = (
    "UPDATE turns SET ended_at = ?, status = ?, fingerprint = ?, response_id = ?,"
    " upstream_id = ?, start_fingerprint = ? WHERE id = ?"
)
_NOT_ENDED = (None, None, None, None, None, None)
# A truncate's: where the turn now ends, and (for an answer that completed, shown only in part)
# where it began, which history repair looks its turn up by; kept when the event has none.
_FINGERPRINT = (
    "UPDATE turns SET fingerprint = ?, start_fingerprint = COALESCE(?, start_fingerprint)"
    " WHERE id = ?"
)
# A conversation's totals over its attempts' usage records, which the list sorts and filters by
# (gateway.conversations.listing). On SQLite, a batch whose usage records are all new adds each
# to its conversation's totals (`_ADD_USAGE`), a record at a time in the order they were
# written, which is the order SQL sums them in, so the two agree to the last bit; the time to
# first token is kept as a sum and a count beside its average for that. The totals are made
# again from the rows (`_USAGE_TOTALS`), which costs in the conversation's length, only when a
# batch rewrites a record (a drained stream's usage replacing its estimate, a replayed write),
# and on PostgreSQL, whose driver does not say how many rows an insert took (and where that
# work is the database server's, not the gateway's).
_USAGE_TOTALS = (
    "UPDATE conversations SET (attempts, failed_attempts, cost_usd, unpriced_attempts,"
    " prompt_tokens, completion_tokens, completion_delivered, ttft_ms, ttft_sum_ms,"
    " ttft_attempts, duration_ms) ="
    " (SELECT COUNT(*), COALESCE(SUM(CASE WHEN u.status = 'error' THEN 1 ELSE 0 END), 0),"
    " SUM(u.cost_usd), COALESCE(SUM(CASE WHEN u.cost_usd IS NULL THEN 1 ELSE 0 END), 0),"
    " COALESCE(SUM(u.prompt_tokens), 0), COALESCE(SUM(u.completion_tokens), 0),"
    " COALESCE(SUM(u.completion_delivered), 0), AVG(u.ttft_ms), SUM(u.ttft_ms),"
    " COUNT(u.ttft_ms), SUM(u.duration_ms)"
    " FROM usage u WHERE u.conversation_id = ?) WHERE id = ?"
)
# SQLite's only (numbered parameters): a new usage record added to its conversation's totals,
# and the conversation's last activity raised with it when the batch has some (`_ACTIVITY`).
_ADD_USAGE = (
    "UPDATE conversations SET attempts = attempts + 1, failed_attempts = failed_attempts + ?1,"
    " cost_usd = CASE WHEN ?2 IS NULL THEN cost_usd ELSE COALESCE(cost_usd, 0) + ?2 END,"
    " unpriced_attempts = unpriced_attempts + (?2 IS NULL), prompt_tokens = prompt_tokens + ?3,"
    " completion_tokens = completion_tokens + ?4,"
    " completion_delivered = completion_delivered + ?5,"
    " ttft_ms = CASE WHEN ?6 IS NULL THEN ttft_ms"
    " ELSE (COALESCE(ttft_sum_ms, 0) + ?6) / (ttft_attempts + 1) END,"
    " ttft_sum_ms = CASE WHEN ?6 IS NULL THEN ttft_sum_ms ELSE COALESCE(ttft_sum_ms, 0) + ?6 END,"
    " ttft_attempts = ttft_attempts + (?6 IS NOT NULL),"
    " duration_ms = CASE WHEN ?7 IS NULL THEN duration_ms ELSE COALESCE(duration_ms, 0) + ?7 END,"
    " updated_at = CASE WHEN ?8 IS NOT NULL AND (updated_at IS NULL OR updated_at < ?8) THEN ?8"
    " ELSE updated_at END"
    " WHERE id = ?9"
)
# The usage records of a batch, inserted only where new: how many were tells whether the
# totals can be added to.
_NEW_USAGE = _insert("usage", USAGE_COLUMNS, "ON CONFLICT (id) DO NOTHING")


async def _write_usage(
    db: Db, group: list[Write], rows: list[tuple[Any, ...]], activity: dict[str, float]
) -> list[str]:
    """A batch's usage records written, and their conversations' totals kept (and, where
    they are added to, the batch's `activity` for those conversations applied and taken out of
    it): the conversations whose totals must be made again from their rows."""
    if db.dialect == "sqlite" and await db.executemany(_NEW_USAGE, rows) == len(rows):
        added = []
        for write in reversed(group):  # the activity goes with a conversation's last record
            row = write.row
            cid = row["conversation_id"]
            added.append(
                (
                    row["status"] == "error",
                    row["cost_usd"],
                    row["prompt_tokens"] or 0,
                    row["completion_tokens"] or 0,
                    row["completion_delivered"] or 0,
                    row["ttft_ms"],
                    row["duration_ms"],
                    activity.pop(cid, None),
                    cid,
                )
            )
        added.reverse()
        await db.executemany(_ADD_USAGE, added)
        return []
    await db.executemany(_SQL["usage"], rows)  # those already there, rewritten
    return sorted({w.row["conversation_id"] for w in group})


# Its last activity, the latest start or end of its turns: raised as each lands (a replayed
# one raises it to what it is already).
_ACTIVITY = (
    "UPDATE conversations SET updated_at = ?"
    " WHERE id = ? AND (updated_at IS NULL OR updated_at < ?)"
)


def _activity_of(turns: list[dict[str, Any]], ends: list[dict[str, Any]]) -> dict[str, float]:
    """The latest turn start or end a batch writes, per conversation: from the rows of its
    turns and of its turns' ends."""
    latest: dict[str, float] = {}
    for rows, column in ((turns, "started_at"), (ends, "created_at")):
        for row in rows:
            cid, at = row["conversation_id"], row[column]
            if cid not in latest or at > latest[cid]:
                latest[cid] = at
    return latest


async def _keep_totals(db: Db, remade: list[str], activity: dict[str, float]) -> None:
    """`remade`: the conversations whose usage totals are made again from their rows, in one
    order (two PostgreSQL replicas updating the same rows lock them in the same order), as is
    `activity`, what is left of the batch's."""
    if remade:
        await db.executemany(_USAGE_TOTALS, [(cid, cid) for cid in remade])
    if activity:
        await db.executemany(_ACTIVITY, [(at, cid, at) for cid, at in sorted(activity.items())])


async def keep_usage_totals(db: Db, conversation_ids: list[str]) -> None:
    """These conversations' totals made again from their usage rows (a row changed in place:
    gateway.conversations.truncate)."""
    await db.executemany(_USAGE_TOTALS, [(cid, cid) for cid in sorted(conversation_ids)])


_ORDER: tuple[Kind, ...] = (
    "conversation",
    "turn",
    "event",
    "usage",
    "call",
    "response",
    "checkpoint",
    "checkpoint_part",
)


async def apply_batch(db: Db, writes: list[Write]) -> None:
    """A batch in one transaction, one statement per kind (executemany): rows a turn's
    events need (its conversation, its turn) go first; events keep their order, which is what
    gives them their seqs."""
    if len(writes) == 1:
        await apply(db, writes[0])
        return
    by_kind: dict[str, list[Write]] = {}
    for write in writes:
        by_kind.setdefault(write.kind, []).append(write)
    # The batch's turn ends, by turn: a turn whose start is in the batch is inserted ended
    # (no UPDATE after it, and never in the index of open turns); the others are updated.
    end_rows = [w.row for w in by_kind.get("event", ()) if w.row["type"] == "turn/end"]
    ends = {row["turn_id"]: _end_args(row) for row in end_rows}
    remade: list[str] = []
    activity = _activity_of([w.row for w in by_kind.get("turn", ())], end_rows)
    for kind in _ORDER:
        group = by_kind.get(kind)
        if not group:
            continue
        if kind == "usage":
            remade = await _write_usage(db, group, _values(kind, group), activity)
        elif kind != "event":
            rows = _values(kind, group)
            if kind == "turn":  # and its end, if the batch has it
                rows = [v + ends.pop(v[0], _NOT_ENDED)[:6] for v in rows]
            await db.executemany(_SQL[kind], rows)
        else:
            rows = [_event_args(w.row, db.dialect) for w in group]
            await db.executemany(_EVENT[db.dialect], rows)
            if db.dialect == "sqlite":
                await _index_events(db, group)
            if ends:
                # Unconditional (unlike `apply`): setting the same end twice changes nothing.
                await db.executemany(_END_TURN, list(ends.values()))
            refingerprinted = [_fingerprint_args(w.row) for w in group if _refingerprints(w.row)]
            if refingerprinted:
                await db.executemany(_FINGERPRINT, refingerprinted)
    await _keep_totals(db, remade, activity)


def _values(kind: Kind, group: list[Write]) -> list[tuple[Any, ...]]:
    values = _VALUES[kind]
    try:
        return [values(w.row) for w in group]
    except KeyError:  # a row spooled by an older gateway, before a column was added: NULL
        columns = _COLUMNS[kind]
        return [tuple(w.row.get(c) for c in columns) for w in group]


def _event_args(row: dict[str, Any], dialect: str) -> tuple[Any, ...]:
    cid = row["conversation_id"]  # three times: the row, and the two lookups of its next seq
    payload = row["payload"]
    if dialect == "sqlite":  # (binds bytes as they are), and where a long payload went
        return (cid, cid, cid, row["turn_id"], row["type"], row["created_at"], payload,
                row["uid"], row.get("payload_id"))  # fmt: skip
    text = payload if isinstance(payload, str) else as_text(payload)
    return (cid, cid, cid, row["turn_id"], row["type"], row["created_at"], text, row["uid"])


def _refingerprints(row: dict[str, Any]) -> bool:
    """An event after its turn's end that changes the history the turn ended with (a
    truncate): the turn's fingerprint follows it."""
    return row["type"] != "turn/end" and row.get("fingerprint") is not None


def _fingerprint_args(row: dict[str, Any]) -> tuple[Any, ...]:
    return (row["fingerprint"], row.get("start_fingerprint"), row["turn_id"])


def _end_args(row: dict[str, Any]) -> tuple[Any, ...]:
    return (
        row["created_at"],
        row.get("status"),
        row.get("fingerprint"),
        row.get("response_id"),
        row.get("upstream_id"),
        row.get("start_fingerprint"),
        row["turn_id"],
    )


def _searched(row: dict[str, Any]) -> bool:
    return row["type"] in SEARCHED_TYPES


def search_text(payload: Mapping[str, Any]) -> str:
    """A message's text as SQLite's search index holds it: what the schema's SQL takes out of
    its payload's JSON (gateway.storage.schema), taken out of the payload object instead,
    which costs a fraction of SQLite parsing the JSON of a long answer three times over."""
    content = payload.get("content")
    if isinstance(content, list):
        content = " ".join(
            text
            for block in content
            if isinstance(block, dict)
            and block.get("type") != "reasoning"
            and isinstance(text := block.get("text"), str)
        )
    elif not isinstance(content, str):
        return ""
    return content[:SEARCHED_CHARS]


# An event's given text into the search index, under the event's rowid. Not guarded against a
# second time like the statement for a replay: a batch's events are new (a duplicate rowid
# fails the batch, which is then applied one write at a time, `apply`).
_INDEX_TEXT = (
    "INSERT INTO message_text (rowid, text, conversation_id)"
    " VALUES ((SELECT rowid FROM events WHERE uid = ?), ?, ?)"
)


async def _index_events(db: Db, events: list[Write]) -> None:
    """SQLite: the text of a batch's message events into the search index, given where it was
    made with the event, else taken out of the stored payload (PostgreSQL makes its own, a
    generated column)."""
    given = []
    uids = []
    for write in events:
        text = write.search
        if text is None:
            if _searched(write.row):
                uids.append(write.row["uid"])
        elif text:
            given.append((write.row["uid"], text, write.row["conversation_id"]))
    if given:
        await db.executemany(_INDEX_TEXT, given)
    await _index_messages(db, uids)


async def _index_messages(db: Db, uids: list[str]) -> None:
    """SQLite: the text of these message events, taken out of their payloads, into the search
    index, those not indexed yet."""
    for start in range(0, len(uids), _INDEXED_AT_ONCE):
        some = uids[start : start + _INDEXED_AT_ONCE]
        await db.execute(sqlite_index_new_messages(len(some)), *some)


_INDEXED_AT_ONCE = 500  # uids a statement, well under any build's limit of parameters


async def apply(db: Db, write: Write) -> None:
    row = write.row
    if write.kind == "event":
        inserted = await db.execute(_EVENT[db.dialect], *_event_args(row, db.dialect))
        if inserted and db.dialect == "sqlite":
            await _index_events(db, [write])
        if inserted and row["type"] == "turn/end":
            await db.execute(_END_TURN, *_end_args(row))
        elif inserted and _refingerprints(row):
            await db.execute(_FINGERPRINT, *_fingerprint_args(row))
    else:
        values = [row.get(c) for c in _COLUMNS[write.kind]]
        if write.kind == "turn":
            values += _NOT_ENDED  # a turn alone: its end comes with its turn/end
        await db.execute(_SQL[write.kind], *values)
    remade = [row["conversation_id"]] if write.kind == "usage" else []
    ended = write.kind == "event" and row["type"] == "turn/end"
    activity = _activity_of([row] if write.kind == "turn" else [], [row] if ended else [])
    await _keep_totals(db, remade, activity)
