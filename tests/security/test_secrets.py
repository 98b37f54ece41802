"""Secrets: compared in constant time, stored only hashed, never logged, never echoed.

The master key is compared with `hmac.compare_digest` on SHA-256 digests (fixed length, so
neither the content nor the length of a guess shows in the timing); a virtual key is looked up
by its SHA-256 alone. No secret the gateway holds (master key, virtual keys, provider keys) is
in the store's files, in any log record, in a recorded event or in an answer to a client, even
when an upstream echoes its key back in an error (as OpenAI's 401 does, masked; a proxy or a
misconfigured self-hosted server may not mask it).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import os
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.errors import Unauthorized
from gateway.metering import auth as auth_module
from gateway.metering.auth import Authenticator
from gateway.metering.keys import ADMIN, KeyRecord, hash_key
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.postgres_server import USER as PG_USER
from tests.postgres_server import PostgresServer
from tests.security.log_scan import LogScan, active

TAG = os.urandom(4).hex()
MASTER = f"secrets-master-{TAG}-0123456789"
PROVIDER_KEYS = {
    "openai": f"sk-proj-LEAK{TAG}openai0123456789",
    "azure": f"azurekeyLEAK{TAG}0123456789abcdef",
    "anthropic": f"sk-ant-api03-LEAK{TAG}0123456789",
    "html": f"sk-html-LEAK{TAG}0123456789abcdef",
    "embeddings": f"sk-emb-LEAK{TAG}0123456789abcdef",
    "refused": f"sk-refused-LEAK{TAG}0123456789ab",
    "dns": f"sk-dns-LEAK{TAG}0123456789abcdefgh",
    "gemini": f"AIzaLEAK{TAG}0123456789abcdefghijk",
}
HELLO = [{"role": "user", "content": "hello"}]


# -- constant-time comparison and hashing ------------------------------------------------------


class _NoKeys:
    """A KeyStore that records what it is asked for."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def key_by_hash(self, key_hash: str) -> KeyRecord | None:
        self.asked.append(key_hash)
        return None

    async def team(self, team_id: str) -> None:
        return None


