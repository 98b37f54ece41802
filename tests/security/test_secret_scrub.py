"""No secret in anything the gateway stores, logs or answers, whatever shape an upstream's error
takes (gateway.scrub; docs/security.md, "A malicious upstream").

Upstreams that quote secrets in every error shape: an HTTP error body (OpenAI, Anthropic, and
Gemini through litellm, whose exception text carries it), an SSE `error` event before and
after content (OpenAI's format), Anthropic's `event: error`, and Gemini's in-stream error chunk.
Each message holds the deployment's own key, a credential of its `extra_headers`, the master
key, another deployment's key, and key-shaped tokens nobody configured. Then the database (its
files, or every row of PostgreSQL), every log record and every answer, the event log read back
included, are searched for them; on both backends. A last test scrubs rows an older gateway
stored (the data migration), on both backends too.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from gateway import scrub
from gateway.config import StoreConfig
from gateway.storage import schema
from gateway.storage.backends import make_backend, make_store
from gateway.storage.db import Db, Dialect
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream
from tests.providers.upstreams import AnthropicServer, GeminiServer

pytestmark = [
    pytest.mark.filterwarnings(r"ignore::DeprecationWarning:litellm\."),
    # pydantic on the Google SDK's types, when litellm is first imported here
    pytest.mark.filterwarnings(r"ignore:.*`ReadOnly` qualifier:UserWarning"),
]

TAG = os.urandom(4).hex()
MASTER = f"scrub-master-{TAG}-0123456789"
OPENAI_KEY = f"sk-proj-SCRUB{TAG}openai0123456789"
ANTHROPIC_KEY = f"sk-ant-api03-SCRUB{TAG}0123456789"
GEMINI_KEY = f"AIzaSCRUB{TAG}0123456789abcdefghijkl"
HEADER_SECRET = f"hdr-token-SCRUB{TAG}-0123456789"  # an extra_headers credential
STRAY_KEY = f"sk-stray{TAG}0123456789abcdef"  # key-shaped, configured nowhere
VIRTUAL_KEY = "gw-" + f"SCRUB{TAG}".ljust(43, "x")  # shaped like the gateway's own keys
BEARER_SECRET = f"opaque{TAG}token0123"  # after `Bearer `
PLANTED = [OPENAI_KEY, ANTHROPIC_KEY, GEMINI_KEY, HEADER_SECRET, MASTER, STRAY_KEY, VIRTUAL_KEY]
PLANTED.append(BEARER_SECRET)
MODELS = ("openai", "anthropic", "gemini")
HELLO = [{"role": "user", "content": "hello"}]


def leak(own: str) -> str:
    """What a careless upstream says: its own key and every other secret in one message."""
    return (
        f"denied: key {own}, header {HEADER_SECRET}, master {MASTER}, others {OPENAI_KEY}"
        f" {ANTHROPIC_KEY} {GEMINI_KEY}, stray {STRAY_KEY}, virtual {VIRTUAL_KEY},"
        f" sent Authorization: Bearer {BEARER_SECRET}"
    )


def found_in(text: str) -> list[str]:
    return [s for s in PLANTED if s in text]


MakeServer = Callable[..., Awaitable[TestServer]]


async def upstreams(
    make_server: MakeServer,
) -> tuple[FakeUpstream, AnthropicServer, GeminiServer]:
    return (
        await FakeUpstream().start(make_server),
        await AnthropicServer().start(make_server),
        await GeminiServer().start(make_server),
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def backend(request: pytest.FixtureRequest) -> dict[str, Any]:
    return {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}


async def test_every_upstream_error_shape_leaves_no_secret_anywhere(
    make_gateway: MakeGateway,
    aiohttp_server: MakeServer,
    backend: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    openai_up, anthropic_up, gemini_up = await upstreams(aiohttp_server)
    headers = {"X-Api-Token": HEADER_SECRET}

    def model(name: str, deployment: dict[str, Any]) -> dict[str, Any]:
        return {"name": name, "retry": {"max_attempts": 1}, "deployments": [deployment]}

    gw = await make_gateway(
        models=[
            model("openai", openai_up.deployment(api_key=OPENAI_KEY, extra_headers=headers)),
            model("anthropic", anthropic_up.deployment(api_key=ANTHROPIC_KEY)),
            model("gemini", gemini_up.deployment(api_key=GEMINI_KEY)),
        ],
        auth={"master_key": MASTER},
        store=backend,
    )
    answers: list[str] = []

    async def call(path: str, key: str, body: Any = None) -> tuple[int, str]:
        method = "GET" if body is None else "POST"
        async with aiohttp.ClientSession() as session:
            async with session.request(
                method, gw.url + path, json=body, headers={"Authorization": f"Bearer {key}"}
            ) as response:
                text = await response.text()
                answers.append(f"{method} {path} -> {response.status} {text}")
                return response.status, text

    status, _ = await call("/v1/gateway/teams", MASTER, {"id": "red", "name": "Red"})
    assert status == 201
    status, made = await call("/v1/gateway/keys", MASTER, {"team_id": "red"})
    assert status == 201
    team_key = json.loads(made)["key"]
    answers.clear()  # the new key, shown once to the master key

    servers = {"openai": openai_up, "anthropic": anthropic_up, "gemini": gemini_up}
    own = {"openai": OPENAI_KEY, "anthropic": ANTHROPIC_KEY, "gemini": GEMINI_KEY}
    outcomes: list[tuple[str, int]] = []
    for name in MODELS:
        server = servers[name]
        # An HTTP error body, streamed and not (for litellm, its exception's text).
        for stream in (False, True):
            server.http_error(401, leak(own[name]))
            chat = {"model": name, "messages": HELLO, "stream": stream}
            status, _ = await call("/v1/chat/completions", team_key, chat)
            outcomes.append((f"{name} http stream={stream}", status))
        # An in-stream error event before any content, then one after content was delivered.
        server.error_mid_stream([], leak(own[name]))
        chat = {"model": name, "messages": HELLO, "stream": True}
        status, _ = await call("/v1/chat/completions", team_key, chat)
        outcomes.append((f"{name} error event first", status))
        server.error_mid_stream(["Hel", "lo"], leak(own[name]))
        status, text = await call("/v1/chat/completions", team_key, chat)
        assert status == 200 and "Hel" in text, text  # delivered, then the error event
        outcomes.append((f"{name} error event mid-stream", status))
    # The other dialects render the same errors their own way.
    openai_up.error_mid_stream(["Hel"], leak(OPENAI_KEY))
    messages = {"model": "openai", "max_tokens": 50, "messages": HELLO, "stream": True}
    assert (await call("/v1/messages", team_key, messages))[0] == 200
    anthropic_up.http_error(401, leak(ANTHROPIC_KEY))
    assert (await call("/v1/responses", team_key, {"model": "anthropic", "input": "hi"}))[0] >= 400
    assert all(status >= 400 for what, status in outcomes if "mid-stream" not in what), outcomes
    await gw.flush()

    # Every conversation's event log, read back by the team's key, as any client may.
    status, listing = await call("/v1/conversations?limit=100", team_key)
    assert status == 200, listing
    ids = [c["id"] for c in json.loads(listing)["data"]]
    assert len(ids) >= len(outcomes)
    for conversation_id in ids:
        status, _ = await call(f"/v1/conversations/{conversation_id}/events", team_key)
        assert status == 200

    assert not found_in("\n".join(answers)), "a secret in an answer to a client"
    assert not found_in(caplog.text), "a secret in a log record"
    for record in caplog.records:
        assert not found_in(repr(record.args)), record.msg
        assert not found_in(str(record.exc_text)), record.msg
    stored = await _everything_stored(gw)
    assert not found_in(stored), "a secret in the store"
    # The errors were recorded all the same, their secrets replaced: every request/error, and
    # each in-stream error event an attempt received (litellm raises Gemini's first one).
    rows = await _rows(gw, "SELECT payload FROM events WHERE type = 'request/error'")
    assert len(rows) >= len(outcomes)
    assert all(scrub.REDACTED in str(p) for (p,) in rows), rows
    rows = await _rows(gw, "SELECT payload FROM events WHERE type = 'assistant/attempt'")
    redacted = [p for (p,) in rows if '"type":"error"' in str(p) and scrub.REDACTED in str(p)]
    assert len(redacted) >= 2 * len(MODELS) - 1, rows


async def _rows(gw: GatewayUnderTest, sql: str) -> list[tuple[Any, ...]]:
    async def op(db: Db) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in await db.fetch(sql)]

    return await gw.gateway.store.backend.run(op)


async def _everything_stored(gw: GatewayUnderTest) -> str:
    """Every byte of the SQLite files (database, WAL, spool, journal), or every row of every
    table of PostgreSQL."""
    if gw.gateway.store.dialect == "sqlite":
        root = gw.db_path.parent
        files = sorted(p for p in root.rglob("*") if p.is_file())
        return b"".join(p.read_bytes() for p in files).decode("utf-8", "replace")
    tables = [
        r[0]
        for r in await _rows(
            gw, "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        )
    ]
    texts = [str(await _rows(gw, f"SELECT * FROM {table}")) for table in tables]
    return "\n".join(texts)


# -- rows an older gateway stored: the data migration --------------------------------------------


def _version_before_scrub(dialect: Dialect) -> int:
    mine = next(m for m in schema.MIGRATIONS[dialect] if m.run is schema.scrub_stored_tokens)
    return mine.version - 1


async def test_the_migration_scrubs_rows_stored_before(
    backend: dict[str, Any], tmp_path: Path
) -> None:
    url = backend.get("url") or f"sqlite:///{tmp_path / 'old.db'}"
    config = StoreConfig(url=url, spool_path=str(tmp_path / "spool"))
    dialect: Dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
    configured = f"sk-configured-OLD{TAG}-0123456789"
    before = _version_before_scrub(dialect)

    # A store as the gateway before the scrub left it, with secrets in its rows.
    old = make_backend(config)
    await old.start()

    async def build(db: Db) -> None:
        await db.execute(schema._TRACKING)
        for migration in schema.MIGRATIONS[db.dialect]:
            if migration.version > before:
                break
            for statement in migration.statements:
                await db.execute(statement)
            await db.execute(
                "INSERT INTO schema_migrations VALUES (?, ?, 0)", migration.version, migration.name
            )
        error_record = (
            '{"type":"error","t":5,"message":"bad key ' + STRAY_KEY + '",'
            '"upstream":{"message":"Bearer ' + BEARER_SECRET + " and " + configured + '"}}'
        )
        attempt = (
            '{"reason":"provider_error","attempt":1,"stream":[{"type":"text","index":0,"t0":1,'
            '"dt":[],"parts":["the model said ' + STRAY_KEY + '"]},' + error_record + "]}"
        )
        rows = [
            ("c", 1, "t", "user/message", '{"content":"my own ' + STRAY_KEY + '"}'),
            ("c", 2, "t", "user/message", '{"content":"pasted ' + configured + '"}'),
            ("c", 3, "t", "assistant/attempt", attempt),
            ("c", 4, "t", "request/error", '{"message":"key ' + VIRTUAL_KEY + '","status":401}'),
        ]
        for conversation_id, seq, turn_id, kind, payload in rows:
            await db.execute(
                "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload,"
                " uid) VALUES (?, ?, ?, ?, 1.0, ?, ?)",
                conversation_id, seq, turn_id, kind, payload, f"u{seq}",
            )  # fmt: skip
        if db.dialect == "sqlite":  # a long payload, kept aside
            long_id = await db.fetchval(
                "INSERT INTO event_payloads (body) VALUES (?) RETURNING id", attempt.encode()
            )
            await db.execute(
                "INSERT INTO events (conversation_id, seq, turn_id, type, created_at, payload,"
                " uid, payload_id) VALUES ('c', 5, 't', 'assistant/attempt', 1.0, '', 'u5', ?)",
                long_id,
            )

    await old.transact(build)
    await old.close()

    scrub.add(configured)  # as a gateway configured with it learns it
    store = make_store(config, "scrub-test")
    await store.start()  # migrates, then scrubs the configured secrets once
    try:
        events = {e.seq: e.payload for e in await store.events("c")}
        # User content keeps what it said, except a configured secret.
        assert events[1] == {"content": f"my own {STRAY_KEY}"}
        assert events[2] == {"content": f"pasted {scrub.REDACTED}"}
        for seq in [3, 5] if dialect == "sqlite" else [3]:
            stream = events[seq]["stream"]
            assert stream[0]["parts"] == [f"the model said {STRAY_KEY}"]  # received text: kept
            assert stream[1]["message"] == f"bad key {scrub.REDACTED}"
            assert stream[1]["upstream"] == {
                "message": f"Bearer {scrub.REDACTED} and {scrub.REDACTED}"
            }
        assert events[4] == {"message": f"key {scrub.REDACTED}", "status": 401}

        async def scrubs(db: Db) -> int:
            return int(await db.fetchval("SELECT COUNT(*) FROM secret_scrubs"))

        assert await store.backend.run(scrubs) == 1
    finally:
        await store.close()

    # Recorded: the same secrets are not looked for again at the next start.
    again = make_store(config, "scrub-test")
    await again.start()
    try:
        assert await again.backend.run(scrubs) == 1
    finally:
        await again.close()


def test_the_scrubber_takes_out_configured_and_key_shaped_secrets() -> None:
    scrub.add(f"configured-{TAG}-secret")
    text = (
        f"a configured-{TAG}-secret, {STRAY_KEY}, {VIRTUAL_KEY}, {GEMINI_KEY}, "
        f"Authorization: Bearer {BEARER_SECRET}; desk-lamp-0123456789abcdefgh sk-short"
    )
    assert scrub.scrub(text) == (
        "a [redacted], [redacted], [redacted], [redacted], Authorization: Bearer [redacted];"
        " desk-lamp-0123456789abcdefgh sk-short"
    )
    assert scrub.scrub(scrub.scrub(text)) == scrub.scrub(text)  # idempotent
    body = {"error": {"message": f"no {STRAY_KEY}", "param": None, "list": [VIRTUAL_KEY, 3]}}
    assert scrub.scrub_json(body) == {
        "error": {"message": "no [redacted]", "param": None, "list": ["[redacted]", 3]}
    }
    clean = {"a": ["b", 1]}
    assert scrub.scrub_json(clean) is clean


def test_log_records_are_scrubbed_when_made(caplog: pytest.LogCaptureFixture) -> None:
    scrub.install_log_scrubbing()
    logger = logging.getLogger("gateway.test_scrub")
    with caplog.at_level(logging.INFO, logger="gateway.test_scrub"):
        logger.info("upstream said %s", STRAY_KEY)
        try:
            raise ValueError(f"bad {VIRTUAL_KEY}")
        except ValueError:
            logger.exception("failed with %s", "no secret")
        logger.info("nothing to hide %s", "here")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "upstream said [redacted]",
        "failed with no secret",
        "nothing to hide here",
    ]
    assert "ValueError: bad [redacted]" in str(caplog.records[1].exc_text)
    assert caplog.records[2].args == ("here",)  # a record without a secret is left whole
    assert not found_in(caplog.text)
