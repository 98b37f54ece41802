"""`gateway serve --workers 2` without Redis: both workers admit through the supervisor's one
limiter, so a team's hard budget holds for the host, not once per worker."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import aiohttp

from tests.test_cli import free_port

MASTER = "master-key-for-tests-0123456789"
BUDGET = 0.01  # USD: about seven demo answers of ~200 tokens at 5 USD per million
HELLO = [{"role": "user", "content": "Hello"}]


async def fresh(port: int, method: str, path: str, body: Any = None, key: str = MASTER) -> Any:
    """One request on a connection of its own: the kernel picks the worker for each."""
    connector = aiohttp.TCPConnector(force_close=True)
    headers = {"Authorization": f"Bearer {key}"}
    async with (
        aiohttp.ClientSession(connector=connector, headers=headers) as session,
        session.request(method, f"http://127.0.0.1:{port}{path}", json=body) as response,
    ):
        return response.status, await response.json()


async def test_a_hard_budget_holds_across_two_workers(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db', spool_path: '{tmp_path}/spool'}}\n"
        f"auth: {{master_key: {MASTER}}}\n"
        "models: [{name: demo, deployments: [{provider: demo, chunk_delay_ms: 0,"
        " input_cost_per_mtok: 1, output_cost_per_mtok: 5}]}]\n"
    )
    port = free_port()
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        "--port", str(port), "--workers", "2",
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert supervisor.stderr is not None
    stderr = asyncio.create_task(supervisor.stderr.read())
    pids: set[int] = set()
    outcomes: list[int] = []
    try:
        async with asyncio.timeout(90):
            while len(pids) < 2:
                try:
                    _, body = await fresh(port, "GET", "/health/live")
                    pids.add(body["pid"])
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)  # not listening yet
            team = {"id": "t", "name": "T", "limits": {"budget": {"usd": BUDGET, "period": "day"}}}
            assert (await fresh(port, "POST", "/v1/gateway/teams", team))[0] == 201
            status, created = await fresh(port, "POST", "/v1/gateway/keys", {"team_id": "t"})
            assert status == 201
            key = created["key"]
            ask = {"model": "demo", "messages": HELLO, "max_tokens": 300}

            async def one() -> int:
                status, body = await fresh(port, "POST", "/v1/chat/completions", ask, key)
                if status == 429:
                    assert body["error"]["code"] == "budget_exceeded", body
                else:
                    assert status == 200, body
                outcomes.append(status)
                return int(status)

            # A burst, then one request after another until the budget refuses them: each
            # worker alone would have let in about as many again.
            await asyncio.gather(*(one() for _ in range(12)))
            while await one() == 200:
                pass
            # Spent, for both workers: twenty more connections, spread over them by the kernel
            # (both are hit but for a chance of 2 in a million), all refused.
            assert [await one() for _ in range(20)] == [429] * 20
    finally:
        supervisor.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            code = await supervisor.wait()
    log = (await stderr).decode()
    assert code == 0, log
    assert "shared by the workers through" in log
    with sqlite3.connect(tmp_path / "gw.db") as db:
        spent, admitted = db.execute(
            "SELECT SUM(cost_usd), COUNT(*) FROM usage WHERE team_id = 't'"
        ).fetchone()
    assert admitted == outcomes.count(200) >= 5
    assert spent <= BUDGET
    for pid in pids:  # the workers are gone too
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"worker {pid} still running")
