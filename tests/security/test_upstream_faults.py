"""Upstream faults through a real gateway: each ends as a recorded attempt (`assistant/attempt`
+ `request/error` with the fault's code) and a clear error to the client, or a successful
fallback to the next deployment; the gateway keeps serving, and its memory stays bounded.

Covered elsewhere and not repeated here: an HTTP error status with the provider's JSON, an HTML
error page from a load balancer, a single 429 with Retry-After (honoured, or past the cap),
connection refused, a reset after content, a stall after content (idle timeout) or before the
first content chunk (first-token timeout), in-band error events, a stream that ends without a
finish_reason (tests/http/test_provider_errors.py, test_routing.py, test_continue_on_failure.py).

Here: a reset at random byte offsets of a real captured stream and before the headers, a stall
before the headers, a slow drip (relayed intact; or cut by the total timeout), malformed SSE
lines and invalid JSON in a chunk, a 10 MB chunk (relayed) and frames or bodies past the size
limits (refused after a bounded read), a wrong content type, TLS failures (a plain-HTTP port
spoken to in TLS, a self-signed certificate), a DNS failure, 429 storms with Retry-After under
and over the cap, and the process's memory and tasks across 200 faulty requests.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
import shutil
import ssl
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDictProxy

from gateway.providers.openai_chat import ChatStreamParser
from gateway.stream.events import BlockDelta, Finish
from gateway.stream.sse import SSEDecoder
from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import (
    DONE,
    FAILED_TURN,
    FAKE,
    FakeUpstream,
    Script,
    chunk,
    completion,
    fixture_bytes,
    frames,
    hang_before_headers,
    paused,
    status,
)

QUESTION = [{"role": "user", "content": "Fault me."}]
FIXTURE = "openai-chat-text-usage.sse"
TEXT = "The capital of the UK is London."  # what FIXTURE says (every fake's default answer)
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05}
# Each test provokes many faults in a row; no cooldown should take `a` out of the plan.
NO_COOLDOWN = {"failures": 100_000}
MIB = 1 << 20
FALLBACK = ["user/message", "assistant/attempt", "request/error", "assistant/message", "turn/end"]


# -- the rig: alias `m` tries a then b; alias `solo` is a alone, one attempt --------------------


def deployment(url: str, name: str, **extra: Any) -> dict[str, Any]:
    return {"provider": "openai", "api_base": url, "name": name, "model": name, **extra}


@dataclass
class Rig:
    gw: GatewayUnderTest
    a: FakeUpstream
    b: FakeUpstream


async def rig(make_gateway: MakeGateway, make_upstream: MakeUpstream, **a_extra: Any) -> Rig:
    a, b = await make_upstream(), await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "retry": FAST,
                "cooldown": NO_COOLDOWN,
                "deployments": [deployment(a.url, "a", **a_extra), deployment(b.url, "b")],
            },
            {
                "name": "solo",
                "retry": {"max_attempts": 1},
                "cooldown": NO_COOLDOWN,
                "deployments": [deployment(a.url, "a-solo", **a_extra)],
            },
        ]
    )
    return Rig(gw, a, b)


@dataclass
class Answer:
    status: int
    body: bytes
    headers: CIMultiDictProxy[str]

    @property
    def conversation(self) -> str:
        return self.headers["X-Conversation-Id"]

    def frames(self) -> list[dict[str, Any]]:
        decoder = SSEDecoder()
        found = [*decoder.feed(self.body), *decoder.flush()]
        return [json.loads(f.data) for f in found if f.data and f.data.startswith("{")]

    def text(self) -> str:
        """The streamed text, from the SSE frames' deltas (or a whole completion's)."""
        if not self.headers.get("Content-Type", "").startswith("text/event-stream"):
            if self.status != 200:
                return ""
            return str(json.loads(self.body)["choices"][0]["message"]["content"])
        out = ""
        for obj in self.frames():
            for choice in obj.get("choices") or []:
                out += (choice.get("delta") or {}).get("content") or ""
        return out

    def error(self) -> dict[str, Any]:
        """The error the client got: the JSON body, or the stream's last event."""
        if self.status != 200:
            found: dict[str, Any] = json.loads(self.body)["error"]
            return found
        last = self.frames()[-1]
        assert "error" in last, self.body[-300:]
        found = last["error"]
        return found


