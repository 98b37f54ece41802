"""schemathesis against the gateway's own /openapi.json, on a live gateway.

Every operation of the document, with valid and invalid inputs (schemathesis' positive and
negative modes): no answer is a 5xx, and every answer has a documented status code, content
type and, where the document gives one, body schema. The gateway runs in-process, the way
`gateway serve` runs it (guarded_runner), in a thread of its own so that schemathesis' blocking
client can call it; its models are the built-in demo and a fake OpenAI-compatible upstream.

`make test` runs a few examples per operation (well under a minute); GATEWAY_LONG_TESTS=1 runs
many more (GATEWAY_SCHEMATHESIS_EXAMPLES sets the number).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import schemathesis
from aiohttp import web
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gateway.app import create_app
from gateway.config import parse_config
from gateway.downstream.slow_clients import guarded_runner
from gateway.http.openapi import document
from tests.fakes import FakeUpstream

MASTER = "sk-master-0123456789abcdef"
SEED_TEAM = "seed"
LONG = os.environ.get("GATEWAY_LONG_TESTS") == "1"
EXAMPLES = int(os.environ.get("GATEWAY_SCHEMATHESIS_EXAMPLES", "300" if LONG else "8"))
pytestmark = pytest.mark.timeout(1800 if LONG else 120)  # one operation's examples
CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
]


class LiveGateway:
    """The gateway and its fake upstream on a loop in a thread of their own."""

    def __init__(self, root: Path, store_url: str) -> None:
        self.root = root
        self.store_url = store_url
        self.url = ""
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="live-gateway", daemon=True)
        # operation -> status -> count, and seconds spent
        self.statuses: dict[str, dict[int, int]] = {}
        self.seconds: dict[str, float] = {}
        self.known: dict[str, str] = {}  # kind of resource (path segment) -> an existing id
        self.calls = 0

    def record(self, operation: str, status: int, seconds: float) -> None:
        counts = self.statuses.setdefault(operation, {})
        counts[status] = counts.get(status, 0) + 1
        self.seconds[operation] = self.seconds.get(operation, 0.0) + seconds

    def report(self) -> str:
        total = sum(sum(c.values()) for c in self.statuses.values())
        lines = [f"schemathesis: {total} requests over {len(self.statuses)} operations"]
        for operation, counts in sorted(self.statuses.items()):
            spread = ", ".join(f"{s}: {n}" for s, n in sorted(counts.items()))
            lines.append(f"  {operation}: {spread} ({self.seconds[operation]:.1f} s)")
        return "\n".join(lines)

    def __enter__(self) -> LiveGateway:
        self._thread.start()
        if not self._ready.wait(30) or self._error is not None:
            raise RuntimeError(f"the gateway did not start: {self._error!r}")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def _run(self) -> None:
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # reported by __enter__
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        # Each request answered in the shape it asked for: streamed, or a whole completion.
        upstream = FakeUpstream(plain_answer="Hello from the fake upstream.")
        up_runner = web.AppRunner(upstream.app)
        await up_runner.setup()
        up_site = web.TCPSite(up_runner, "127.0.0.1", 0)
        await up_site.start()
        config = parse_config(
            {
                "auth": {"master_key": MASTER},
                "store": {"url": self.store_url, "spool_path": str(self.root / "spool")},
                "models": [
                    {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]},
                    {
                        "name": "fake",
                        "retry": {"max_attempts": 1},
                        "deployments": [
                            {
                                "provider": "openai",
                                "model": "fake-model",
                                "api_base": f"http://127.0.0.1:{up_site.port}/v1",
                                "api_key": "sk-up",
                            }
                        ],
                    },
                ],
            }
        ).config
        app = create_app(config, instance=f"schemathesis-{os.getpid()}")
        runner = guarded_runner(app, config.server, handler_cancellation=True, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site.port}"
        await self._seed()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()
            await up_runner.cleanup()

    async def _seed(self) -> None:
        """A team, a key, a conversation and a response, for examples to name (random ids
        only ever reach the 404 paths)."""
        async with aiohttp.ClientSession(
            self.url, headers={"Authorization": f"Bearer {MASTER}"}
        ) as session:
            team = {"name": "Seed", "id": SEED_TEAM}
            async with session.post("/v1/gateway/teams", json=team) as response:
                assert response.status == 201
            async with session.post("/v1/gateway/keys", json={"team_id": SEED_TEAM}) as response:
                self.known["keys"] = (await response.json())["id"]
            chat = {"model": "demo", "messages": [{"role": "user", "content": "Hi"}]}
            async with session.post("/v1/chat/completions", json=chat) as response:
                self.known["conversations"] = response.headers["X-Conversation-Id"]
            async with session.post("/v1/responses", json={"model": "demo", "input": "Hi"}) as r:
                self.known["responses"] = (await r.json())["id"]
        self.known["teams"] = SEED_TEAM

    def name_known(self, case: Any) -> None:
        """Every other example names a resource that exists (never for a DELETE, which would
        take it away from the examples after it)."""
        self.calls += 1
        if self.calls % 2 or case.method == "DELETE":
            return
        for kind, value in self.known.items():
            if f"/{kind}/{{id}}" in case.path:
                case.path_parameters = {**(case.path_parameters or {}), "id": value}
        if (
            case.path == "/v1/gateway/keys"
            and isinstance(case.body, dict)
            and "team_id" in case.body
        ):
            case.body = {**case.body, "team_id": SEED_TEAM}


# The long run fuzzes a PostgreSQL store too (its text refuses what SQLite takes: NUL).
@pytest.fixture(scope="module", params=["sqlite", "postgresql"] if LONG else ["sqlite"])
def live(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LiveGateway]:
    root = tmp_path_factory.mktemp("schemathesis")
    if request.param == "postgresql":
        store_url = request.getfixturevalue("postgres").create_database()
    else:
        store_url = f"sqlite:///{root / 'gateway.db'}"
    with LiveGateway(root, store_url) as gateway:
        yield gateway
    print(f"\n[{request.param}] " + gateway.report())  # shown with -s


ALIASES = ["demo", "fake"]
# The document is built here, at import, for schemathesis to make one test per operation; the
# live gateway serves exactly this one (checked below).
schema = schemathesis.openapi.from_dict(
    document(ALIASES),
    config=schemathesis.Config.from_dict(
        {"generation": {"max-examples": EXAMPLES, "deterministic": True}}
    ),
)


def test_the_live_gateway_serves_the_fuzzed_document(live: LiveGateway) -> None:
    # To the master key, which the fuzzing sends: without a key no alias is named.
    request = urllib.request.Request(
        live.url + "/openapi.json", headers={"Authorization": f"Bearer {MASTER}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert json.load(response) == document(ALIASES)


@schema.parametrize()
@settings(
    max_examples=EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
def test_no_server_errors_and_documented_answers(case: Any, live: LiveGateway) -> None:
    live.name_known(case)
    started = time.monotonic()
    response = case.call_and_validate(
        base_url=live.url,
        headers={"Authorization": f"Bearer {MASTER}"},
        checks=CHECKS,
        timeout=30,
    )
    live.record(f"{case.method} {case.path}", response.status_code, time.monotonic() - started)
