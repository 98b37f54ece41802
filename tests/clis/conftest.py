"""What the CLI tests share: the CLIs (skipped without tests/clis/node_modules), a throwaway
home for each run, the dead-end proxy, a gateway with a master key and a team key, and the
run itself (a subprocess with a deadline, stdin closed)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.clis.upstreams import DeadEndProxy
from tests.conftest import GatewayUnderTest, MakeGateway

HERE = Path(__file__).parent
BIN = HERE / "node_modules" / ".bin"
MASTER = "master-key-for-cli-tests-0123456789"
TEAM = "agents"
TIMEOUT_S = 60  # a run takes about a second; this is for a CLI stuck on something unforeseen


def cli(name: str) -> Path:
    """The CLI's launcher in tests/clis/node_modules/.bin, or skip the test."""
    path = BIN / name
    if shutil.which("node") is None or not path.exists():
        pytest.skip(f"needs node and tests/clis/node_modules ({name}): `make test` installs them")
    return path


@dataclass
class Sandbox:
    """A run's own directories: `home` (HOME), `tmp` (TMPDIR), `work` (the working directory)."""

    root: Path

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"

    @property
    def work(self) -> Path:
        return self.root / "work"


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    """Fresh directories for one CLI run, removed afterwards (pytest keeps its `tmp_path`s of
    the last runs: the CLIs' homes hold their session logs, the team's key in them)."""
    root = Path(tempfile.mkdtemp(prefix="gateway-cli-"))
    box = Sandbox(root)
    for path in (box.home, box.tmp, box.work):
        path.mkdir()
    try:
        yield box
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def proxy() -> AsyncIterator[DeadEndProxy]:
    dead_end = await DeadEndProxy().start()
    yield dead_end
    await dead_end.close()


def base_env(sandbox: Sandbox, proxy: DeadEndProxy) -> dict[str, str]:
    """The environment every CLI run starts from: nothing inherited but PATH; home and temp
    directories of its own; any connection beyond loopback sent to the dead-end proxy."""
    return {
        "PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(sandbox.home),
        "TMPDIR": str(sandbox.tmp),
        "LANG": "C.UTF-8",
        "NO_COLOR": "1",
        "HTTP_PROXY": proxy.url,
        "HTTPS_PROXY": proxy.url,
        "http_proxy": proxy.url,
        "https_proxy": proxy.url,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


async def run_cli(argv: list[str], env: dict[str, str], cwd: Path) -> Run:
    """Run a CLI to its end (stdin is /dev/null: both CLIs wait for an open stdin)."""
    process = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        start_new_session=True,
    )
    try:
        async with asyncio.timeout(TIMEOUT_S):
            out, err = await process.communicate()
    except TimeoutError:
        os.killpg(process.pid, signal.SIGKILL)  # the CLI and whatever it started
        await process.wait()
        raise
    assert process.returncode is not None
    return Run(process.returncode, out.decode(errors="replace"), err.decode(errors="replace"))


# -- the gateway: a master key, a team, its key ------------------------------------------------


@dataclass
class Secured:
    gw: GatewayUnderTest
    team_key: str
    key_id: str

    async def admin(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        """A call with the master key."""
        return await self.call(MASTER, method, path, body)

    async def as_team(self, path: str) -> Any:
        """A GET with the team's key, which must succeed."""
        status, body = await self.call(self.team_key, "GET", path)
        assert status == 200, body
        return body

    async def call(self, key: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, self.gw.url + path, json=body, headers=headers) as response,
        ):
            return response.status, await response.json()

    async def only_conversation(self, turns: int) -> tuple[str, Any]:
        """The one conversation the gateway recorded, the team key's, once its `turns` turns
        have ended: its id and its events (`GET /v1/conversations/{id}/events`: the events
        and each turn's recorded request)."""
        await self.gw.flush()
        rows = self.gw.query("SELECT id, team_id, key_id FROM conversations")
        assert [(team, key) for _, team, key in rows] == [(TEAM, self.key_id)], rows
        conversation_id = rows[0][0]
        await self.gw.wait_turn_end(conversation_id, turns)
        listed = await self.as_team("/v1/conversations")
        assert [(c["id"], c["turns"], c["status"]) for c in listed["data"]] == [
            (conversation_id, turns, "completed")
        ]
        events = await self.as_team(f"/v1/conversations/{conversation_id}/events")
        return conversation_id, events

    def usage(self, conversation_id: str) -> list[tuple[Any, ...]]:
        """The conversation's usage rows, oldest first: team, key, alias, model, status,
        prompt tokens."""
        return self.gw.query(
            "SELECT team_id, key_id, alias, model, status, prompt_tokens FROM usage"
            " WHERE conversation_id = ? ORDER BY created_at",
            conversation_id,
        )


async def secured_gateway(make_gateway: MakeGateway, models: list[dict[str, Any]]) -> Secured:
    """A gateway with a master key serving `models`, a team and one virtual key of it."""
    gw = await make_gateway(models=models, auth={"master_key": MASTER})
    secured = Secured(gw, "", "")
    status, body = await secured.admin("POST", "/v1/gateway/teams", {"id": TEAM, "name": "Agents"})
    assert status == 201, body
    status, body = await secured.admin(
        "POST", "/v1/gateway/keys", {"team_id": TEAM, "name": "coding-agent"}
    )
    assert status == 201, body
    secured.team_key, secured.key_id = body["key"], body["id"]
    return secured
