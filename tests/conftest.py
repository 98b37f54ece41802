"""Shared fixtures: a fake upstream and a gateway, both real servers on loopback."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import ServerConfig, StoreConfig, parse_config
from gateway.context import GATEWAY, Gateway
from gateway.downstream.slow_clients import guarded_runner
from gateway.storage.backends import make_store
from gateway.storage.store import Store
from tests.fakes import FakeUpstream

pytest_plugins = ["tests.postgres_server", "tests.redis_server", "tests.security.log_scan"]


@dataclass
class GatewayUnderTest:
    server: TestServer
    app: web.Application
    db_path: Path
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def gateway(self) -> Gateway:
        return self.app[GATEWAY]

    def client(self, api_key: str = "test-key", **kwargs: Any) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(
            base_url=self.url + "/v1", api_key=api_key, max_retries=0, **kwargs
        )
        self.clients.append(client)
        return client

    async def flush(self) -> None:
        await self.gateway.store.flush()

    async def wait_turn_end(
        self, conversation_id: str, count: int = 1, timeout: float = 10
    ) -> list[dict[str, Any]]:
        """Wait until the conversation has `count` turn/end events; return its own events."""
        async with asyncio.timeout(timeout):
            while True:
                await self.flush()
                events = await self.gateway.store.events(conversation_id)
                if sum(e.type == "turn/end" for e in events) >= count:
                    return [e.to_api() for e in events]
                await asyncio.sleep(0.01)

    async def get(self, path: str) -> tuple[int, Any]:
        async with aiohttp.ClientSession() as session, session.get(self.url + path) as response:
            return response.status, await response.json()

    async def post(self, path: str, body: Any) -> tuple[int, Any]:
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + path, json=body) as response,
        ):
            return response.status, await response.json()

    async def post_stream(self, body: dict[str, Any], key: str | None = None) -> tuple[bytes, str]:
        """A raw streaming chat completion: the exact bytes received, and the conversation id."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        async with (
            aiohttp.ClientSession() as session,
            session.post(self.url + "/v1/chat/completions", json=body, headers=headers) as response,
        ):
            return await response.read(), response.headers["X-Conversation-Id"]

    async def messages(self, conversation_id: str) -> list[dict[str, Any]]:
        """The conversation's derived model history."""
        status, body = await self.get(f"/v1/conversations/{conversation_id}/messages")
        assert status == 200, body
        return body["data"]  # type: ignore[no-any-return]

    def query(self, sql: str, *args: Any) -> list[tuple[Any, ...]]:
        """Read the real SQLite file directly, as an operator would."""
        with sqlite3.connect(self.db_path) as db:
            return db.execute(sql, args).fetchall()


class _GuardedTestServer(TestServer):
    def __init__(self, app: web.Application, server: ServerConfig) -> None:
        super().__init__(app, host="127.0.0.1")
        self._server_config = server

    async def _make_runner(self, **kwargs: Any) -> web.BaseRunner:
        return guarded_runner(self.app, self._server_config, **kwargs)


MakeUpstream = Callable[[], Awaitable[FakeUpstream]]


@pytest.fixture
def make_upstream(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> MakeUpstream:
    async def make() -> FakeUpstream:
        return await FakeUpstream().start(aiohttp_server)

    return make


@pytest.fixture
async def upstream(make_upstream: MakeUpstream) -> FakeUpstream:
    return await make_upstream()


MakeGateway = Callable[..., Awaitable[GatewayUnderTest]]


@pytest.fixture
async def make_gateway(
    # Not called: asked for so that the upstreams it serves close after these gateways.
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    tmp_path: Path,
) -> AsyncIterator[MakeGateway]:
    made: list[GatewayUnderTest] = []

    async def make(
        models: list[dict[str, Any]] | None = None,
        upstream: FakeUpstream | None = None,
        **sections: Any,
    ) -> GatewayUnderTest:
        if models is None:
            models = [{"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]}]
            if upstream is not None:
                models.append(
                    {
                        "name": "fake",
                        # One attempt: these tests see each upstream fault as the client does.
                        "retry": {"max_attempts": 1},
                        "deployments": [upstream.deployment()],
                    }
                )
        db_path = tmp_path / "gateway.db"
        # Open unless a test asks for a master key, whatever the environment says.
        sections.setdefault("auth", {"master_key": None})
        store = {"url": f"sqlite:///{db_path}", "spool_path": str(tmp_path / "spool")}
        store.update(sections.pop("store", {}))
        raw = {"store": store, "models": models, **sections}
        config = parse_config(raw).config
        app = create_app(config, instance=f"test-{os.urandom(4).hex()}")
        # Served as `gateway serve` serves it: each connection's protocol the guarded one
        # (head deadlines, one socket duplicate for delivery tracking), handlers cancelled
        # when their client leaves.
        server = _GuardedTestServer(app, config.server)
        await server.start_server()
        made.append(GatewayUnderTest(server, app, db_path))
        return made[-1]

    yield make
    for gateway in made:
        for client in gateway.clients:
            await client.close()
        await gateway.server.close()


@pytest.fixture
async def gw(make_gateway: MakeGateway, upstream: FakeUpstream) -> GatewayUnderTest:
    return await make_gateway(upstream=upstream)


@pytest.fixture(params=["sqlite", "postgresql"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    """A started store on each backend, as the process `gw-1` owns it: a fresh SQLite file, or
    a fresh database of the tests' PostgreSQL; closed after the test. (A test module may
    define a `store` of its own.)"""
    url = (
        f"sqlite:///{tmp_path}/store.db"
        if request.param == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    made = make_store(StoreConfig(url=url, spool_path=str(tmp_path / "spool")), "gw-1")
    await made.start()
    yield made
    await made.close()
