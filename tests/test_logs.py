"""The log of a real `gateway serve` process (docs/operations.md, "Logs"): with `logging.format:
json` every line of its stderr is one JSON object, every record made while serving a request
carries that request's id, each request has one access record, and a traceback stays inside its
record; with `text` the request id is in the line. No key is in any line."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from yarl import URL

from gateway.logs import ACCESS_FIELDS, TextFormatter
from tests.fakes import FakeUpstream, completion, status
from tests.test_cli import free_port

MASTER = "master-key-for-the-log-tests-0123456789"
UPSTREAM_KEY = "sk-upstream-key-of-the-log-tests-0123456789"
CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "hi"}]
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
# The replayed stream's usage (tests/fixtures/real-streams/openai-chat-text-usage.sse), and a
# whole completion's (tests.fakes.USAGE).
STREAM_TOKENS = (78, 9)
PLAIN_TOKENS = (5, 7)
# A chat completion whose message is not an object: the pipeline fails on it unexpectedly and
# logs that with its traceback (`log.exception`), then the request gets a 500.
BROKEN = {
    "id": "chatcmpl-broken",
    "object": "chat.completion",
    "created": 1,
    "model": "fake-model",
    "choices": [{"index": 0, "message": "not an object", "finish_reason": "stop"}],
}


@dataclass
class Served:
    """A `gateway serve` process and every line of its stderr so far."""

    process: asyncio.subprocess.Process
    port: int
    lines: list[str] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def read(self) -> None:
        assert self.process.stderr is not None
        while line := await self.process.stderr.readline():
            self.lines.append(line.decode())

    async def wait_for(self, text: str, timeout: float = 30) -> None:
        async with asyncio.timeout(timeout):
            while not any(text in line for line in self.lines):
                assert self.process.returncode is None, "".join(self.lines)
                await asyncio.sleep(0.01)

    async def ready(self, timeout: float = 30) -> None:
        """Until it answers (its "listening" line is not written at every level)."""
        async with asyncio.timeout(timeout), aiohttp.ClientSession() as session:
            while True:
                assert self.process.returncode is None, "".join(self.lines)
                try:
                    async with session.get(self.url + "/health/live") as response:
                        if response.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.05)

    async def stop(self) -> str:
        """SIGTERM, then the whole of its stderr."""
        if self.process.returncode is None:
            self.process.send_signal(signal.SIGTERM)
        code = await asyncio.wait_for(self.process.wait(), 30)
        assert self.reader is not None
        await asyncio.wait_for(self.reader, 30)
        assert code == 0, "".join(self.lines)
        return "".join(self.lines)


async def serve(tmp_path: Path, upstream: FakeUpstream, logging: dict[str, Any]) -> Served:
    config = tmp_path / "gw.yaml"
    config.write_text(
        json.dumps(
            {
                "server": {"shutdown_grace_s": 1},
                "auth": {"master_key": MASTER},
                "store": {"url": f"sqlite:///{tmp_path}/gw.db", "spool_path": str(tmp_path)},
                "logging": logging,
                "models": [
                    {
                        "name": "fake",
                        "retry": {"max_attempts": 1},
                        "deployments": [upstream.deployment(api_key=UPSTREAM_KEY)],
                    }
                ],
            }
        )
    )
    port = free_port()
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", str(port)),
        stderr=asyncio.subprocess.PIPE,
        env={
            **{k: v for k, v in os.environ.items() if k != "GATEWAY_MASTER_KEY"},
            "PYTHONUNBUFFERED": "1",
        },
    )
    served = Served(process, port)
    served.reader = asyncio.create_task(served.read())  # never let the pipe fill up
    try:
        await served.ready()
    except BaseException:
        process.kill()
        await process.wait()
        raise
    return served


@dataclass
class Sent:
    """A request the test made, as its response told it."""

    name: str
    request_id: str
    status: int
    headers: dict[str, str]


async def request(
    session: aiohttp.ClientSession,
    served: Served,
    name: str,
    method: str,
    path: str,
    body: Any = None,
    key: str = MASTER,
    headers: dict[str, str] | None = None,
) -> tuple[Sent, Any]:
    headers = {"Authorization": f"Bearer {key}", **(headers or {})}
    async with session.request(method, served.url + path, json=body, headers=headers) as r:
        raw = await r.read()
        sent = Sent(name, r.headers["X-Request-Id"], r.status, dict(r.headers))
    try:
        return sent, json.loads(raw)
    except ValueError:
        return sent, raw


async def test_json_logs_carry_request_ids_access_records_and_whole_tracebacks(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    served = await serve(tmp_path, upstream, {"format": "json"})
    made: list[Sent] = []
    try:
        async with aiohttp.ClientSession() as session:
            team, _ = await request(
                session, served, "team", "POST", "/v1/gateway/teams", {"id": "red", "name": "Red"}
            )
            assert team.status == 201
            created, key = await request(
                session, served, "key", "POST", "/v1/gateway/keys", {"team_id": "red"}
            )
            assert created.status == 201
            secret = key["key"]
            made += [team, created]

            stream = {"model": "fake", "messages": HELLO, "stream": True}
            streamed, body = await request(session, served, "stream", "POST", CHAT, stream, secret)
            assert streamed.status == 200 and body.endswith(b"data: [DONE]\n\n")

            upstream.push(completion("Hello there"))
            plain_body = {"model": "fake", "messages": HELLO}
            plain, answer = await request(
                session,
                served,
                "plain",
                "POST",
                CHAT,
                plain_body,
                secret,
                headers={"X-Request-Id": "log-test-plain-1"},
            )
            assert plain.status == 200, answer
            assert plain.request_id == "log-test-plain-1"  # the client's own id, kept

            unknown = {"model": "no-such-alias", "messages": HELLO}
            refused, error = await request(session, served, "error", "POST", CHAT, unknown, secret)
            assert refused.status == 404, error

            upstream.push(status(200, BROKEN))
            crashed, _ = await request(session, served, "crash", "POST", CHAT, plain_body, secret)
            assert crashed.status == 500

            probe, _ = await request(session, served, "probe", "GET", "/health/ready")
            assert probe.status == 200
            made += [streamed, plain, refused, crashed, probe]

            # A stream whose client leaves after its first piece.
            upstream.stall_after(["Hel", "lo"])
            async with session.post(
                served.url + CHAT, json=stream, headers={"Authorization": f"Bearer {secret}"}
            ) as response:
                assert b"data: " in await response.content.readline()
                left = Sent("left", response.headers["X-Request-Id"], 200, dict(response.headers))
                response.close()  # the connection is dropped mid-stream
            made.append(left)
            await served.wait_for(left.request_id)  # its access record, once it noticed
    finally:
        stderr = await served.stop()

    # Every line is one JSON object; nothing else reached stderr.
    lines = stderr.splitlines()
    records = [json.loads(line) for line in lines]
    assert all(isinstance(r, dict) for r in records)
    for record in records:
        assert {"time", "level", "logger", "message"} <= record.keys(), record
        assert ISO_UTC.match(record["time"]), record["time"]
    assert any("listening on" in r["message"] for r in records)

    # One access record per request, with every field, under its request id (the probe's is
    # at DEBUG: not written at INFO).
    by_id = {sent.request_id: sent for sent in made}
    assert len(by_id) == len(made)
    access = [r for r in records if r["logger"] == "gateway.access"]
    assert sorted(r["request_id"] for r in access) == sorted(
        s.request_id for s in made if s.name != "probe"
    )
    assert not [r for r in records if r.get("request_id") == probe.request_id]
    of = {by_id[r["request_id"]].name: r for r in access}
    for record in access:
        assert set(ACCESS_FIELDS) <= record.keys(), record
        assert record["level"] == "INFO"
        assert isinstance(record["duration_ms"], float) and record["duration_ms"] >= 0
        assert record["status"] == by_id[record["request_id"]].status
    assert (of["team"]["method"], of["team"]["path"]) == ("POST", "/v1/gateway/teams")
    assert of["team"]["key_prefix"] is None  # the master key: no part of it is ever written
    for name, tokens in (("stream", STREAM_TOKENS), ("plain", PLAIN_TOKENS)):
        record, sent = of[name], by_id[of[name]["request_id"]]
        assert (record["method"], record["path"], record["status"]) == ("POST", CHAT, 200)
        assert record["alias"] == "fake"
        assert record["deployment"] == sent.headers["X-Gateway-Deployment"]
        assert record["key_prefix"] == secret[:7]
        assert record["team_id"] == "red"
        assert (record["prompt_tokens"], record["completion_tokens"]) == tokens
        assert record["conversation_id"] == sent.headers["X-Conversation-Id"]
        assert record["turn_id"] == sent.headers["X-Gateway-Turn-Id"]
        assert record["interrupted"] is False
        assert record["error"] is None
    assert of["error"]["status"] == 404 and of["error"]["error"] == "model_not_found"
    assert of["error"]["key_prefix"] == secret[:7] and of["error"]["team_id"] == "red"
    assert of["crash"]["status"] == 500 and of["crash"]["interrupted"] is False
    assert of["crash"]["turn_id"] is not None  # the turn it crashed in
    assert of["left"]["status"] == 200 and of["left"]["interrupted"] is True
    assert of["left"]["conversation_id"] == left.headers["X-Conversation-Id"]
    assert of["left"]["turn_id"] == left.headers["X-Gateway-Turn-Id"]

    # Every record made while serving a request carries its id: those of the request that
    # crashed, each with its whole traceback as one string.
    failures = [r for r in records if "exception" in r]
    assert len(failures) >= 1
    for record in failures:
        assert record["request_id"] == crashed.request_id, record
        assert record["level"] == "ERROR"
        trace = record["exception"]
        assert trace.startswith("Traceback (most recent call last):")
        assert trace.count("\n") > 3 and "AttributeError" in trace
    # Each request's records come between its start and its access record: every record
    # from the first request on that is no access record belongs to the next access record.
    first = next(i for i, r in enumerate(records) if r.get("request_id") == team.request_id)
    pending: list[dict[str, Any]] = []
    for record in records[first:]:
        if record["logger"] == "gateway.access":
            assert all(p.get("request_id") == record["request_id"] for p in pending), pending
            pending = []
        elif record["message"] != "shutting down":
            pending.append(record)
        else:
            break
    assert not pending, pending

    # No key in any line: neither the master key, the upstream's, nor the virtual key.
    for secret_text in (MASTER, UPSTREAM_KEY, secret):
        assert secret_text not in stderr


async def test_text_logs_name_the_request_in_the_line(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    served = await serve(tmp_path, upstream, {"format": "text", "level": "info"})
    try:
        async with aiohttp.ClientSession() as session:
            upstream.push(completion("Hello there"))
            body = {"model": "fake", "messages": HELLO}
            sent, _ = await request(
                session, served, "plain", "POST", CHAT, body, headers={"X-Request-Id": "text-1"}
            )
            assert sent.status == 200
            upstream.push(status(200, BROKEN))
            crashed, _ = await request(session, served, "crash", "POST", CHAT, body)
            assert crashed.status == 500
    finally:
        stderr = await served.stop()
    [line] = [line for line in stderr.splitlines() if "[text-1]" in line]
    assert " INFO gateway.access [text-1]: POST /v1/chat/completions 200 " in line
    assert "alias=fake" in line and "prompt_tokens=5" in line and "completion_tokens=7" in line
    # A traceback follows its record's line, as Python prints it.
    failed = [i for i, line in enumerate(stderr.splitlines()) if f"[{crashed.request_id}]" in line]
    assert any(
        stderr.splitlines()[i + 1] == "Traceback (most recent call last):" for i in failed[:-1]
    )
    assert MASTER not in stderr and UPSTREAM_KEY not in stderr


async def test_the_level_is_honoured(tmp_path: Path, upstream: FakeUpstream) -> None:
    served = await serve(tmp_path, upstream, {"format": "json", "level": "warning"})
    try:
        async with aiohttp.ClientSession() as session:
            upstream.push(status(200, BROKEN))
            body = {"model": "fake", "messages": HELLO}
            crashed, _ = await request(session, served, "crash", "POST", CHAT, body)
            assert crashed.status == 500
    finally:
        stderr = await served.stop()
    records = [json.loads(line) for line in stderr.splitlines()]
    assert records and all(r["level"] in ("WARNING", "ERROR") for r in records)
    assert not [r for r in records if r["logger"] == "gateway.access"]  # INFO: not written
    assert [r["request_id"] for r in records if "exception" in r] == [crashed.request_id] * 2


# A path whose decoded form would end the access line and start a forged record of its own.
FORGED = "forged-by-the-client"
INJECTION = (
    "/v1/models%0a2026-01-01%2000:00:00,000%20CRITICAL%20gateway:%20"
    f"{FORGED}%0d%1b[2K%e2%80%a8%c2%85x"
)


@pytest.mark.parametrize("format_", ["text", "json"])
async def test_a_path_with_line_breaks_stays_on_its_one_line(
    tmp_path: Path, upstream: FakeUpstream, format_: str
) -> None:
    served = await serve(tmp_path, upstream, {"format": format_})
    try:
        async with aiohttp.ClientSession() as session:
            url = URL(served.url + INJECTION, encoded=True)
            headers = {"Authorization": f"Bearer {MASTER}"}
            async with session.get(url, headers=headers) as response:
                assert response.status == 404
    finally:
        stderr = await served.stop()
    lines = stderr.splitlines()  # splits at \r, \x1c-\x1e, \x85 and U+2028 as well
    [line] = [line for line in lines if FORGED in line]
    assert "\x1b" not in stderr
    if format_ == "json":
        record = json.loads(line)
        assert record["logger"] == "gateway.access"
        assert record["path"] == (
            f"/v1/models\n2026-01-01 00:00:00,000 CRITICAL gateway: {FORGED}\r\x1b[2K\u2028\x85x"
        )
    else:
        assert " INFO gateway.access [" in line
        assert line.endswith(" 404 duration_ms=" + line.split(" 404 duration_ms=")[1])
        assert f"/v1/models\\n2026-01-01 00:00:00,000 CRITICAL gateway: {FORGED}" in line
        assert "\\r\\x1b[2K\\u2028\\x85x 404 " in line


def test_a_text_record_quoting_a_line_break_is_one_line() -> None:
    record = logging.LogRecord(
        "gateway", logging.WARNING, __file__, 1, "refused %s", ("/a\nFAKE ERROR line",), None
    )
    line = TextFormatter().format(record)
    assert "\n" not in line
    assert line.endswith("WARNING gateway: refused /a\\nFAKE ERROR line")
