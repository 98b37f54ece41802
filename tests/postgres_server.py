"""A throwaway PostgreSQL for the tests: its own cluster in a temporary directory, on a free
loopback port, started once per session (`make test` installs the Debian packages if missing).
Each test gets a fresh database in it."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

USER = "gateway"


def _bindir() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    if candidates:
        return Path(candidates[0]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    bindir: Path
    root: Path
    port: int

    @property
    def data(self) -> Path:
        return self.root / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *command: str) -> None:
        argv = [str(self.bindir / command[0]), *command[1:]]
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            argv = ["runuser", "-u", "postgres", "--", *argv]
        subprocess.run(argv, check=True, capture_output=True, timeout=120)

    def init(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
        self._run("initdb", "-U", USER, "--auth=trust", "-E", "UTF8", "-D", str(self.data))

    def start(self) -> None:
        options = (
            f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1"
            " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            " -c max_connections=200"
        )
        self._run(
            "pg_ctl",
            "start",
            "-w",
            "-t",
            "60",
            "-D",
            str(self.data),
            "-l",
            str(self.root / "log"),
            "-o",
            options,
        )

    def create_database(self) -> str:
        name = f"t_{os.urandom(6).hex()}"
        subprocess.run(
            [
                str(self.bindir / "createdb"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.port),
                "-U",
                USER,
                name,
            ],
            check=True,
            capture_output=True,
            timeout=60,
        )
        return self.url(name)

    def stop(self) -> None:
        self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))


@contextlib.contextmanager
def throwaway_postgres(prefix: str = "gw-pg-") -> Iterator[PostgresServer]:
    """A cluster of its own, started, and removed afterwards."""
    bindir = _bindir()
    if bindir is None:
        pytest.fail("PostgreSQL is not installed: apt-get install -y postgresql (make test does)")
    root = Path(tempfile.mkdtemp(prefix=prefix))
    if os.geteuid() == 0:
        os.chmod(root, 0o755)
    server = PostgresServer(bindir, root / "cluster", _free_port())
    server.init()
    server.start()
    try:
        yield server
    finally:
        try:
            server.stop()
        except subprocess.CalledProcessError:
            pass  # stopped already (a test stopped it)
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with throwaway_postgres() as server:
        yield server


@pytest.fixture
def pg_url(postgres: PostgresServer) -> str:
    """A fresh, empty database for one test."""
    return postgres.create_database()
