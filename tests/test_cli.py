"""The `gateway` command: check-config and serve, as real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import aiohttp
import openai
import pytest

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
        f"{bad}: models[0].deployments[0].api_base: Value error, the URL must start with http://"
        " or https://" in result.stderr
    )


@pytest.mark.parametrize(
    ("yaml_text", "field", "reason"),
    [
        (
            "limits: {redis_url: 'http://redis:6379'}",
            "limits.redis_url",
            "must start with one of redis://, rediss://, unix://",
        ),
        ("limits: {redis_url: 'redis://:6379/0'}", "limits.redis_url", "names no host"),
        (
            "store: {url: 'postgresql://gw:hunter2-secret@db:5432x/gw'}",
            "store.url",
            "port must be a number from 1 to 65535",
        ),
        (
            "models: [{name: x, deployments: [{provider: openai, api_base: 'https://:443/v1'}]}]",
            "models[0].deployments[0].api_base",
            "names no host",
        ),
        (
            "tracing: {otlp_endpoint: 'http://collector:99999/v1/traces'}",
            "tracing.otlp_endpoint",
            "port must be a number from 1 to 65535",
        ),
    ],
)
def test_check_config_rejects_unusable_urls_by_file_and_field(
    tmp_path: Path, yaml_text: str, field: str, reason: str
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml_text + "\n")
    result = subprocess.run(
        [*GATEWAY, "check-config", "--config", str(bad)], capture_output=True, text=True
    )
    assert result.returncode == 2, result.stdout
    assert f"{bad}: {field}: Value error, the URL" in result.stderr
    assert reason in result.stderr
    assert "hunter2" not in result.stderr  # a URL's password is never quoted
    assert "Traceback" not in result.stderr


def test_serve_with_json_logs_says_a_config_error_in_one_json_line(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    config.write_text(
        "logging: {format: json}\nlimits: {redis_url: 'http://redis:6379'}\nserver: {port: 99999}\n"
    )
    result = subprocess.run(
        [*GATEWAY, "serve", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    [record] = [json.loads(line) for line in result.stderr.splitlines()]
    assert record["level"] == "CRITICAL"
    assert record["message"] == (
        f"cannot start: config error: {config}: server.port: Input should be less than or"
        f" equal to 65535; {config}: limits.redis_url: Value error, the URL must start with"
        " one of redis://, rediss://, unix:// (e.g. redis://host:6379/0)"
    )


def test_check_config_connect_reaches_what_the_config_names(tmp_path: Path) -> None:
    closed = free_port()  # nothing listens there
    with socket.socket() as upstream:
        upstream.bind(("127.0.0.1", 0))
        upstream.listen()
        config = tmp_path / "gw.yaml"
        config.write_text(
            f"store: {{url: 'sqlite:///{tmp_path}/gw.db'}}\n"
            f"limits: {{redis_url: 'redis://:hunter2-secret@127.0.0.1:{closed}/0'}}\n"
            "models: [{name: x, deployments: [{provider: openai, api_base:"
            f" 'http://127.0.0.1:{upstream.getsockname()[1]}/v1', api_key: sk-not-sent}}]}}]\n"
        )
        result = subprocess.run(
            [*GATEWAY, "check-config", "--config", str(config), "--connect"],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result.stdout + result.stderr
    assert f"reached store.url: {tmp_path}/gw.db" in result.stdout
    assert "reached models[0].deployments[0].api_base: 127.0.0.1:" in result.stdout
    assert f"cannot reach limits.redis_url (redis://***@127.0.0.1:{closed}/0): " in result.stderr
    assert "hunter2" not in result.stdout + result.stderr
    assert not (tmp_path / "gw.db").exists()  # checked, not created
    # Without --connect nothing is reached: the same file is valid.
    quiet = subprocess.run(
        [*GATEWAY, "check-config", "--config", str(config)], capture_output=True, text=True
    )
    assert quiet.returncode == 0 and "reached" not in quiet.stdout


@pytest.mark.parametrize("cause", ["newer schema", "spool not a directory", "workers on port 0"])
def test_a_fatal_start_error_is_one_json_line_when_logs_are_json(
    tmp_path: Path, cause: str
) -> None:
    db = tmp_path / "gw.db"
    spool = tmp_path / "spool"
    if cause == "newer schema":
        with sqlite3.connect(db) as connection:
            connection.execute(
                "CREATE TABLE schema_migrations (version INTEGER, name TEXT, applied_at REAL)"
            )
            connection.execute("INSERT INTO schema_migrations VALUES (999, 'future', 0)")
        expected = "newer than this gateway knows"
    elif cause == "spool not a directory":
        spool = tmp_path / "a-file"
        spool.write_text("")
        expected = str(spool)
    else:
        expected = "--workers needs a fixed port"
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{db}', spool_path: '{spool}'}}\n"
        "logging: {format: json}\n"
        "models: [{name: demo, deployments: [{provider: demo}]}]\n"
    )
    workers = ["--workers", "2"] if cause == "workers on port 0" else []
    result = subprocess.run(
        [*GATEWAY, "serve", "--config", str(config), "--port", "0", *workers],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == (2 if workers else 1)
    records = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    fatal = [r for r in records if r["level"] == "CRITICAL"]
    assert len(fatal) == 1, result.stderr
    assert fatal[0]["message"].startswith("cannot start: ")
    assert expected in fatal[0]["message"]
    assert "exception" not in fatal[0] and "Traceback" not in result.stderr


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