async def ask(
    gw: GatewayUnderTest,
    model: str,
    *,
    stream: bool = True,
    release: asyncio.Event | None = None,
) -> Answer:
    """A chat completion. With `release`: set it once the first SSE frame has arrived (so the
    rest of a `paused` upstream comes after the client has that frame)."""
    body = {"model": model, "messages": QUESTION, "stream": stream}
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + "/v1/chat/completions", json=body) as response:
            received = b""
            if release is not None:
                while b"\n\n" not in received:
                    piece = await response.content.readany()
                    assert piece, received
                    received += piece
                release.set()
            received += await response.read()
            return Answer(response.status, received, response.headers)


async def failures(gw: GatewayUnderTest, answer: Answer) -> tuple[list[str], list[tuple[str, str]]]:
    """The turn's event types, and (deployment, code) of each failed attempt."""
    events = await gw.wait_turn_end(answer.conversation)
    errors = [
        (e["payload"]["route"]["deployment"], e["payload"]["code"])
        for e in events
        if e["type"] == "request/error"
    ]
    return [e["type"] for e in events], errors


async def still_serving(rig: Rig) -> None:
    """A normal request right after the fault gets its whole answer."""
    answer = await ask(rig.gw, "m")
    assert (answer.status, answer.text()) == (200, TEXT)


async def fell_back(rig: Rig, answer: Answer, code: str | set[str]) -> None:
    """The fault cost one recorded attempt on `a`, and `b` answered in full."""
    assert answer.status == 200, answer.body[:300]
    assert answer.text() == TEXT
    assert answer.headers["X-Gateway-Deployment"] == "b"
    kinds, errors = await failures(rig.gw, answer)
    assert kinds == FALLBACK
    codes = {code} if isinstance(code, str) else code
    assert len(errors) == 1 and errors[0][0] == "a" and errors[0][1] in codes, errors


# -- scripts for the fake upstream ------------------------------------------------------------


def reset_before_headers() -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        request.transport.abort()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return script


def drip(data: bytes, gap_s: float, *, then: bytes = b"", then_gap_s: float = 0.02) -> Script:
    """`data` one byte at a time, `gap_s` apart; then, if given, `then` over and over."""

    async def script(request: web.Request) -> web.StreamResponse:
        fake: FakeUpstream = request.app[FAKE]
        response = await fake.start_sse(request)
        for i in range(len(data)):
            await fake.write(response, data[i : i + 1])
            await asyncio.sleep(gap_s)
        while then:
            await fake.write(response, then)
            await asyncio.sleep(then_gap_s)
        await response.write_eof()
        return response

    return script


def endless(head: bytes, block: bytes, *, sse: bool = True, cap: int = 512 * MIB) -> Script:
    """`head`, then `block` after `block` until the gateway hangs up (or `cap` bytes)."""

    async def script(request: web.Request) -> web.StreamResponse:
        fake: FakeUpstream = request.app[FAKE]
        if sse:
            response = await fake.start_sse(request)
        else:
            response = web.StreamResponse(headers={"Content-Type": "application/json"})
            await response.prepare(request)
        await fake.write(response, head)
        while fake.bytes_sent < cap:
            await fake.write(response, block)
        await response.write_eof()
        return response

    return script


def answer_with(content_type: str, body: str) -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        return web.Response(status=200, text=body, content_type=content_type)

    return script


# -- resets -------------------------------------------------------------------------------------


def seen(prefix: bytes) -> tuple[bool, bool]:
    """Whether the complete frames of `prefix` hold content, and a finish_reason."""
    parser = ChatStreamParser()
    content = False
    for frame in SSEDecoder().feed(prefix):
        events, _ = parser.feed(frame)
        content |= any(
            (isinstance(e, BlockDelta) and e.text) or isinstance(e, Finish) for e in events
        )
    return content, parser.finished


