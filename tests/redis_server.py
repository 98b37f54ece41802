"""A throwaway redis-server for the tests that share state between replicas.

`redis_url` (session scope) starts one on a free loopback port in a temp dir, without
persistence, and stops it at the end. Tests keep apart by key prefix (`redis_prefix`);
`start_redis` starts more servers for one test (say, on a port a client already tried).
Register as a plugin: `pytest_plugins = ["tests.redis_server"]` in tests/conftest.py or in a
test module.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

INSTALL = "apt-get install -y redis-server"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    def __init__(self, directory: Path, port: int | None = None) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail(f"redis-server is not installed; install it with: {INSTALL}")
        self.port = port or free_port()
        where = ["--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(directory)]
        self.process = subprocess.Popen(
            [binary, *where, "--save", "", "--appendonly", "no"],  # no persistence
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not _answers(self.port):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"redis-server did not start on port {self.port}")
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="session")
def redis_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="gateway-redis-") as directory:
        server = None
        for _ in range(3):  # another process may take the free port before redis-server does
            try:
                server = RedisServer(Path(directory))
                break
            except RuntimeError:
                continue
        if server is None:
            pytest.fail("redis-server would not start (three tries)")
        try:
            yield server.url
        finally:
            server.stop()


@pytest.fixture
def start_redis(tmp_path: Path) -> Iterator[Callable[[int | None], RedisServer]]:
    """Start a redis-server (on `port`, else a free one), stopped after the test."""
    started: list[RedisServer] = []

    def start(port: int | None = None) -> RedisServer:
        directory = tmp_path / f"redis-{len(started)}"
        directory.mkdir()
        started.append(RedisServer(directory, port))
        return started[-1]

    yield start
    for server in started:
        server.stop()


@pytest.fixture
def redis_prefix() -> str:
    """A key prefix of this test's own on the shared server."""
    return f"test-{os.urandom(6).hex()}:"