async def test_the_master_key_is_compared_in_constant_time_on_digests(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    compared: list[tuple[Any, Any]] = []
    real = hmac.compare_digest

    def spy(a: Any, b: Any) -> bool:
        compared.append((a, b))
        return real(a, b)

    assert vars(auth_module)["hmac"] is hmac
    monkeypatch.setattr(hmac, "compare_digest", spy)
    keys = _NoKeys()
    auth = Authenticator(MASTER, cast(Any, keys), cache_s=10)
    assert await auth.principal({"Authorization": f"Bearer {MASTER}"}) == ADMIN
    assert compared == [(hash_key(MASTER), hash_key(MASTER))]
    for guess in (MASTER[:-1], MASTER + "x", "x" * 200, "gw-" + "a" * 43):
        compared.clear()
        with pytest.raises(Unauthorized):
            await auth.principal({"x-api-key": guess})
        # Digests of one length whatever the guess: its length does not show in the timing.
        assert compared == [(hash_key(guess), hash_key(MASTER))]
        assert all(len(a) == len(b) == 64 for a, b in compared)
    # A virtual key is looked up by its SHA-256, never by the secret itself.
    assert keys.asked == [hashlib.sha256(("gw-" + "a" * 43).encode()).hexdigest()]


def test_the_master_key_is_kept_only_as_a_digest() -> None:
    auth = Authenticator(MASTER, cast(Any, _NoKeys()), cache_s=10)
    assert MASTER not in repr(vars(auth))


# -- an upstream that echoes the credentials it was sent ----------------------------------------

CREDENTIAL_HEADERS = ("authorization", "api-key", "x-api-key", "x-goog-api-key")


def _presented(request: web.Request) -> str:
    return next((request.headers[h] for h in CREDENTIAL_HEADERS if h in request.headers), "")


async def _echo(request: web.Request) -> web.Response:
    """Every answer quotes the credential header back, as careless upstreams do."""
    key = _presented(request)
    await request.read()
    if "/html/" in request.path:
        return web.Response(
            status=502, text=f"<html><body>proxy error, auth {key}</body></html>",
            content_type="text/html",
        )  # fmt: skip
    if request.path.endswith("/messages"):
        return web.json_response(
            {"type": "error",
             "error": {"type": "authentication_error", "message": f"invalid x-api-key {key}"}},
            status=401,
        )  # fmt: skip
    return web.json_response(
        {
            "error": {
                "message": f"Incorrect API key provided: {key}.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        },
        status=401,
    )


def files_bytes(root: Path) -> bytes:
    """Every file under `root`, as bytes: the database, its WAL, the spool."""
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _deployment(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "retry": {"max_attempts": 1},
        "deployments": [{"name": f"{name}-d", "api_key": PROVIDER_KEYS[name], **fields}],
    }


@pytest.fixture
async def leaky(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> GatewayUnderTest:
    echo = web.Application()
    echo.router.add_post("/{tail:.*}", _echo)
    base = str((await aiohttp_server(echo)).make_url("")).rstrip("/")
    return await make_gateway(
        models=[
            {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]},
            _deployment("openai", provider="openai", api_base=f"{base}/v1"),
            _deployment("azure", provider="azure", api_base=base, model="dep"),
            _deployment("anthropic", provider="anthropic", api_base=base),
            _deployment("html", provider="openai", api_base=f"{base}/html/v1"),
            _deployment("embeddings", provider="openai", api_base=f"{base}/v1"),
            _deployment(
                "refused", provider="openai", api_base=f"http://127.0.0.1:{_closed_port()}/v1"
            ),
            _deployment("dns", provider="openai", api_base="http://gateway-test.invalid/v1"),
            _deployment(
                "gemini",
                provider="litellm",
                model="gemini/gemini-2.0-flash",
                api_base=f"{base}/v1beta",
            ),
        ],
        auth={"master_key": MASTER},
    )


async def test_error_paths_log_store_and_answer_no_secret(
    leaky: GatewayUnderTest, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gw = leaky
    answers: list[str] = []

    async def call(
        method: str, path: str, key: str | None, body: Any = None, **headers: str
    ) -> tuple[int, Any]:
        if key is not None:
            headers["Authorization"] = f"Bearer {key}"
        async with aiohttp.ClientSession() as session:
            async with session.request(
                method, gw.url + path, json=body, headers=headers
            ) as response:
                text = await response.text()
                answers.append(f"{method} {path} -> {response.status} {text}")
                return response.status, text

    async def admin(method: str, path: str, body: Any = None) -> Any:
        status, text = await call(method, path, MASTER, body)
        assert status < 300, text
        return json.loads(text)

    await admin("POST", "/v1/gateway/teams", {"id": "red", "name": "Red"})
    live = (await admin("POST", "/v1/gateway/keys", {"team_id": "red"}))["key"]
    revoked = await admin("POST", "/v1/gateway/keys", {"team_id": "red"})
    await admin("DELETE", f"/v1/gateway/keys/{revoked['id']}")
    expired = await admin("POST", "/v1/gateway/keys", {"team_id": "red", "expires_at": 1})
    unknown = "gw-" + "Z" * 43
    secrets = [MASTER, live, revoked["key"], expired["key"], unknown, *PROVIDER_KEYS.values()]
    answers.clear()  # the admin API shows each new key once, to the master key: that is all

    # Keys the gateway refuses: unknown, revoked, expired, wrong master, none, on every kind
    # of route (a completion, a read, the admin API, the Anthropic dialect).
    for key, expected in (
        (unknown, 401), (revoked["key"], 401), (expired["key"], 401), (MASTER[:-1], 401),
        (None, 401), (live, 403),
    ):  # fmt: skip
        status, _ = await call("GET", "/v1/gateway/keys", key)
        assert status == expected
        status, _ = await call("POST", "/v1/chat/completions", key, {"model": "demo"})
        assert status == (401 if expected == 401 else 400)
        status, _ = await call("GET", "/v1/conversations/nope/events", key)
        assert status == (401 if expected == 401 else 404)
        headers = {"x-api-key": key} if key else {}
        status, _ = await call("POST", "/v1/messages", None, {"model": "demo"}, **headers)
        assert status == (401 if expected == 401 else 400)

    # Upstream faults with a provider key configured: the upstream echoes it in a 401, in an
    # HTML error page, or cannot be reached at all.
    for alias, status in (
        ("openai", 401), ("azure", 401), ("anthropic", 401), ("html", 502),
        ("refused", 502), ("dns", 502), ("gemini", 401),
    ):  # fmt: skip
        for stream in (False, True):
            got, _ = await call(
                "POST", "/v1/chat/completions", live,
                {"model": alias, "messages": HELLO, "stream": stream},
            )  # fmt: skip
            assert got == status, alias
    got, _ = await call("POST", "/v1/embeddings", live, {"model": "embeddings", "input": "x"})
    assert got == 401
    got, _ = await call("POST", "/v1/messages", live, {
        "model": "anthropic", "max_tokens": 10, "messages": HELLO})  # fmt: skip
    assert got == 401
    got, _ = await call("POST", "/v1/responses", live, {"model": "openai", "input": "hi"})
    assert got == 401
    await gw.flush()

    def found_in(text: str) -> list[str]:
        return [s for s in secrets if s in text]

    assert not found_in("\n".join(answers)), "a secret in an answer to a client"
    assert not found_in(caplog.text), "a secret in a log record"
    for record in caplog.records:
        assert not found_in(repr(record.args)), record.msg
    stored = files_bytes(gw.db_path.parent).decode("utf-8", "replace")
    assert not found_in(stored), "a secret in the store's files (database, WAL, spool)"
    # The attempts were recorded all the same, with the upstream's (redacted) message.
    errors = gw.query("SELECT payload FROM events WHERE type = 'request/error'")
    assert len(errors) >= 14
    assert any("Incorrect API key provided" in row[0] for row in errors)


async def test_keys_are_never_in_the_store_in_the_clear(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    gw = await make_gateway(
        auth={"master_key": MASTER},
        models=[{"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]}],
    )
    headers = {"Authorization": f"Bearer {MASTER}"}
    made: list[str] = []
    async with aiohttp.ClientSession() as session:
        await session.post(gw.url + "/v1/gateway/teams", json={"id": "t", "name": "T"},
                           headers=headers)  # fmt: skip
        for _ in range(3):
            async with session.post(
                gw.url + "/v1/gateway/keys", json={"team_id": "t"}, headers=headers
            ) as response:
                made.append((await response.json())["key"])
        for key in made:
            async with session.post(
                gw.url + "/v1/chat/completions",
                json={"model": "demo", "messages": HELLO},
                headers={"Authorization": f"Bearer {key}"},
            ) as response:
                assert response.status == 200
    await gw.flush()
    hashes = {row[0] for row in gw.query("SELECT hash FROM keys")}
    assert hashes == {hashlib.sha256(k.encode()).hexdigest() for k in made}
    raw = files_bytes(tmp_path)
    for secret in [MASTER, *made]:
        assert secret.encode() not in raw


async def test_serve_logs_no_secret_of_its_config(postgres: PostgresServer, tmp_path: Path) -> None:
    """`gateway serve` names its store when it starts listening: without the password."""
    password = f"pg-pass-{TAG}-0123456789"
    database = postgres.create_database()
    # The test cluster trusts loopback, so the password is accepted and ignored.
    url = database.replace(f"{PG_USER}@", f"{PG_USER}:{password}@")
    config = tmp_path / "gw.json"
    config.write_text(
        json.dumps(
            {
                "store": {"url": url, "spool_path": str(tmp_path / "spool")},
                "auth": {"master_key": MASTER},
                "models": [
                    {
                        "name": "m",
                        "deployments": [
                            {
                                "provider": "openai",
                                "api_base": "http://127.0.0.1:9/v1",
                                "api_key": PROVIDER_KEYS["openai"],
                                "extra_headers": {"X-Api-Token": PROVIDER_KEYS["html"]},
                            }
                        ],
                    }
                ],
            }
        )
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        "--port", str(_closed_port()),
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    assert process.stderr is not None
    output = b""
    try:
        async with asyncio.timeout(60):
            while b"listening on" not in output:
                line = await process.stderr.readline()
                assert line, output.decode()
                output += line
    finally:
        process.terminate()
        output += await process.stderr.read()
        await process.wait()
    text = output.decode()
    assert f"store postgresql://***@127.0.0.1:{postgres.port}/" in text, text
    for secret in (password, MASTER, PROVIDER_KEYS["openai"], PROVIDER_KEYS["html"]):
        assert secret not in text


# -- the session-wide log scan (tests/security/log_scan.py) ------------------------------------


def test_the_log_scan_finds_secrets_in_records_and_subprocess_stderr(tmp_path: Path) -> None:
    scan = LogScan(tmp_path)
    virtual = "gw-" + "Q" * 43
    scan.secret("sk-up", "a provider key")
    scan.secret("unused", "too short and too plain to mean anything")
    scan.secret(MASTER, "a master key")
    assert set(scan.secrets) == {"sk-up", MASTER}
    for message, args in (
        ("upstream said %s", ("Bearer sk-up",)),
        ("task-update sk-upper %s", ("fine",)),  # not the token sk-up
        ("key %s", (virtual,)),
    ):
        scan.keep(logging.LogRecord("gateway.x", logging.WARNING, __file__, 1, message, args, None))
    (tmp_path / "123.log").write_text(f"INFO gateway: listening (master {MASTER})\n")
    leaks = {(leak.secret, leak.where.split(", in the ")[1]) for leak in scan.leaks()}
    assert leaks == {
        ("sk-up", "log records of the test process"),
        (virtual, "log records of the test process"),
        (MASTER, "stderr of subprocess 123"),
    }


async def test_the_session_scan_sees_this_process_and_its_subprocesses(
    request: pytest.FixtureRequest,
) -> None:
    scan = active(request.config)
    if scan is None:
        pytest.skip("the log scan plugin is not loaded (pytest_plugins in tests/conftest.py)")
    marker = f"log-scan-probe-{os.urandom(4).hex()}"
    logging.getLogger("some.quiet.logger").info("probe %s", marker)
    assert any(marker in text for text in scan.texts)
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", f"import logging; logging.basicConfig(); logging.error('{marker}')"
    )
    assert await process.wait() == 0
    assert any(marker in text for _, text in scan.sources())


def test_no_secret_in_any_log_of_the_session(request: pytest.FixtureRequest) -> None:
    """Moved to the end of the run by tests/security/log_scan.py: every log record of the test
    process and every subprocess's stderr so far, against every secret the suite made or used."""
    scan = active(request.config)
    if scan is None:
        pytest.skip("the log scan plugin is not loaded (pytest_plugins in tests/conftest.py)")
    assert scan.secrets, "no secret was seen: the scan does not observe the gateway"
    leaks = scan.leaks()
    assert not leaks, "secrets in logs:\n" + "\n".join(map(str, leaks[:20]))