async def test_a_reset_at_any_offset_is_an_attempt_and_a_clear_end(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream)
    body = fixture_bytes(FIXTURE)
    offsets = sorted({0, 1, len(body) - 2, *random.Random(20261201).sample(range(len(body)), 12)})
    outcomes: set[str] = set()
    for offset in offsets:
        r.a.push(frames(body[:offset], then="reset"))
        answer = await ask(r.gw, "m")
        content, finished = seen(body[:offset])
        kinds, errors = await failures(r.gw, answer)
        if not content:  # nothing had reached the client: the next deployment answers
            await fell_back(r, answer, "upstream_protocol_error")
            outcomes.add("fallback")
        elif not finished:  # a prefix reached the client: it ends with an error event
            assert answer.status == 200
            assert TEXT.startswith(answer.text()) and answer.text() != TEXT
            assert answer.error()["type"] == "upstream_error"
            assert kinds == FAILED_TURN, offset
            assert errors == [("a", "upstream_protocol_error")]
            outcomes.add("partial")
        else:  # the finish_reason had reached the client: a complete answer
            assert answer.status == 200 and answer.text() == TEXT
            assert not any("error" in frame for frame in answer.frames())
            assert kinds == ["user/message", "assistant/message", "turn/end"], (offset, kinds)
            outcomes.add("complete")
    assert outcomes == {"fallback", "partial", "complete"}
    # Before the response headers: a broken connection, not an HTTP answer.
    r.a.push(reset_before_headers())
    await fell_back(r, await ask(r.gw, "m"), "upstream_connect_error")
    r.a.push(reset_before_headers())
    answer = await ask(r.gw, "solo", stream=False)
    assert (answer.status, answer.error()["code"]) == (502, "upstream_connect_error")
    await still_serving(r)


# -- stalls and drips ----------------------------------------------------------------------------


async def test_a_stall_before_the_headers_times_out(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream, timeouts={"first_token_s": 0.3})
    r.a.push(hang_before_headers())
    await fell_back(r, await ask(r.gw, "m"), "upstream_timeout_first_token")
    await asyncio.wait_for(r.a.disconnected.wait(), 5)  # the stalled request was closed
    r.a.push(hang_before_headers())
    answer = await ask(r.gw, "solo")
    assert (answer.status, answer.error()["code"]) == (504, "upstream_timeout_first_token")
    await still_serving(r)


async def test_a_slow_drip_is_relayed_intact_within_the_timeouts(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream, timeouts={"idle_s": 0.5})
    sent = chunk("Drip") + chunk(", drip.") + chunk(finish="stop") + DONE
    r.a.push(drip(sent, 0.001))
    answer = await ask(r.gw, "solo")
    assert answer.status == 200
    assert answer.body == sent  # byte for byte, however it was split
    kinds, errors = await failures(r.gw, answer)
    assert kinds[-2:] == ["assistant/message", "turn/end"] and errors == []
    await still_serving(r)


async def test_an_endless_drip_is_cut_by_the_total_timeout(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream, timeouts={"idle_s": 0.3, "total_s": 0.6})
    # Each byte comes well within idle_s, so only the total timeout can end it.
    r.a.push(drip(chunk("Started"), 0.0, then=b"data: {"))
    started = time.monotonic()
    answer = await ask(r.gw, "solo")
    assert time.monotonic() - started < 5
    assert answer.text() == "Started"
    assert answer.error()["code"] == "upstream_timeout_total"
    kinds, errors = await failures(r.gw, answer)
    assert kinds == FAILED_TURN and errors == [("a-solo", "upstream_timeout_total")]
    await asyncio.wait_for(r.a.disconnected.wait(), 5)
    # Before any content the same drip falls back.
    r.a.push(drip(b": keep-alive\n", 0.0, then=b": still here\n"))
    await fell_back(r, await ask(r.gw, "m"), "upstream_timeout_total")
    await still_serving(r)


# -- malformed streams -----------------------------------------------------------------------


async def test_lines_sse_ignores_are_skipped(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream)
    junk = [
        b"this line has no colon\n\n",
        b"\x00\xff\xfe binary junk\n\n",
        b"retry: soon\n\n",
        b"event: unknown-kind\n\n",
        b": a comment\n\n",
        b"id: 7\r\n\r\n",
    ]
    r.a.push(frames(chunk("Hel"), *junk, chunk("lo"), chunk(finish="stop"), DONE))
    answer = await ask(r.gw, "solo")
    assert (answer.status, answer.text()) == (200, "Hello")
    kinds, errors = await failures(r.gw, answer)
    assert kinds[-2:] == ["assistant/message", "turn/end"] and errors == []
    await still_serving(r)


