"""`gateway serve --workers N`: N processes answer on one port; SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import aiohttp

from tests.test_cli import free_port


async def test_two_workers_share_the_port_and_stop_together(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db', spool_path: '{tmp_path}/spool'}}\n"
        "models: [{name: demo, deployments: [{provider: demo, chunk_delay_ms: 0}]}]\n"
    )
    port = free_port()
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        "--port", str(port), "--workers", "2",
        stderr=asyncio.subprocess.DEVNULL,
        env={k: v for k, v in os.environ.items() if k != "GATEWAY_MASTER_KEY"},
    )  # fmt: skip
    pids: set[int] = set()
    instances: set[str] = set()
    try:
        async with asyncio.timeout(60):
            # A new connection each time: the kernel spreads them over the workers.
            while len(pids) < 2:
                try:
                    async with (
                        aiohttp.ClientSession(
                            connector=aiohttp.TCPConnector(force_close=True)
                        ) as session,
                        session.get(f"http://127.0.0.1:{port}/health/live") as response,
                    ):
                        body = await response.json()
                        pids.add(body["pid"])
                        instances.add(body["instance"])
                except aiohttp.ClientConnectionError:
                    await asyncio.sleep(0.05)  # not listening yet
            async with aiohttp.ClientSession() as session:
                async with session.post(
                    f"http://127.0.0.1:{port}/v1/chat/completions",
                    json={"model": "demo", "messages": [{"role": "user", "content": "hi"}]},
                ) as response:
                    assert response.status == 200
    finally:
        supervisor.send_signal(signal.SIGTERM)
        async with asyncio.timeout(30):
            code = await supervisor.wait()
    assert code == 0
    assert supervisor.pid not in pids
    assert len(instances) == 2 and all(i.endswith((":w0", ":w1")) for i in instances)
    for pid in pids:  # the workers are gone too
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"worker {pid} still running")
