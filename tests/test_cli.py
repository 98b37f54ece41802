"""The `gateway` command: check-config and serve, as real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai

GATEWAY = [sys.executable, "-m", "gateway"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_check_config_accepts_the_shipped_file() -> None:
    result = subprocess.run(
        [*GATEWAY, "check-config", "--config", "config/gateway.yaml"],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "OK (2 model aliases: demo, gpt-4o-mini)" in result.stdout


def test_check_config_rejects_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "models:\n  - name: x\n    deployments: [{provider: openai, api_base: ftp://x}]\n"
    )
    result = subprocess.run(
        [*GATEWAY, "check-config", "--config", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 2
    assert (
        f"{bad}: models[0].deployments[0]: Value error, api_base must start with http:// or https://"
        in result.stderr
    )


async def test_serve_answers_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db'}}\n"
        "server: {cors_origins: ['http://localhost:5173']}\n"
        "models: [{name: demo, deployments: [{provider: demo, chunk_delay_ms: 1}]}]\n"
    )
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *GATEWAY,
        "serve",
        "--config",
        str(config),
        "--port",
        str(port),
        stderr=asyncio.subprocess.PIPE,
        env={
            **{k: v for k, v in os.environ.items() if k != "GATEWAY_MASTER_KEY"},
            "PYTHONUNBUFFERED": "1",
        },
    )
    try:
        assert process.stderr is not None
        async with asyncio.timeout(30):
            while b"listening on" not in (line := await process.stderr.readline()):
                assert line, "the gateway exited before listening"
            # No master key in this config: it says, loudly, that it runs open.
            while b"RUNNING OPEN" not in (line := await process.stderr.readline()):
                assert line, "no warning about running open"
            # Open to browsers as well: said too.
            line = await process.stderr.readline()
            assert b"server.cors_origins lets the pages of the listed origins" in line
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/health/ready") as response:
                assert response.status == 200
        async with openai.AsyncOpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="x"
        ) as client:
            stream = await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hello"}], stream=True
            )
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        assert "hello" in text
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), 30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


async def test_usage_prints_a_table(tmp_path: Path) -> None:
    from gateway.app import create_app
    from gateway.config import parse_config

    config = tmp_path / "gw.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db'}}\n"
        "models: [{name: demo, deployments: [{provider: demo, chunk_delay_ms: 0,"
        " input_cost_per_mtok: 1, output_cost_per_mtok: 2}]}]\n"
    )
    from aiohttp.test_utils import TestServer

    app = create_app(
        parse_config(
            {
                "auth": {"master_key": None},
                "store": {"url": f"sqlite:///{tmp_path}/gw.db"},
                "models": [
                    {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]}
                ],
            }
        ).config
    )
    async with TestServer(app) as server:
        async with openai.AsyncOpenAI(base_url=str(server.make_url("/v1")), api_key="x") as client:
            await client.chat.completions.create(
                model="demo", messages=[{"role": "user", "content": "hi"}]
            )
    result = await asyncio.to_thread(
        subprocess.run,
        [*GATEWAY, "usage", "--group-by", "model", "--config", str(config)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "period",
        "model",
        "requests",
        "attempts",
        "failed",
        "interrupted",
        "errors",
        "prompt",
        "completion",
        "delivered",
        "unpriced",
        "cost",
        "USD",
    ]
    assert lines[1].split()[1:3] == ["demo", "1"]