BAD_CHUNKS = [
    b"data: {not json\n\n",
    b"data: \n\n",
    b"data: [1, 2]\n\n",
    b'data: "a string"\n\n',
    b'data: {"choices": [{"delta": {"content": "cut\n\n',
    b"data: \xff\xfe{}\n\n",
]


@pytest.mark.parametrize("bad", BAD_CHUNKS)
async def test_invalid_json_in_a_chunk_is_a_protocol_error(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, bad: bytes
) -> None:
    r = await rig(make_gateway, make_upstream)
    r.a.push(frames(bad, chunk("never"), chunk(finish="stop"), DONE))
    await fell_back(r, await ask(r.gw, "m"), "upstream_protocol_error")
    r.a.release.clear()
    r.a.push(paused([chunk("Hel")], [bad, chunk("lo"), chunk(finish="stop"), DONE]))
    answer = await ask(r.gw, "solo", release=r.a.release)
    assert answer.text() == "Hel"
    assert answer.error()["code"] == "upstream_protocol_error"
    kinds, errors = await failures(r.gw, answer)
    assert kinds == FAILED_TURN and errors == [("a-solo", "upstream_protocol_error")]
    await still_serving(r)


# -- size ----------------------------------------------------------------------------------------


async def test_a_10_mb_chunk_is_relayed_and_recorded_up_to_the_cap(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream)
    big = "0123456789" * MIB  # 10 MiB of text in one SSE data line
    r.a.push(frames(chunk(big), chunk(finish="stop"), DONE))
    answer = await ask(r.gw, "solo")
    assert answer.status == 200
    assert answer.text() == big
    events = await r.gw.wait_turn_end(answer.conversation)
    message = next(e for e in events if e["type"] == "assistant/message")
    # conversations.record_max_text_chars (tests/stream/test_record_caps.py)
    cap = r.gw.gateway.config.conversations.record_max_text_chars
    assert message["payload"]["content"] == [{"type": "text", "text": big[:cap]}]
    assert message["payload"]["truncated_record"] is True
    await still_serving(r)


async def test_frames_and_bodies_past_the_limits_are_refused_after_a_bounded_read(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream)
    # One frame over the 16 MiB limit (SSEDecoder's max_frame_bytes), before any content.
    r.a.push(frames(b"data: " + b"x" * (17 * MIB) + b"\n\n"))
    await fell_back(r, await ask(r.gw, "m"), "upstream_protocol_error")
    # A frame that never ends: the gateway stops reading at the limit and hangs up.
    r.a.bytes_sent = 0
    r.a.disconnected.clear()
    r.a.push(endless(b"data: ", b"x" * MIB))
    answer = await ask(r.gw, "solo")
    assert (answer.status, answer.error()["code"]) == (502, "upstream_protocol_error")
    assert "exceeded" in answer.error()["message"]
    await asyncio.wait_for(r.a.disconnected.wait(), 10)
    assert 16 * MIB <= r.a.bytes_sent < 48 * MIB  # the limit plus what was in flight
    # A non-streaming body that never ends: cut at 64 MiB.
    r.a.bytes_sent = 0
    r.a.disconnected.clear()
    r.a.push(endless(b'{"choices": "', b"x" * MIB, sse=False))
    answer = await ask(r.gw, "solo", stream=False)
    assert (answer.status, answer.error()["code"]) == (502, "upstream_protocol_error")
    await asyncio.wait_for(r.a.disconnected.wait(), 10)
    assert 64 * MIB <= r.a.bytes_sent < 96 * MIB
    await still_serving(r)


# -- wrong content type ------------------------------------------------------------------------


