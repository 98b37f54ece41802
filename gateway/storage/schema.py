"""Versioned schema migrations, one list per database.

`schema_migrations` records each applied version. `gateway migrate` applies what is pending
(and so does every start unless `store.migrate_on_start` is off); a store whose schema is
behind the code refuses to start rather than fail on its first write. Migrations only add:
a version, once shipped, never changes.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import orjson

from gateway import scrub
from gateway.storage.db import Db, Dialect

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]
    # A data step, run after the statements in the same transaction.
    run: Callable[[Db], Awaitable[None]] | None = None


_SQLITE_V1 = (
    """CREATE TABLE IF NOT EXISTS conversations (
        id TEXT PRIMARY KEY, created_at REAL NOT NULL, parent_id TEXT, parent_seq INTEGER,
        team_id TEXT, key_id TEXT, metadata TEXT, deleted_at REAL)""",
    """CREATE TABLE IF NOT EXISTS turns (
        id TEXT PRIMARY KEY, conversation_id TEXT NOT NULL, started_at REAL NOT NULL,
        ended_at REAL, status TEXT, request TEXT NOT NULL, team_id TEXT, key_id TEXT)""",
    """CREATE TABLE IF NOT EXISTS teams (
        id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at REAL NOT NULL,
        metadata TEXT NOT NULL, limits TEXT)""",
    """CREATE TABLE IF NOT EXISTS keys (
        id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL,
        team_id TEXT NOT NULL, created_at REAL NOT NULL, name TEXT, "user" TEXT, models TEXT,
        expires_at REAL, revoked_at REAL, metadata TEXT NOT NULL, limits TEXT)""",
    "CREATE INDEX IF NOT EXISTS keys_by_team ON keys (team_id)",
    """CREATE TABLE IF NOT EXISTS usage (
        id TEXT PRIMARY KEY, turn_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
        team_id TEXT, key_id TEXT, "user" TEXT, alias TEXT, deployment TEXT NOT NULL,
        provider TEXT NOT NULL, model TEXT NOT NULL, created_at REAL NOT NULL,
        status TEXT NOT NULL, prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
        completion_delivered INTEGER NOT NULL, reasoning_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL, usage_source TEXT NOT NULL, cost_usd REAL,
        ttft_ms REAL, duration_ms REAL)""",
    "CREATE INDEX IF NOT EXISTS usage_by_time ON usage (created_at)",
    """CREATE TABLE IF NOT EXISTS responses (
        id TEXT PRIMARY KEY, turn_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
        team_id TEXT, created_at REAL NOT NULL, request TEXT NOT NULL,
        previous_response_id TEXT, store INTEGER NOT NULL, deleted_at REAL)""",
    "CREATE INDEX IF NOT EXISTS usage_by_team ON usage (team_id, created_at)",
    "CREATE INDEX IF NOT EXISTS turns_by_conversation ON turns (conversation_id, started_at)",
    """CREATE TABLE IF NOT EXISTS events (
        conversation_id TEXT NOT NULL, seq INTEGER NOT NULL, turn_id TEXT NOT NULL,
        type TEXT NOT NULL, created_at REAL NOT NULL, payload TEXT NOT NULL,
        PRIMARY KEY (conversation_id, seq)) WITHOUT ROWID""",
)

# Files made before versioned migrations lack some columns that v1 now creates.
SQLITE_LEGACY_COLUMNS = (
    ("conversations", "team_id", "TEXT"),
    ("conversations", "key_id", "TEXT"),
    ("turns", "team_id", "TEXT"),
    ("turns", "key_id", "TEXT"),
    ("teams", "limits", "TEXT"),
    ("conversations", "metadata", "TEXT"),
    ("conversations", "deleted_at", "REAL"),
    ("keys", "limits", "TEXT"),
)

_SQLITE_V2 = (
    # Idempotent event writes (the spool may replay one) and turn ownership across processes.
    "ALTER TABLE events ADD COLUMN uid TEXT",
    "CREATE UNIQUE INDEX events_uid ON events (uid)",
    "ALTER TABLE turns ADD COLUMN owner TEXT",
    "CREATE INDEX turns_open ON turns (owner) WHERE ended_at IS NULL",
    """CREATE TABLE instances (
        id TEXT PRIMARY KEY, started_at REAL NOT NULL, heartbeat_at REAL NOT NULL)""",
    "CREATE INDEX usage_by_key ON usage (key_id, created_at)",
    "CREATE INDEX conversations_by_time ON conversations (created_at)",
    "CREATE INDEX conversations_by_team ON conversations (team_id, created_at)",
)

_SQLITE_V3 = (
    # A long stream's payload (megabytes of JSON), written piece by piece through SQLite's
    # incremental blob I/O: bound whole, SQLite would copy it three times on the way to its
    # pages. That needs a rowid table, which `events` was not (until v4). Its event's own
    # `payload` is ''.
    "CREATE TABLE event_payloads (id INTEGER PRIMARY KEY, body BLOB NOT NULL)",
    "ALTER TABLE events ADD COLUMN payload_id INTEGER",
)

_SQLITE_V4 = (
    # `events` as a rowid table, its key an index beside it. A WITHOUT ROWID table keeps its
    # rows in key order, so a turn of an older conversation is written into the middle of the
    # table, and it keeps at most ~1 KB of a row in its page, the rest spilt to overflow
    # pages: answers are rows of kilobytes. As a rowid table the file is about a third smaller
    # and a turn's events cost the writer a third less CPU, while a conversation's history
    # reads as fast (docs/decisions.md, "Events in a rowid table").
    """CREATE TABLE events_v4 (
        conversation_id TEXT NOT NULL, seq INTEGER NOT NULL, turn_id TEXT NOT NULL,
        type TEXT NOT NULL, created_at REAL NOT NULL, payload TEXT NOT NULL, uid TEXT,
        payload_id INTEGER)""",
    """INSERT INTO events_v4
        (conversation_id, seq, turn_id, type, created_at, payload, uid, payload_id)
        SELECT conversation_id, seq, turn_id, type, created_at, payload, uid, payload_id
        FROM events ORDER BY created_at, conversation_id, seq""",
    "DROP TABLE events",
    "ALTER TABLE events_v4 RENAME TO events",
    "CREATE UNIQUE INDEX events_by_conversation ON events (conversation_id, seq)",
    "CREATE UNIQUE INDEX events_uid ON events (uid)",
)

# Automatic threading (gateway.conversations.threading): each turn's end fingerprint, looked
# up by value, the newest first. Partial: turns without one (no answer, threading off) stay out.
_FINGERPRINTS = (
    "ALTER TABLE turns ADD COLUMN fingerprint TEXT",
    "CREATE INDEX turns_by_fingerprint ON turns (fingerprint, ended_at)"
    " WHERE fingerprint IS NOT NULL",
)

# History repair without a header (gateway.conversations.threading): an interrupted answer's
# turn is found by the history it began with too. Partial: only interrupted turns have one.
_START_FINGERPRINTS = (
    "ALTER TABLE turns ADD COLUMN start_fingerprint TEXT",
    "CREATE INDEX turns_by_start_fingerprint ON turns (start_fingerprint, ended_at)"
    " WHERE start_fingerprint IS NOT NULL",
)


# Audio tokens inside a usage record's counts, which its audio prices bill: a report re-rates the
# record by them. NULL in a record written before (no audio counted then).
def _audio_counts(integer: str) -> tuple[str, ...]:
    return (
        f"ALTER TABLE usage ADD COLUMN audio_prompt_tokens {integer} DEFAULT 0",
        f"ALTER TABLE usage ADD COLUMN audio_completion_tokens {integer} DEFAULT 0",
    )


# A conversation's time to first token as a sum and a count beside its average, so that a new
# usage record is added to its totals rather than all of them read again (gateway.storage.writes).
def _ttft_sums(real: str, integer: str) -> tuple[str, ...]:
    return (
        f"ALTER TABLE conversations ADD COLUMN ttft_sum_ms {real}",
        f"ALTER TABLE conversations ADD COLUMN ttft_attempts {integer} NOT NULL DEFAULT 0",
        "UPDATE conversations SET (ttft_sum_ms, ttft_attempts) = (SELECT SUM(u.ttft_ms),"
        " COUNT(u.ttft_ms) FROM usage u WHERE u.conversation_id = conversations.id)"
        " WHERE attempts > 0",
    )


# Prompt tokens written to a provider's cache, by how long they stay (Anthropic's 5-minute and
# 1-hour writes), each at its own price. Nullable with a default: a usage row spooled by an
# older gateway, before these columns, is replayed with NULLs, which reports sum as nothing.
_CACHE_WRITES_SQLITE = (
    "ALTER TABLE usage ADD COLUMN cache_write_5m_tokens INTEGER DEFAULT 0",
    "ALTER TABLE usage ADD COLUMN cache_write_1h_tokens INTEGER DEFAULT 0",
)
_CACHE_WRITES_POSTGRES = (
    "ALTER TABLE usage ADD COLUMN cache_write_5m_tokens BIGINT DEFAULT 0",
    "ALTER TABLE usage ADD COLUMN cache_write_1h_tokens BIGINT DEFAULT 0",
)

# Secrets out of the rows stored before the gateway scrubbed them (gateway.scrub): key-shaped
# tokens out of the error records at once (`scrub_stored_tokens`); the configured secrets out
# of every event at each start whose set of secrets has not been scrubbed for yet
# (`scrub_configured`), each set recorded here as a salted scrypt digest, never the secrets.
_SECRET_SCRUBS = (
    """CREATE TABLE secret_scrubs (
        salt TEXT NOT NULL, digest TEXT NOT NULL, scrubbed_at DOUBLE PRECISION NOT NULL)""",
)

# What the client of each open turn had been delivered, as of its owner's last checkpoint: how
# a restart or a peer closes a turn whose process died with it (docs/operations.md, "Stopping
# and crashing"). A row lives only while its turn is open.
_CHECKPOINTS = (
    """CREATE TABLE turn_checkpoints (
        turn_id TEXT PRIMARY KEY, conversation_id TEXT NOT NULL,
        at DOUBLE PRECISION NOT NULL, body TEXT NOT NULL)""",
)

# PostgreSQL starts at the current shape. Times are Unix seconds (double precision) as in
# SQLite, so every query reads the same on both.
_POSTGRES_V1 = (
    """CREATE TABLE conversations (
        id TEXT PRIMARY KEY, created_at DOUBLE PRECISION NOT NULL, parent_id TEXT,
        parent_seq BIGINT, team_id TEXT, key_id TEXT, metadata TEXT,
        deleted_at DOUBLE PRECISION)""",
    "CREATE INDEX conversations_by_time ON conversations (created_at)",
    "CREATE INDEX conversations_by_team ON conversations (team_id, created_at)",
    """CREATE TABLE turns (
        id TEXT PRIMARY KEY, conversation_id TEXT NOT NULL,
        started_at DOUBLE PRECISION NOT NULL, ended_at DOUBLE PRECISION, status TEXT,
        request TEXT NOT NULL, team_id TEXT, key_id TEXT, owner TEXT)""",
    "CREATE INDEX turns_by_conversation ON turns (conversation_id, started_at)",
    "CREATE INDEX turns_open ON turns (owner) WHERE ended_at IS NULL",
    """CREATE TABLE events (
        conversation_id TEXT NOT NULL, seq BIGINT NOT NULL, turn_id TEXT NOT NULL,
        type TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, payload TEXT NOT NULL,
        uid TEXT, PRIMARY KEY (conversation_id, seq))""",
    "CREATE UNIQUE INDEX events_uid ON events (uid)",
    """CREATE TABLE teams (
        id TEXT PRIMARY KEY, name TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        metadata TEXT NOT NULL, limits TEXT)""",
    """CREATE TABLE keys (
        id TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, prefix TEXT NOT NULL,
        team_id TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL, name TEXT, "user" TEXT,
        models TEXT, expires_at DOUBLE PRECISION, revoked_at DOUBLE PRECISION,
        metadata TEXT NOT NULL, limits TEXT)""",
    "CREATE INDEX keys_by_team ON keys (team_id)",
    """CREATE TABLE usage (
        id TEXT PRIMARY KEY, turn_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
        team_id TEXT, key_id TEXT, "user" TEXT, alias TEXT, deployment TEXT NOT NULL,
        provider TEXT NOT NULL, model TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,
        status TEXT NOT NULL, prompt_tokens BIGINT NOT NULL, completion_tokens BIGINT NOT NULL,
        completion_delivered BIGINT NOT NULL, reasoning_tokens BIGINT NOT NULL,
        cached_tokens BIGINT NOT NULL, usage_source TEXT NOT NULL,
        cost_usd DOUBLE PRECISION, ttft_ms DOUBLE PRECISION, duration_ms DOUBLE PRECISION)""",
    "CREATE INDEX usage_by_time ON usage (created_at)",
    "CREATE INDEX usage_by_team ON usage (team_id, created_at)",
    "CREATE INDEX usage_by_key ON usage (key_id, created_at)",
    """CREATE TABLE responses (
        id TEXT PRIMARY KEY, turn_id TEXT NOT NULL, conversation_id TEXT NOT NULL,
        team_id TEXT, created_at DOUBLE PRECISION NOT NULL, request TEXT NOT NULL,
        previous_response_id TEXT, store INTEGER NOT NULL, deleted_at DOUBLE PRECISION)""",
    """CREATE TABLE instances (
        id TEXT PRIMARY KEY, started_at DOUBLE PRECISION NOT NULL,
        heartbeat_at DOUBLE PRECISION NOT NULL)""",
)

# -- secrets in stored rows ------------------------------------------------------------------------

# The events an upstream's error text is recorded in (docs/recording.md, "Order inside a turn").
_ERROR_EVENTS = ("assistant/attempt", "request/error")
_PAYLOAD_OF = {
    "sqlite": "CASE WHEN payload_id IS NULL THEN payload"
    " ELSE (SELECT body FROM event_payloads WHERE id = payload_id) END",
    "postgresql": "payload",
}
_CONTAINS = {"sqlite": "instr(payload, ?) > 0", "postgresql": "strpos(payload, ?) > 0"}
_SCRYPT = {"n": 2**14, "r": 8, "p": 1, "dklen": 32}


async def scrub_stored_tokens(db: Db) -> None:
    """Key-shaped tokens (`sk-...`, `gw-...`, `AIza...`, `Bearer ...`) out of the error text
    of every stored `assistant/attempt` and `request/error`: the message, and the stream's
    in-stream error events. What else those hold (the text an attempt received) is left."""
    payload = _PAYLOAD_OF[db.dialect]
    kinds = ", ".join("?" for _ in _ERROR_EVENTS)
    rows = await db.fetch(
        f"SELECT conversation_id, seq, type, {payload} FROM events WHERE type IN ({kinds})",
        *_ERROR_EVENTS,
    )
    changed = 0
    for conversation_id, seq, kind, stored in rows:
        text = bytes(stored).decode() if isinstance(stored, bytes | memoryview) else stored
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError:
            continue
        cleaned = _scrub_error_payload(kind, value)
        if cleaned is value:
            continue
        await _rewrite(db, conversation_id, seq, orjson.dumps(cleaned).decode())
        changed += 1
    if changed:
        log.info("scrubbed key-shaped tokens from %d stored error events", changed)


def _scrub_error_payload(kind: str, payload: Any) -> Any:
    """The same object when nothing in it changes."""
    if not isinstance(payload, dict):
        return payload
    if kind == "request/error":
        message = payload.get("message")
        if isinstance(message, str) and (cleaned := scrub.scrub(message)) != message:
            return {**payload, "message": cleaned}
        return payload
    stream = payload.get("stream")
    if not isinstance(stream, list):
        return payload
    records = [
        scrub.scrub_json(r) if isinstance(r, dict) and r.get("type") == "error" else r
        for r in stream
    ]
    if all(a is b for a, b in zip(records, stream, strict=True)):
        return payload
    return {**payload, "stream": records}


async def _rewrite(db: Db, conversation_id: str, seq: int, payload: str) -> None:
    if db.dialect == "sqlite":
        long_id = await db.fetchval(
            "SELECT payload_id FROM events WHERE conversation_id = ? AND seq = ?",
            conversation_id,
            seq,
        )
        if long_id is not None:
            await db.execute(
                "UPDATE event_payloads SET body = ? WHERE id = ?", payload.encode(), long_id
            )
            return
    await db.execute(
        "UPDATE events SET payload = ? WHERE conversation_id = ? AND seq = ?",
        payload,
        conversation_id,
        seq,
    )


async def scrub_configured(db: Db, secrets: Iterable[str]) -> None:
    """The configured secrets (gateway.scrub) out of every stored event, once for each set of
    them: a set already scrubbed for (the last recorded) is not looked for again. A store
    without events has nothing to scrub, and records nothing."""
    found = sorted(set(secrets))
    if not found or await db.fetchval("SELECT 1 FROM events LIMIT 1") is None:
        return
    last = await db.fetchrow(
        "SELECT salt, digest FROM secret_scrubs ORDER BY scrubbed_at DESC LIMIT 1"
    )
    if last is not None and _digest(found, last[0]) == last[1]:
        return
    changed = 0
    for secret in found:
        # As stored: JSON text, where a quote or a backslash in a secret is escaped.
        for form in {secret, orjson.dumps(secret).decode()[1:-1]}:
            changed += await db.execute(
                "UPDATE events SET payload = replace(payload, ?, ?) WHERE " + _CONTAINS[db.dialect],
                form,
                scrub.REDACTED,
                form,
            )
            if db.dialect == "sqlite":
                changed += await db.execute(
                    "UPDATE event_payloads SET body = CAST(replace(CAST(body AS TEXT), ?, ?)"
                    " AS BLOB) WHERE instr(body, CAST(? AS BLOB)) > 0",
                    form,
                    scrub.REDACTED,
                    form,
                )
    salt = os.urandom(16).hex()
    await db.execute(
        "INSERT INTO secret_scrubs (salt, digest, scrubbed_at) VALUES (?, ?, ?)",
        salt,
        _digest(found, salt),
        time.time(),
    )
    log.info("scrubbed the configured secrets from the store (%d rows changed)", changed)


def _digest(secrets: list[str], salt: str) -> str:
    """A salted, slow digest of a set of secrets: the record of a scrub tells a reader of the
    database nothing a guess could be checked against cheaply."""
    joined = "\n".join(secrets).encode()
    return hashlib.scrypt(joined, salt=bytes.fromhex(salt), **_SCRYPT).hex()


# -- the conversation list as a request log ------------------------------------------------------

# The kinds of event whose text is searched (gateway.conversations.listing, `q`): what a user and
# the model said, and what tools answered. Each message's first 100,000 characters.
SEARCHED_TYPES = ("user/message", "assistant/message", "tool/result")
_SEARCHED_IN = "(" + ", ".join(f"'{kind}'" for kind in SEARCHED_TYPES) + ")"
SEARCHED_CHARS = 100_000

# A message's text, in SQLite, from its payload's `content`: a string, or the `text` of each part
# or block (a reasoning block's excepted); NULL when it has none. `{row}` is the event row (`new`
# in a trigger). A long payload is in `event_payloads`, written before its event.
_SQLITE_MESSAGE_TEXT = (
    "(SELECT substr(CASE json_type(p.doc, '$.content')"
    " WHEN 'text' THEN json_extract(p.doc, '$.content')"
    " WHEN 'array' THEN (SELECT group_concat(json_extract(b.value, '$.text'), ' ')"
    " FROM json_each(p.doc, '$.content') b WHERE b.type = 'object'"
    " AND json_extract(b.value, '$.type') IS NOT 'reasoning')"
    f" END, 1, {SEARCHED_CHARS})"
    " FROM (SELECT CASE WHEN {row}.payload_id IS NULL THEN {row}.payload"
    " ELSE CAST((SELECT body FROM event_payloads WHERE id = {row}.payload_id) AS TEXT) END"
    " AS doc) p WHERE json_valid(p.doc))"
)


def _sqlite_index_messages(row: str, source: str = "") -> str:
    """Index the text of the event `row` (of each row of `source`, a FROM clause, if given)."""
    return (
        "INSERT INTO message_text (rowid, text, conversation_id) SELECT r, t, c FROM"
        f" (SELECT {row}.rowid AS r, {_SQLITE_MESSAGE_TEXT.format(row=row)} AS t,"
        f" {row}.conversation_id AS c {source}) WHERE t IS NOT NULL AND t <> ''"
    )


# Each conversation's totals over its attempts' usage records, and its last activity: what the
# list sorts and filters by, kept on its row (gateway.storage.writes keeps them in step).
_TOTALS_OF = (
    "UPDATE conversations SET (attempts, failed_attempts, cost_usd, unpriced_attempts,"
    " prompt_tokens, completion_tokens, completion_delivered, ttft_ms, duration_ms) ="
    " (SELECT COUNT(*), COALESCE(SUM(CASE WHEN u.status = 'error' THEN 1 ELSE 0 END), 0),"
    " SUM(u.cost_usd), COALESCE(SUM(CASE WHEN u.cost_usd IS NULL THEN 1 ELSE 0 END), 0),"
    " COALESCE(SUM(u.prompt_tokens), 0), COALESCE(SUM(u.completion_tokens), 0),"
    " COALESCE(SUM(u.completion_delivered), 0), AVG(u.ttft_ms), SUM(u.duration_ms)"
    " FROM usage u WHERE u.conversation_id = conversations.id),"
    " updated_at = COALESCE((SELECT MAX(COALESCE(t.ended_at, t.started_at)) FROM turns t"
    " WHERE t.conversation_id = conversations.id), created_at)"
)


def _request_log(real: str, integer: str) -> tuple[str, ...]:
    return (
        "CREATE INDEX usage_by_conversation ON usage (conversation_id)",
        # The request id the gateway answered with, and whom the turn was for: looked up.
        "ALTER TABLE turns ADD COLUMN request_id TEXT",
        'ALTER TABLE turns ADD COLUMN "user" TEXT',
        "CREATE INDEX turns_by_request_id ON turns (request_id) WHERE request_id IS NOT NULL",
        'CREATE INDEX turns_by_user ON turns ("user", conversation_id) WHERE "user" IS NOT NULL',
        f"ALTER TABLE conversations ADD COLUMN updated_at {real}",
        f"ALTER TABLE conversations ADD COLUMN attempts {integer} NOT NULL DEFAULT 0",
        f"ALTER TABLE conversations ADD COLUMN failed_attempts {integer} NOT NULL DEFAULT 0",
        f"ALTER TABLE conversations ADD COLUMN cost_usd {real}",
        f"ALTER TABLE conversations ADD COLUMN unpriced_attempts {integer} NOT NULL DEFAULT 0",
        f"ALTER TABLE conversations ADD COLUMN prompt_tokens {integer} NOT NULL DEFAULT 0",
        f"ALTER TABLE conversations ADD COLUMN completion_tokens {integer} NOT NULL DEFAULT 0",
        f"ALTER TABLE conversations ADD COLUMN completion_delivered {integer} NOT NULL DEFAULT 0",
        f"ALTER TABLE conversations ADD COLUMN ttft_ms {real}",
        f"ALTER TABLE conversations ADD COLUMN duration_ms {real}",
    )


# Message text in an FTS5 table, its rowid the event's. Each batch of writes indexes the
# messages it inserts (`sqlite_index_new_messages`); triggers reindex an event rewritten (a scrub
# of secrets), its payload in the row or aside.
_SQLITE_SEARCH = (
    "CREATE INDEX events_by_payload ON events (payload_id) WHERE payload_id IS NOT NULL",
    # Without each row's column sizes (`columnsize=0`): they serve ranking, which the list
    # does not do, and would cost a row of their own per message.
    "CREATE VIRTUAL TABLE message_text USING fts5(text, conversation_id UNINDEXED,"
    " tokenize = 'porter unicode61 remove_diacritics 2', columnsize = 0)",
    "CREATE TRIGGER message_text_update AFTER UPDATE OF payload, payload_id ON events"
    f" WHEN new.type IN {_SEARCHED_IN} BEGIN DELETE FROM message_text WHERE rowid = old.rowid;"
    f" {_sqlite_index_messages('new')}; END",
    "CREATE TRIGGER message_text_long_update AFTER UPDATE OF body ON event_payloads BEGIN"
    " DELETE FROM message_text WHERE rowid IN (SELECT e.rowid FROM events e"
    f" WHERE e.payload_id = new.id AND e.type IN {_SEARCHED_IN});"
    + _sqlite_index_messages(
        "e", f"FROM events e WHERE e.payload_id = new.id AND e.type IN {_SEARCHED_IN}"
    )
    + "; END",
)


def sqlite_index_new_messages(uids: int) -> str:
    """Index the text of the message events with these `uids` (as many `?`), those not
    indexed yet (a replayed write's). A statement of each batch (gateway.storage.writes),
    not a trigger: FTS5 writes what it holds as a segment of its own at each statement
    savepoint, and a trigger's INSERT opens one for every event inserted."""
    marks = ", ".join("?" for _ in range(uids))
    return _sqlite_index_messages(
        "e",
        f"FROM events e WHERE e.uid IN ({marks}) AND e.type IN {_SEARCHED_IN}"
        " AND NOT EXISTS (SELECT 1 FROM message_text m WHERE m.rowid = e.rowid)",
    )


async def _sqlite_request_log_rows(db: Db) -> None:
    """The rows stored before: each turn's request id and user, each conversation's totals,
    and every message's text in the index."""
    await db.execute(
        "UPDATE turns SET request_id = json_extract(request, '$.request_id'),"
        " \"user\" = json_extract(request, '$.user') WHERE json_valid(request)"
    )
    await db.execute(_TOTALS_OF)
    await db.execute(_sqlite_index_messages("e", f"FROM events e WHERE e.type IN {_SEARCHED_IN}"))


# In PostgreSQL, each message event's text as a stored `tsvector` column (`search`, made by
# PostgreSQL on every insert and update: a scrub of secrets remakes it), under a GIN index. Stored,
# not an index expression: a query checks rows the index does not settle (a lossy bitmap, a
# walk of the newest conversations) against the column, never by parsing payloads again. The
# function gives NULL rather than fail (an event whose text cannot be read is only not found);
# that takes a subtransaction, which a parallel query cannot start, so it is parallel unsafe
# (PostgreSQL's default). Its text search configuration is English stemming without stop
# words, as SQLite's porter tokenizer.
_POSTGRES_SEARCH = (
    "CREATE TEXT SEARCH DICTIONARY gateway_english_stem (TEMPLATE = snowball, Language = english)",
    "CREATE TEXT SEARCH CONFIGURATION gateway_search (COPY = english)",
    "ALTER TEXT SEARCH CONFIGURATION gateway_search ALTER MAPPING FOR asciiword, asciihword,"
    " hword_asciipart, word, hword, hword_part WITH gateway_english_stem",
)
_POSTGRES_MESSAGE_SEARCH = """
CREATE FUNCTION gateway_message_search(kind text, payload text) RETURNS tsvector
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    content jsonb;
    body text;
BEGIN
    IF kind NOT IN {kinds} THEN
        RETURN NULL;
    END IF;
    content := CAST(replace(payload, '\\u0000', '\\ufffd') AS jsonb) -> 'content';
    IF jsonb_typeof(content) = 'string' THEN
        body := content #>> '{}';
    ELSIF jsonb_typeof(content) = 'array' THEN
        SELECT string_agg(b ->> 'text', ' ') INTO body FROM jsonb_array_elements(content) b
        WHERE jsonb_typeof(b) = 'object' AND (b ->> 'type') IS DISTINCT FROM 'reasoning';
    END IF;
    IF body IS NULL OR body = '' THEN
        RETURN NULL;
    END IF;
    RETURN to_tsvector('{config}', left(body, {chars}));
EXCEPTION WHEN others THEN
    RETURN NULL;
END
$$"""


async def _postgres_request_log_rows(db: Db) -> None:
    """The search function (its configuration named with its schema, so that a restore, which
    runs without a search path, finds it), its column made for every event stored and its
    index, each turn's request id and user, and each conversation's totals."""
    where = await db.fetchval("SELECT current_schema()")
    config = f'"{where}".gateway_search' if where else "gateway_search"
    function = _POSTGRES_MESSAGE_SEARCH.replace("{config}", config)
    function = function.replace("{chars}", str(SEARCHED_CHARS)).replace("{kinds}", _SEARCHED_IN)
    await db.execute(function)
    await db.execute(
        "ALTER TABLE events ADD COLUMN search tsvector"
        " GENERATED ALWAYS AS (gateway_message_search(type, payload)) STORED"
    )
    await db.execute(
        "CREATE INDEX events_search ON events USING gin (search) WHERE search IS NOT NULL"
    )
    request = "CAST(replace(request, '\\u0000', '\\ufffd') AS jsonb)"
    await db.execute(
        f"UPDATE turns SET request_id = {request} ->> 'request_id', \"user\" = {request} ->> 'user'"
    )
    await db.execute(_TOTALS_OF)


# The id of the answer a turn's client was sent (a chat completion's, a message's, a response's),
# set at its end: the list looks turns up by it.
_RESPONSE_IDS = (
    "ALTER TABLE turns ADD COLUMN response_id TEXT",
    "CREATE INDEX turns_by_response_id ON turns (response_id) WHERE response_id IS NOT NULL",
)


def _calls(real: str) -> tuple[str, ...]:
    """API calls that are not turns (embeddings, images, audio, moderations, rerank, files,
    batches: gateway.pipeline.calls): each usage row names its endpoint, what it was billed by
    (`units`, JSON: images, seconds, characters, searches) and the error of a failed one; the
    request log lists them, newest first. The files and batches a team's key made, by the
    upstream's id: which team owns each, where it lives, and its last known object."""
    return (
        "ALTER TABLE usage ADD COLUMN endpoint TEXT",
        "ALTER TABLE usage ADD COLUMN units TEXT",
        "ALTER TABLE usage ADD COLUMN error TEXT",
        "UPDATE usage SET endpoint = 'embeddings' WHERE conversation_id = ''",
        "CREATE INDEX usage_calls ON usage (created_at) WHERE endpoint IS NOT NULL",
        f"""CREATE TABLE api_objects (
            id TEXT PRIMARY KEY, kind TEXT NOT NULL, team_id TEXT, key_id TEXT,
            alias TEXT, deployment TEXT NOT NULL, created_at {real} NOT NULL,
            deleted_at {real}, metered_at {real}, object TEXT NOT NULL)""",
        "CREATE INDEX api_objects_by_team ON api_objects (kind, team_id, created_at)",
    )


# What an open turn's checkpoint gained since its row in turn_checkpoints was last written
# whole: a part per tick (the text its blocks grew by, its attempts as they stand), so that a
# tick writes what moved rather than every delivered prefix again (gateway.pipeline.checkpoints).
# A turn's parts go with its checkpoint.
_CHECKPOINT_PARTS = (
    """CREATE TABLE turn_checkpoint_parts (
        turn_id TEXT NOT NULL, seq BIGINT NOT NULL, at DOUBLE PRECISION NOT NULL,
        body TEXT NOT NULL, PRIMARY KEY (turn_id, seq))""",
)

# The request that continues a turn in its conversation, claimed once (Store.claim_next): two
# requests that continue one turn at once on two replicas never both do.
_CONTINUED_BY = ("ALTER TABLE turns ADD COLUMN continued_by TEXT",)

# The provider's own id for a turn's answer (Anthropic's `msg_…` behind a chat completion), where
# it is not the id its client was sent: the list finds the turn by either. And, on PostgreSQL,
# turns' users in byte order, which the list's user filter reads a prefix's range of whatever
# the database's collation (SQLite's `turns_by_user` is in byte order already).
_UPSTREAM_IDS = (
    "ALTER TABLE turns ADD COLUMN upstream_id TEXT",
    "CREATE INDEX turns_by_upstream_id ON turns (upstream_id) WHERE upstream_id IS NOT NULL",
)
_USERS_BY_PREFIX = (
    'CREATE INDEX turns_by_user_bytes ON turns (("user" COLLATE "C")) WHERE "user" IS NOT NULL',
)


# Each budget notice told (gateway.metering.budget_alerts), claimed once by whichever replica or
# worker noticed it first: a scope's threshold is told once a period, whatever restarts.
def _budget_notices(real: str) -> tuple[str, ...]:
    return (
        f"""CREATE TABLE budget_notices (
            kind TEXT NOT NULL, ident TEXT NOT NULL, period_start {real} NOT NULL,
            threshold {real} NOT NULL, notified_at {real} NOT NULL,
            PRIMARY KEY (kind, ident, period_start, threshold))""",
    )


# What each usage row was charged at, so that a report can show it and re-rate it: the unit
# prices used (JSON, USD per token: input, output, cache_read, cache_write_5m, cache_write_1h),
# where they came from (`config`, `price file (<entry>)`, `bundled map (<entry>)`, `free`), and
# the request's metadata tags (JSON), which `group_by=tag:<key>` groups by.
_USAGE_PRICES = (
    "ALTER TABLE usage ADD COLUMN prices TEXT",
    "ALTER TABLE usage ADD COLUMN price_source TEXT",
    "ALTER TABLE usage ADD COLUMN tags TEXT",
)


# -- usage by day -----------------------------------------------------------------------------

# The usage report's sums (gateway.metering.reports), kept per whole day for each grouping: a
# report over months reads these rows for the days it covers whole, not every usage row. Each
# day's rows hold what a report of that day alone would say, per team (`dimension` a GROUPS name:
# team, key, user, model, deployment) and for all teams (the same name and `*`, team_id NULL);
# `usage_days_turns` names the turns with attempts on other days too, which a longer report counts
# again from their rows. Filled by the reports themselves, a day once the next one is over
# (`usage_days_done` says which, `turns` for usage_days_turns); a usage row written, changed or
# removed in a day filled already (a spool's replay, a batch that waited out an outage) has that
# day dropped, to be filled again: by triggers on PostgreSQL, by the reports on SQLite.
USAGE_DAY = 86400
USAGE_DAY_COUNTS = (
    "requests",
    "attempts",
    "failed_attempts",
    "interrupted",
    "errors",
    "prompt_tokens",
    "completion_tokens",
    "completion_delivered",
    "reasoning_tokens",
    "cached_tokens",
    "cache_write_5m_tokens",
    "cache_write_1h_tokens",
    "estimated",
    "unpriced_requests",
    "unpriced_prompt_tokens",
    "unpriced_completion_tokens",
)
# A usage row that is not the first attempt of its turn: its id is `<turn_id>:<n>`, n above 1 (an
# API call's ends in `:1`). As the partial indexes have it, which a query must repeat to use them.
USAGE_LATER = {"sqlite": "substr(id, -2) <> ':1'", "postgresql": "right(id, 2) <> ':1'"}
_DAY_OF = {
    "sqlite": "CAST({at} / 86400 AS INTEGER) * 86400",
    "postgresql": "CAST(FLOOR({at} / 86400) AS BIGINT) * 86400",
}


def usage_day_of(dialect: Dialect, at: str) -> str:
    """The start of the UTC day of the time `at` (a column or an expression), in Unix seconds."""
    return _DAY_OF[dialect].format(at=at)


def _usage_days(dialect: Dialect, integer: str, real: str) -> tuple[str, ...]:
    counts = ", ".join(f"{name} {integer} NOT NULL" for name in USAGE_DAY_COUNTS)
    later = USAGE_LATER[dialect]
    return (
        f"""CREATE TABLE usage_days (
            dimension TEXT NOT NULL, day {integer} NOT NULL, team_id TEXT, grp TEXT,
            {counts}, cost_usd {real})""",
        # A report reads a grouping's rows of one team (or of all: NULL) in its order.
        "CREATE INDEX usage_days_in_order ON usage_days (dimension, team_id, day, grp)",
        "CREATE INDEX usage_days_by_day ON usage_days (day)",
        f"""CREATE TABLE usage_days_turns (
            day {integer} NOT NULL, turn_id TEXT NOT NULL, PRIMARY KEY (day, turn_id))""",
        f"""CREATE TABLE usage_days_done (
            day {integer} NOT NULL, dimension TEXT NOT NULL, PRIMARY KEY (day, dimension))""",
        # A turn's attempts after its first: by time for a report, by turn for its others.
        f"CREATE INDEX usage_later ON usage (created_at) WHERE {later}",
        f"CREATE INDEX usage_later_by_turn ON usage (turn_id) WHERE {later}",
    )


def _forget_day(dialect: Dialect, at: str) -> str:
    """The statements that drop the filled day of the time `at`, each ending in `;`."""
    day = usage_day_of(dialect, at)
    return (
        f"DELETE FROM usage_days WHERE day = {day};"
        f" DELETE FROM usage_days_turns WHERE day = {day};"
        f" DELETE FROM usage_days_done WHERE day = {day};"
    )


# SQLite has no trigger for this: any trigger on usage has each row's insert keep a statement
# journal, which costs more than the insert itself. A report notices the rows inserted into a
# filled day by their rowids, above the last it looked at (`usage_days_seen`). An old row changed
# in place goes unnoticed there, and only a replayed write changes one: so a report fills no day
# while writes wait in its spool, and reads no filled day in a store that other processes write
# (gateway.metering.reports).
_SQLITE_USAGE_DAYS = (
    *_usage_days("sqlite", "INTEGER", "REAL"),
    "CREATE TABLE usage_days_seen (last_rowid INTEGER NOT NULL)",
    "INSERT INTO usage_days_seen SELECT COALESCE(MAX(rowid), 0) FROM usage",
)
# Only a row older than a day can fall in a filled day (a report fills a day once the next one
# is over too): the write of any other costs the trigger's condition alone, and PostgreSQL's
# clock as it runs (`now()` is when the writing transaction began). The function keeps the
# search path it was made with, as a restore runs without one.
_POSTGRES_STALE = "extract(epoch FROM clock_timestamp()) - 86400"
_POSTGRES_USAGE_DAYS = (
    *_usage_days("postgresql", "BIGINT", "DOUBLE PRECISION"),
    f"""CREATE FUNCTION gateway_usage_day_stale() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        IF TG_OP <> 'INSERT' THEN
            {_forget_day("postgresql", "OLD.created_at")}
        END IF;
        IF TG_OP <> 'DELETE' THEN
            {_forget_day("postgresql", "NEW.created_at")}
        END IF;
        RETURN NULL;
    END
    $$""",
    "CREATE TRIGGER usage_days_insert AFTER INSERT ON usage FOR EACH ROW"
    f" WHEN (NEW.created_at < {_POSTGRES_STALE}) EXECUTE FUNCTION gateway_usage_day_stale()",
    "CREATE TRIGGER usage_days_update AFTER UPDATE ON usage FOR EACH ROW"
    f" WHEN (OLD.created_at < {_POSTGRES_STALE} OR NEW.created_at < {_POSTGRES_STALE})"
    " EXECUTE FUNCTION gateway_usage_day_stale()",
    "CREATE TRIGGER usage_days_delete AFTER DELETE ON usage FOR EACH ROW"
    f" WHEN (OLD.created_at < {_POSTGRES_STALE}) EXECUTE FUNCTION gateway_usage_day_stale()",
)


def _forget_latencies(at: str) -> str:
    return f"DELETE FROM usage_latency_days WHERE day = {usage_day_of('postgresql', at)};"


# PostgreSQL: the latency percentiles' values (gateway.metering.reports_latency), kept per whole
# day for each grouping of all teams: each group's time to first token and duration values of the
# day, sorted, one after another as float8send writes them. A report over months reads these for
# the days it covers whole rather than every usage row, and merges them. Filled by the reports,
# as usage_days is (the day marked `latency:<grouping>` in usage_days_done), and dropped with its
# marker by the same trigger.
_POSTGRES_LATENCY_DAYS = (
    """CREATE TABLE usage_latency_days (
        dimension TEXT NOT NULL, day BIGINT NOT NULL, grp TEXT,
        ttft BYTEA NOT NULL, duration BYTEA NOT NULL)""",
    "CREATE INDEX usage_latency_days_in_order ON usage_latency_days (dimension, day)",
    f"""CREATE OR REPLACE FUNCTION gateway_usage_day_stale() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        IF TG_OP <> 'INSERT' THEN
            {_forget_day("postgresql", "OLD.created_at")}
            {_forget_latencies("OLD.created_at")}
        END IF;
        IF TG_OP <> 'DELETE' THEN
            {_forget_day("postgresql", "NEW.created_at")}
            {_forget_latencies("NEW.created_at")}
        END IF;
        RETURN NULL;
    END
    $$""",
)


# The usage report's sums by hour (gateway.metering.reports), kept per whole day for each grouping
# of all teams, as usage_days keeps them by day: each day's rows hold what a report by hour of
# that day alone would say (`dimension` `hour:` and a GROUPS name and `*`; `hour` the start of
# each hour). Filled, marked done in usage_days_done and dropped as usage_days is.
def _usage_hours(integer: str, real: str) -> tuple[str, ...]:
    counts = ", ".join(f"{name} {integer} NOT NULL" for name in USAGE_DAY_COUNTS)
    return (
        f"""CREATE TABLE usage_hours (
            dimension TEXT NOT NULL, day {integer} NOT NULL, hour {integer} NOT NULL, grp TEXT,
            {counts}, cost_usd {real})""",
        "CREATE INDEX usage_hours_in_order ON usage_hours (dimension, hour, grp)",
        "CREATE INDEX usage_hours_by_day ON usage_hours (day)",
    )


def _forget_hours(at: str) -> str:
    return f"DELETE FROM usage_hours WHERE day = {usage_day_of('postgresql', at)};"


_POSTGRES_USAGE_HOURS = (
    *_usage_hours("BIGINT", "DOUBLE PRECISION"),
    f"""CREATE OR REPLACE FUNCTION gateway_usage_day_stale() RETURNS trigger LANGUAGE plpgsql
    SET search_path FROM CURRENT AS $$
    BEGIN
        IF TG_OP <> 'INSERT' THEN
            {_forget_day("postgresql", "OLD.created_at")}
            {_forget_latencies("OLD.created_at")}
            {_forget_hours("OLD.created_at")}
        END IF;
        IF TG_OP <> 'DELETE' THEN
            {_forget_day("postgresql", "NEW.created_at")}
            {_forget_latencies("NEW.created_at")}
            {_forget_hours("NEW.created_at")}
        END IF;
        RETURN NULL;
    END
    $$""",
)

MIGRATIONS: dict[Dialect, tuple[Migration, ...]] = {
    "sqlite": (
        Migration(1, "conversations, turns, events, teams, keys, usage, responses", _SQLITE_V1),
        Migration(2, "event uids, turn owners, instances, more indexes", _SQLITE_V2),
        Migration(3, "long event payloads in a table of their own", _SQLITE_V3),
        Migration(4, "events as a rowid table, keyed by an index", _SQLITE_V4),
        Migration(5, "turn fingerprints for automatic threading", _FINGERPRINTS),
        Migration(6, "usage: cache writes, 5-minute and 1-hour", _CACHE_WRITES_SQLITE),
        Migration(7, "secrets scrubbed from stored events", _SECRET_SCRUBS, scrub_stored_tokens),
        Migration(8, "delivery checkpoints of open turns", _CHECKPOINTS),
        Migration(
            9,
            "the list as a request log: totals, searchable text, request ids",
            _request_log("REAL", "INTEGER") + _SQLITE_SEARCH,
            _sqlite_request_log_rows,
        ),
        Migration(10, "the response id of each turn", _RESPONSE_IDS),
        Migration(11, "API calls in the request log; files and batches by team", _calls("REAL")),
        Migration(12, "what open turns' checkpoints gained", _CHECKPOINT_PARTS),
        Migration(13, "usage reports' sums by day", _SQLITE_USAGE_DAYS),
        Migration(14, "the request that continues each turn", _CONTINUED_BY),
        Migration(15, "budget notices told", _budget_notices("REAL")),
        Migration(16, "the provider's id of each turn's answer", _UPSTREAM_IDS),
        Migration(17, "usage: unit prices, their source, metadata tags", _USAGE_PRICES),
        Migration(18, "where interrupted turns began, for history repair", _START_FINGERPRINTS),
        Migration(
            19,
            "time to first token summed, for totals kept by adding",
            _ttft_sums("REAL", "INTEGER"),
        ),
        Migration(20, "usage: audio tokens", _audio_counts("INTEGER")),
        Migration(21, "usage reports' sums by hour", _usage_hours("INTEGER", "REAL")),
    ),
    "postgresql": (
        Migration(1, "the whole schema", _POSTGRES_V1),
        Migration(2, "turn fingerprints for automatic threading", _FINGERPRINTS),
        Migration(3, "usage: cache writes, 5-minute and 1-hour", _CACHE_WRITES_POSTGRES),
        Migration(4, "secrets scrubbed from stored events", _SECRET_SCRUBS, scrub_stored_tokens),
        Migration(5, "delivery checkpoints of open turns", _CHECKPOINTS),
        Migration(
            6,
            "the list as a request log: totals, searchable text, request ids",
            _request_log("DOUBLE PRECISION", "BIGINT") + _POSTGRES_SEARCH,
            _postgres_request_log_rows,
        ),
        Migration(7, "the response id of each turn", _RESPONSE_IDS),
        Migration(
            8,
            "API calls in the request log; files and batches by team",
            _calls("DOUBLE PRECISION"),
        ),
        Migration(9, "what open turns' checkpoints gained", _CHECKPOINT_PARTS),
        Migration(10, "usage reports' sums by day", _POSTGRES_USAGE_DAYS),
        Migration(11, "the request that continues each turn", _CONTINUED_BY),
        Migration(12, "budget notices told", _budget_notices("DOUBLE PRECISION")),
        Migration(
            13,
            "the provider's id of each turn's answer; users by prefix",
            _UPSTREAM_IDS + _USERS_BY_PREFIX,
        ),
        Migration(14, "usage: unit prices, their source, metadata tags", _USAGE_PRICES),
        Migration(15, "where interrupted turns began, for history repair", _START_FINGERPRINTS),
        Migration(
            16,
            "time to first token summed, for totals kept by adding",
            _ttft_sums("DOUBLE PRECISION", "BIGINT"),
        ),
        Migration(17, "usage: audio tokens", _audio_counts("BIGINT")),
        Migration(18, "latency percentiles' values by day", _POSTGRES_LATENCY_DAYS),
        Migration(19, "usage reports' sums by hour", _POSTGRES_USAGE_HOURS),
    ),
}

_TRACKING = (
    "CREATE TABLE IF NOT EXISTS schema_migrations"
    " (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at DOUBLE PRECISION NOT NULL)"
)


async def current_version(db: Db) -> int:
    await db.execute(_TRACKING)
    return int(await db.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_migrations"))


def latest(dialect: Dialect) -> int:
    return MIGRATIONS[dialect][-1].version


class SchemaMismatch(Exception):
    """The store's schema is not one this code can serve (gateway.storage.store.SchemaBehind,
    SchemaAhead): the gateway refuses to start, with a message that says what to do."""


class SchemaAhead(SchemaMismatch):
    """The store's schema is newer than this gateway's code (a newer release migrated it):
    writing to it could corrupt what the newer code keeps there."""


def check_not_ahead(version: int, dialect: Dialect, where: str = "the store") -> None:
    known = latest(dialect)
    if version > known:
        raise SchemaAhead(
            f"{where} is at schema version {version}, newer than this gateway knows ({known}):"
            " run a gateway release at least as new as the one that migrated it (or restore"
            " a backup from before that migration); refusing to start"
        )


async def migrate(db: Db) -> list[int]:
    """Apply every pending migration, all in the caller's transaction; the versions applied."""
    if db.dialect == "postgresql":
        # Replicas starting together: one migrates, the others wait, then find nothing to do.
        await db.execute("SELECT pg_advisory_xact_lock(7426173)")
    else:
        await _sqlite_legacy_columns(db)
    version = await current_version(db)
    check_not_ahead(version, db.dialect)
    applied = []
    # A new store is made in one go, said in one line; an existing one says each step before
    # it runs (some rebuild a table, which takes a while: version 4 of SQLite's).
    step = logging.DEBUG if version == 0 else logging.INFO
    for migration in MIGRATIONS[db.dialect]:
        if migration.version <= version:
            continue
        log.log(step, "store migrating to version %d (%s)", migration.version, migration.name)
        for statement in migration.statements:
            await db.execute(statement)
        if migration.run is not None:
            await migration.run(db)
        await db.execute(
            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
            migration.version,
            migration.name,
            time.time(),
        )
        applied.append(migration.version)
    if applied and version == 0:
        log.info("store created at schema version %d", applied[-1])
    elif applied:
        log.info("store migrated from schema version %d to %d", version, applied[-1])
    await scrub_configured(db, scrub.configured())
    return applied


async def _sqlite_legacy_columns(db: Db) -> None:
    tables = {r[0] for r in await db.fetch("SELECT name FROM sqlite_master WHERE type='table'")}
    for table, column, kind in SQLITE_LEGACY_COLUMNS:
        if table not in tables:
            continue
        present = {row[1] for row in await db.fetch(f"PRAGMA table_info({table})")}
        if column not in present:
            await db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
