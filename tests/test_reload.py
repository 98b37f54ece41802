"""SIGHUP reloads the config: a stream open across it ends on the deployment and price it began
with, new requests see the new aliases and prices, and a broken file keeps the running config
with one line saying why. Under `serve --workers N` the supervisor passes it to each worker."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from tests.fakes import DONE, USAGE, FakeUpstream, chunk
from tests.test_cli import free_port
from tests.test_process import start, text_of


class Log:
    """A gateway's stderr, read as it comes, so a test can wait for a line."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        assert process.stderr is not None
        self.lines: list[str] = []
        self._stream = process.stderr
        self._grew = asyncio.Condition()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while line := await self._stream.readline():
            async with self._grew:
                self.lines.append(line.decode())
                self._grew.notify_all()

    async def wait_for(self, text: str, count: int = 1) -> list[str]:
        """The lines holding `text`, once there are `count` of them."""
        async with asyncio.timeout(30), self._grew:
            await self._grew.wait_for(lambda: len(self.having(text)) >= count)
        return self.having(text)

    def having(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


def write(path: Path, tmp_path: Path, models: list[dict[str, Any]]) -> None:
    path.write_text(
        json.dumps(
            {
                "store": {"url": f"sqlite:///{tmp_path}/gw.db", "spool_path": str(tmp_path)},
                "models": models,
            }
        )
    )


def alias(name: str, upstream: FakeUpstream, deployment: str, per_mtok: float) -> dict[str, Any]:
    priced = {"input_cost_per_mtok": per_mtok, "output_cost_per_mtok": 2 * per_mtok}
    return {"name": name, "deployments": [upstream.deployment(name=deployment, **priced)]}


def cost(per_mtok: float) -> float:
    return (USAGE["prompt_tokens"] * per_mtok + USAGE["completion_tokens"] * 2 * per_mtok) / 1e6


def held_open(upstream: FakeUpstream, finish: asyncio.Event) -> Any:
    """An answer whose first piece comes at once and whose rest waits for `finish`."""

    async def answer(request: web.Request) -> web.StreamResponse:
        response = await upstream.start_sse(request)
        await upstream.write(response, chunk("old "))
        await finish.wait()
        await upstream.write(response, chunk("answer.", finish="stop"))
        await upstream.write(response, chunk(usage=USAGE, no_choices=True) + DONE)
        await response.write_eof()
        return response

    return answer


def ask(model: str) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def usage_rows(db: Path) -> dict[str, tuple[str, float]]:
    """Each conversation's usage: (deployment, cost)."""
    with sqlite3.connect(db) as connection:
        rows = connection.execute("SELECT conversation_id, deployment, cost_usd FROM usage")
        return {c: (d, cost) for c, d, cost in rows}


async def stop(process: asyncio.subprocess.Process, log: Log) -> int:
    if process.returncode is None:
        process.send_signal(signal.SIGTERM)
    code = await asyncio.wait_for(process.wait(), 30)
    await log.reader
    return code


async def test_sighup_serves_the_new_config_and_lets_an_open_stream_end_on_the_old(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    config = tmp_path / "gw.yaml"
    write(config, tmp_path, [alias("m", upstream, "first", 1.0)])
    finish = asyncio.Event()
    answered = asyncio.Event()
    answered.set()
    upstream.push(held_open(upstream, finish), held_open(upstream, answered))
    port = free_port()
    process = await start(config, port)
    log = Log(process)
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=ask("m")) as old:
                assert old.status == 200
                body = await old.content.readany()  # the first piece: the stream is open
                new_models = [
                    alias("m", upstream, "second", 10.0),
                    alias("m2", upstream, "third", 10.0),
                ]
                write(config, tmp_path, new_models)
                process.send_signal(signal.SIGHUP)
                [reloaded] = await log.wait_for("config reloaded")
                assert "aliases 1 added, 0 removed, 1 changed" in reloaded, reloaded
                assert "deployments 2 added, 1 removed, 0 changed" in reloaded, reloaded

                # A new request: the new deployment, at the new price; the new alias answers.
                async with session.post(url, json=ask("m")) as new:
                    assert new.status == 200, await new.text()
                    assert new.headers["X-Gateway-Deployment"] == "second"
                    new_conversation = new.headers["X-Conversation-Id"]
                    await new.read()
                async with session.post(url, json=ask("m2")) as added:
                    assert added.status == 200, await added.text()
                    await added.read()

                finish.set()  # the open stream ends on the deployment it began on
                body += await old.read()
                old_conversation = old.headers["X-Conversation-Id"]
                assert old.headers["X-Gateway-Deployment"] == "first"
            assert body.endswith(DONE), body[-300:]
            assert text_of(body) == "old answer."
    finally:
        code = await stop(process, log)
    assert code == 0, "".join(log.lines)
    assert log.having("config reload failed") == []
    rows = usage_rows(tmp_path / "gw.db")
    # Its price is the one it was admitted and began under; the new one applies from then on.
    assert rows[old_conversation] == ("first", cost(1.0))
    assert rows[new_conversation] == ("second", cost(10.0))


async def test_a_broken_config_is_refused_in_one_line_and_the_old_one_kept(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    config = tmp_path / "gw.yaml"
    write(config, tmp_path, [alias("m", upstream, "first", 1.0)])
    port = free_port()
    process = await start(config, port)
    log = Log(process)
    try:
        broken = alias("m", upstream, "second", 1.0)
        broken["strategy"] = "cheapest-please"
        write(config, tmp_path, [broken])
        process.send_signal(signal.SIGHUP)
        [refused] = await log.wait_for("config reload failed")
        assert refused.count("\n") == 1
        assert str(config) in refused and "models[0].strategy" in refused, refused
        assert "ERROR" in refused
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            async with session.post(url, json=ask("m")) as response:
                assert response.status == 200, await response.text()
                assert response.headers["X-Gateway-Deployment"] == "first"
                await response.read()
        # A file that is not YAML at all: refused the same way.
        config.write_text("models: [unclosed\n")
        process.send_signal(signal.SIGHUP)
        await log.wait_for("config reload failed", 2)
        assert process.returncode is None
    finally:
        code = await stop(process, log)
    assert code == 0, "".join(log.lines)
    assert log.having("config reloaded") == []
    assert len(log.having("config reload failed")) == 2
    assert not log.having("Traceback")


async def test_the_supervisor_passes_sighup_to_every_worker(tmp_path: Path) -> None:
    config = tmp_path / "gw.yaml"
    demo = {"name": "demo", "deployments": [{"provider": "demo", "price": "free"}]}
    write(config, tmp_path, [demo])
    port = free_port()
    supervisor = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "serve", "--config", str(config),
        "--port", str(port), "--workers", "2",
        stderr=asyncio.subprocess.PIPE,
        env={**{k: v for k, v in os.environ.items() if k != "GATEWAY_MASTER_KEY"},
             "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    log = Log(supervisor)
    try:
        await log.wait_for("listening on", 2)
        write(config, tmp_path, [demo, {**demo, "name": "demo2"}])
        supervisor.send_signal(signal.SIGHUP)
        reloaded = await log.wait_for("config reloaded", 2)
        assert all("aliases 1 added" in line for line in reloaded), reloaded
        assert supervisor.returncode is None
    finally:
        code = await stop(supervisor, log)
    assert code == 0, "".join(log.lines)
    assert not log.having("exited with"), "".join(log.lines)


def test_the_systemd_unit_reloads_with_sighup() -> None:
    unit = (Path(__file__).parent.parent / "deploy" / "gateway.service").read_text()
    assert "ExecReload=/bin/kill -HUP $MAINPID" in unit.splitlines()


def test_the_chart_rolls_pods_on_a_config_change_unless_told_to_leave_them() -> None:
    from tests.deploy.test_deploy import by_kind, render

    def annotations(values: dict[str, Any] | None) -> dict[str, str]:
        deployment = by_kind(render(values))["Deployment"]
        found: dict[str, str] = deployment["spec"]["template"]["metadata"]["annotations"]
        return found

    assert "checksum/config" in annotations(None)
    assert "checksum/config" not in annotations({"rollOnConfigChange": False})


async def test_sighup_rotates_the_master_key(tmp_path: Path, upstream: FakeUpstream) -> None:
    config = tmp_path / "gw.yaml"
    old_key, new_key = "old-master-key-0123456789", "new-master-key-0123456789"

    def write_keyed(key: str) -> None:
        write(config, tmp_path, [alias("m", upstream, "first", 1.0)])
        keyed = json.loads(config.read_text())
        config.write_text(json.dumps({**keyed, "auth": {"master_key": key}}))

    write_keyed(old_key)
    port = free_port()
    process = await start(config, port)
    log = Log(process)

    async def status(key: str) -> int:
        async with aiohttp.ClientSession() as session:
            url = f"http://127.0.0.1:{port}/v1/models"
            headers = {"Authorization": f"Bearer {key}"}
            async with session.get(url, headers=headers) as response:
                return response.status

    try:
        assert (await status(old_key), await status(new_key)) == (200, 401)
        write_keyed(new_key)
        process.send_signal(signal.SIGHUP)
        [reloaded] = await log.wait_for("config reloaded")
        assert "auth changed" in reloaded
        assert (await status(old_key), await status(new_key)) == (401, 200)
    finally:
        code = await stop(process, log)
    assert code == 0, "".join(log.lines)
    assert not any(key in line for line in log.lines for key in (old_key, new_key))