async def test_a_wrong_content_type_is_a_clear_error(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream)
    page = "<html><body><h1>Service maintenance</h1><p>Back soon.</p></body></html>"
    whole = json.dumps({"id": "x", "object": "chat.completion", "choices": []})
    cases: list[tuple[Script, bool, str]] = [
        # A 200 HTML page (a captive portal, a maintenance page) where a stream was asked for.
        (answer_with("text/html", page), True, "upstream_incomplete_stream"),
        # A whole JSON answer where a stream was asked for (the upstream ignored `stream`).
        (answer_with("application/json", whole), True, "upstream_incomplete_stream"),
        # An HTML page where JSON was expected.
        (answer_with("text/html", page), False, "upstream_protocol_error"),
    ]
    for script, stream, code in cases:
        r.a.push(script)
        answer = await ask(r.gw, "solo", stream=stream)
        assert (answer.status, answer.error()["code"]) == (502, code)
        kinds, errors = await failures(r.gw, answer)
        assert kinds == FAILED_TURN and errors == [("a-solo", code)]
        r.a.push(script)
        if not stream:
            r.b.push(completion(TEXT))
        answer = await ask(r.gw, "m", stream=stream)
        assert answer.status == 200 and answer.headers["X-Gateway-Deployment"] == "b"
    await still_serving(r)


# -- connections: TLS, DNS -------------------------------------------------------------------


def self_signed(directory: Path) -> ssl.SSLContext | None:
    """A server context with a throwaway self-signed certificate (None without openssl)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    key, cert = directory / "key.pem", directory / "cert.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1"],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context


async def test_tls_and_dns_failures_are_connect_errors(
    make_gateway: MakeGateway,
    make_upstream: MakeUpstream,
    aiohttp_server: Any,
    tmp_path: Path,
) -> None:
    plain, b = await make_upstream(), await make_upstream()
    bases = {
        # TLS spoken to a plain-HTTP port: the handshake fails.
        "tls-plain": plain.url.replace("http://", "https://"),
        # No such host (RFC 2606: .invalid never resolves).
        "dns": "http://gateway-fault-test.invalid/v1",
    }
    context = await asyncio.to_thread(self_signed, tmp_path)
    if context is not None:  # A certificate nobody trusts.
        tls = FakeUpstream()
        server: TestServer = await aiohttp_server(tls.app, ssl=context)
        bases["tls-self-signed"] = str(server.make_url("/v1"))
    models = []
    for name, base in bases.items():
        models.append(
            {"name": name, "retry": {"max_attempts": 1}, "cooldown": NO_COOLDOWN,
             "deployments": [deployment(base, name)]}
        )  # fmt: skip
        models.append(
            {"name": f"{name}-chain", "retry": FAST, "cooldown": NO_COOLDOWN,
             "deployments": [deployment(base, f"{name}-first"), deployment(b.url, f"{name}-b")]}
        )  # fmt: skip
    gw = await make_gateway(models=models)
    for name in bases:
        for stream in (True, False):
            answer = await ask(gw, name, stream=stream)
            assert answer.status == 502, (name, answer.body)
            assert answer.error()["code"] == "upstream_connect_error", name
            kinds, errors = await failures(gw, answer)
            assert kinds == FAILED_TURN and errors == [(name, "upstream_connect_error")]
        answer = await ask(gw, f"{name}-chain")
        assert (answer.status, answer.text()) == (200, TEXT), name
        assert answer.headers["X-Gateway-Deployment"] == f"{name}-b"
    assert plain.requests == []  # the handshake never became a request
    assert context is None or len(bases) == 3


# -- 429 storms ------------------------------------------------------------------------------


def too_many(retry_after: str) -> Script:
    return status(
        429,
        {"error": {"message": "slow down", "type": "rate_limit_error",
                   "code": "rate_limit_exceeded"}},
        headers={"Retry-After": retry_after},
    )  # fmt: skip


@pytest.mark.parametrize(("retry_after", "attempts"), [("0.05", 3), ("3600", 2)])
async def test_a_429_storm_ends_every_request_with_a_429_and_retry_after(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, retry_after: str, attempts: int
) -> None:
    storm = await make_upstream()
    gw = await make_gateway(
        models=[
            {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]},
            {
                "name": "storm",
                "retry": {**FAST, "max_attempts": 3, "retry_after_cap_s": 1},
                "deployments": [deployment(storm.url, "s1"), deployment(storm.url, "s2")],
            },
        ]
    )
    clients = 30
    storm.push(*[too_many(retry_after) for _ in range(clients * attempts)])
    started = time.monotonic()
    answers = await asyncio.gather(*[ask(gw, "storm") for _ in range(clients)])
    elapsed = time.monotonic() - started
    assert elapsed < 10
    assert len(storm.requests) == clients * attempts  # bounded: no retry beyond the budget
    for answer in answers:
        assert answer.status == 429
        assert answer.error()["code"] == "rate_limit_exceeded"
        assert answer.headers["Retry-After"] == retry_after
        assert answer.headers["X-Gateway-Attempts"] == str(attempts)
        kinds, errors = await failures(gw, answer)
        assert kinds == ["user/message", *["assistant/attempt", "request/error"] * attempts,
                         "turn/end"]  # fmt: skip
        assert {code for _, code in errors} == {"rate_limit_exceeded"}
    # The deployments cool down; the gateway itself goes on serving.
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/v1/gateway/deployments") as response:
            states = {d["name"]: d["state"] for d in (await response.json())["data"]}
    assert states["s1"] != "healthy" and states["s2"] != "healthy"
    answer = await ask(gw, "demo")
    assert answer.status == 200 and answer.text()
    # When the storm passes, the cooling deployments are still tried rather than refused.
    answer = await ask(gw, "storm")
    assert (answer.status, answer.text()) == (200, TEXT)


# -- memory and leaks ------------------------------------------------------------------------


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def gateway_tasks() -> list[asyncio.Task[Any]]:
    """Tasks still running, but for the servers' keep-alive connection handlers."""
    return [t for t in asyncio.all_tasks() if "RequestHandler" not in repr(t.get_coro())]


