"""Idle connections are closed, open connections are capped (docs/security.md, "No key").

Over real sockets, against the gateway served as `gateway serve` serves it
(gateway.downstream.slow_clients.guarded_runner), with a keep-alive timeout and a cap small enough
to reach here: `server.keepalive_timeout_s` closes a kept-alive connection left idle;
`server.max_connections` answers a connection over the cap 503 (and closes it), while
`/health/live` still answers. Every wait is bounded and synchronised on what the server does
(an answer, a close), never on a sleep.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import resource
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from gateway.app import create_app
from gateway.config import parse_config
from gateway.downstream import slow_clients
from gateway.downstream.slow_clients import ConnectionCap, guarded_runner
from gateway.metrics import REGISTRY

BOUND_S = 5.0  # anything the server owes (an answer, a close) comes within this
CAP = 3


@contextlib.asynccontextmanager
async def serve(tmp_path: Path, **server: Any) -> AsyncIterator[int]:
    config = parse_config(
        {
            "server": {"header_timeout_s": 30, **server},
            "auth": {"master_key": None},
            "store": {"url": f"sqlite:///{tmp_path / 'gw.db'}", "spool_path": str(tmp_path)},
            "models": [
                {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]}
            ],
        }
    ).config
    app = create_app(config, instance=f"test-{os.urandom(4).hex()}")
    runner = guarded_runner(app, config.server, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site.port
    finally:
        await runner.cleanup()


class Connection:
    """A raw client connection that sends requests and reads their answers, kept alive."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.last = b""

    @classmethod
    async def open(cls, port: int) -> Connection:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def get(self, path: str) -> tuple[int, dict[str, str], bytes]:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n".encode())
        await self.writer.drain()
        async with asyncio.timeout(BOUND_S):
            head = await self.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {
                k.lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
            }
            body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return int(lines[0].split()[1]), headers, body

    async def closed_by_server(self) -> bool:
        """Whether the server closes this connection within the bound (reading to EOF; what
        it sent before, a 503 when it pushed the connection out, is kept in `last`)."""
        try:
            async with asyncio.timeout(BOUND_S):
                self.last = await self.reader.read()
                return True
        except TimeoutError:
            return False
        except ConnectionError:
            return True

    def close(self) -> None:
        self.writer.close()


async def test_an_idle_kept_alive_connection_is_closed_after_the_timeout(tmp_path: Path) -> None:
    async with serve(tmp_path, keepalive_timeout_s=0.3) as port:
        connection = await Connection.open(port)
        try:
            status, headers, _ = await connection.get("/health/live")
            assert status == 200
            assert headers.get("connection", "").lower() != "close"  # kept alive, at first
            assert await connection.closed_by_server()
        finally:
            connection.close()
        # Meanwhile and after, new connections are served.
        again = await Connection.open(port)
        try:
            assert (await again.get("/health/live"))[0] == 200
        finally:
            again.close()


async def test_a_connection_over_the_cap_gets_a_503_and_health_still_answers(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.downstream.slow_clients")
    before = REGISTRY.get_sample_value("gateway_connections_refused_total") or 0
    async with serve(tmp_path, keepalive_timeout_s=30, max_connections=CAP) as port:
        held = [await Connection.open(port) for _ in range(CAP)]
        try:
            for connection in held:  # served, and kept alive: the cap is reached
                assert (await connection.get("/v1/models"))[0] == 200
            over = await Connection.open(port)
            status, headers, body = await over.get("/v1/models")
            assert status == 503, body
            assert b'"code":"too_many_connections"' in body
            assert headers["retry-after"] == "1"
            assert await over.closed_by_server()  # one answer, then closed
            over.close()
            live = await Connection.open(port)
            assert (await live.get("/health/live"))[0] == 200  # alive at the cap
            assert await live.closed_by_server()
            live.close()
            refused = [r for r in caplog.records if "server.max_connections" in r.getMessage()]
            assert len(refused) == 1  # at most one line a minute, however many are refused
            # ... and each counted: the request refused and the health probe over the cap.
            counted = REGISTRY.get_sample_value("gateway_connections_refused_total")
            assert counted == before + 2
            # One held connection goes: a new one is admitted again.
            held.pop().close()
            async with asyncio.timeout(BOUND_S):
                while True:
                    fresh = await Connection.open(port)
                    status = (await fresh.get("/v1/models"))[0]
                    fresh.close()
                    if status == 200:
                        break
                    assert status == 503
        finally:
            for connection in held:
                connection.close()


async def test_a_flood_of_idle_connections_is_bounded_and_health_answers(tmp_path: Path) -> None:
    """Connection exhaustion, bounded: 40 silent connections against a cap of 3. Those past the
    cap are pushed out (503, closed) by newer ones beyond the reserve, the admitted ones are
    closed once idle for the keep-alive timeout, and a health probe is answered throughout."""
    flood = 40
    async with serve(tmp_path, keepalive_timeout_s=0.5, max_connections=CAP) as port:
        admitted = [await Connection.open(port) for _ in range(CAP)]
        for connection in admitted:  # served, then idle
            assert (await connection.get("/health/live"))[0] == 200
        silent = [await Connection.open(port) for _ in range(flood - CAP)]
        try:
            probe = await Connection.open(port)  # the newest over the cap: read, and answered
            assert (await probe.get("/health/live"))[0] == 200
            assert await probe.closed_by_server()
            probe.close()
            # Pushed out by newer ones (a 503), or closed idle (aiohttp's keep-alive timer runs
            # from a connection's start): none is held past the bound.
            assert all(await asyncio.gather(*(c.closed_by_server() for c in silent)))
            assert all(await asyncio.gather(*(c.closed_by_server() for c in admitted)))
        finally:
            for connection in admitted + silent:
                connection.close()
        # The flood is gone: the gateway serves as before.
        after = await Connection.open(port)
        try:
            assert (await after.get("/v1/models"))[0] == 200
        finally:
            after.close()


class _Waiting:
    def __init__(self) -> None:
        self.refused = False

    def refuse(self) -> None:
        self.refused = True


def test_the_cap_admits_then_reads_a_reserve_pushing_the_oldest_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="gateway.downstream.slow_clients")
    cap = ConnectionCap(2, reserve=2)
    a, b, c, d, e = (_Waiting() for _ in range(5))
    assert [cap.admit(x) for x in (a, b, c, d, e)] == [True, True, False, False, False]
    assert (c.refused, d.refused, e.refused) == (True, False, False)  # the oldest pushed out
    assert len(caplog.records) == 1  # one line for the three over the cap
    cap.release(c, admitted=False)  # its close, later: already out
    cap.release(a, admitted=True)
    assert list(cap.waiting) == [d, e]
    assert cap.admit(_Waiting()) is True


def test_the_cap_fits_the_file_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    limits = {"soft": 1024, "hard": 1024}

    def getrlimit(_: int) -> tuple[int, int]:
        return limits["soft"], limits["hard"]

    def setrlimit(_: int, value: tuple[int, int]) -> None:
        limits["soft"] = value[0]

    monkeypatch.setattr(resource, "getrlimit", getrlimit)
    monkeypatch.setattr(resource, "setrlimit", setrlimit)
    assert slow_clients.connection_cap(100) == 100  # fits
    assert slow_clients.connection_cap(10_000) == (1024 - slow_clients.RESERVED_FDS) // 3
    limits.update(soft=1024, hard=65536)  # raised to what the cap needs
    assert slow_clients.connection_cap(10_000) == 10_000
    assert limits["soft"] == 10_000 * 3 + slow_clients.RESERVED_FDS