FAULTS: list[tuple[str, Any]] = [
    ("reset", lambda: frames(chunk("Half "), then="reset")),
    ("reset-early", lambda: frames(b'data: {"cho', then="reset")),
    ("bad-json", lambda: frames(chunk("x"), b"data: {not json\n\n")),
    ("html", lambda: status(502, "<html><body>Bad Gateway</body></html>")),
    ("429", lambda: too_many("0")),
    ("500", lambda: status(500, {"error": {"message": "boom", "type": "server_error"}})),
    ("no-finish", lambda: frames(chunk("All "), chunk("good?"))),
    ("wrong-type", lambda: answer_with("text/html", "<html>maintenance</html>")),
]


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmRSS (Linux)")
async def test_memory_and_tasks_stay_bounded_across_200_faulty_requests(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    r = await rig(make_gateway, make_upstream)
    dead = {"provider": "openai", "api_base": "http://127.0.0.1:9/v1", "name": "dead"}
    gw = await make_gateway(
        models=[
            {"name": "solo", "retry": {"max_attempts": 1}, "cooldown": NO_COOLDOWN,
             "deployments": [deployment(r.a.url, "a-solo")]},
            {"name": "dead", "retry": {"max_attempts": 1}, "cooldown": NO_COOLDOWN,
             "deployments": [dead]},
        ]
    )  # fmt: skip
    rng = random.Random(5)

    async def round_of(n: int) -> None:
        for _ in range(n // 10):
            batch = []
            for _ in range(10):
                _name, make = rng.choice([*FAULTS, ("refused", None)])
                if make is None:
                    batch.append(ask(gw, "dead", stream=rng.random() < 0.5))
                else:
                    r.a.push(make())
                    batch.append(ask(gw, "solo", stream=rng.random() < 0.5))
            answers = await asyncio.gather(*batch)
            assert all(a.status >= 400 or b'"error"' in a.body for a in answers)

    await round_of(60)  # warm-up: imports, caches, pools, metric children
    await gw.flush()
    gc.collect()
    tasks, before = len(gateway_tasks()), rss_bytes()
    await round_of(200)
    await gw.flush()
    gc.collect()
    grown = rss_bytes() - before
    assert grown < 16 * MIB, f"RSS grew {grown / MIB:.1f} MiB over 200 faulty requests"
    assert len(gateway_tasks()) <= tasks
    assert gw.gateway.cancels == {}
    router = gw.gateway.router
    assert router is not None
    assert all(d.health.in_flight == 0 for d in router.deployments())
    assert gw.gateway.store.queue_depth() == 0
    turns = gw.query("SELECT count(*) FROM events WHERE type = 'turn/end'")[0][0]
    attempts = gw.query("SELECT count(*) FROM events WHERE type = 'request/error'")[0][0]
    assert turns == attempts == 260  # every faulty request: one recorded, failed attempt
    answer = await ask(gw, "solo")
    assert (answer.status, answer.text()) == (200, TEXT)
