"""A fake OpenAI-compatible upstream: a real aiohttp server speaking the exact SSE wire format.

Each request runs the next queued script (or replays a real captured stream by default). The
server records every request body, and sets `disconnected` when its client (the gateway)
drops the connection, so tests can prove the gateway closed the upstream request.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway.providers.wire import StreamParser
from gateway.stream.events import StreamEvent
from gateway.stream.sse import SSEDecoder

FIXTURES = Path(__file__).parent / "fixtures" / "real-streams"

Script = Callable[[web.Request], Awaitable[web.StreamResponse]]


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def expected(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "expected.json").read_text())
    return data[name]


def chunk(
    content: str | None = None,
    *,
    reasoning: str | None = None,
    reasoning_field: str = "reasoning_content",
    tool: dict[str, Any] | None = None,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    no_choices: bool = False,
) -> bytes:
    """One OpenAI chat completion chunk as an SSE frame."""
    delta: dict[str, Any] = {}
    if reasoning is not None:
        delta[reasoning_field] = reasoning
    if content is not None:
        delta["content"] = content
    if tool is not None:
        delta["tool_calls"] = [tool]
    obj: dict[str, Any] = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "fake-model",
        "choices": []
        if no_choices
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
    }
    if usage is not None:
        obj["usage"] = usage
    return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"
# The events of a turn whose only attempt failed (contract section 3).
FAILED_TURN = ["user/message", "assistant/attempt", "request/error", "turn/end"]
USAGE = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


class FakeUpstream:
    def __init__(self) -> None:
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self._handle)
        self.app.router.add_post("/v1/embeddings", self._handle)
        self.app.router.add_post("/v1/responses", self._handle)
        # Azure OpenAI's paths: the deployment is in the URL.
        self.app.router.add_post("/openai/deployments/{deployment}/chat/completions", self._handle)
        self.app.router.add_post("/openai/deployments/{deployment}/embeddings", self._handle)
        self.scripts: list[Script] = []
        self.requests: list[dict[str, Any]] = []
        self.seen: list[web.Request] = []  # path, query and headers of each request
        self.request_times: list[float] = []  # time.monotonic() of each request
        self.received = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.stalled = asyncio.Event()  # a script reached its stall point
        self.release = asyncio.Event()  # lets a `paused` script go on
        self.bytes_sent = 0
        self.url = ""
        self.app[FAKE] = self

    def push(self, *scripts: Script) -> None:
        self.scripts.extend(scripts)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.request_times.append(time.monotonic())
        self.requests.append(await request.json())
        self.seen.append(request)
        self.received.set()
        if self.scripts:
            script = self.scripts.pop(0)
        elif request.path.endswith("/embeddings"):
            script = embedding_vectors()
        else:
            script = replay("openai-chat-text-usage.sse")
        try:
            return await script(request)
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnected.set()
            raise

    # -- script helpers ------------------------------------------------------------------------

    async def start_sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        return response

    async def write(self, response: web.StreamResponse, data: bytes) -> None:
        await response.write(data)
        self.bytes_sent += len(data)

    async def stall(self) -> None:
        self.stalled.set()
        await asyncio.Event().wait()  # until the gateway goes away


FAKE = web.AppKey("fake", FakeUpstream)


def replay(name: str, piece: int = 0) -> Script:
    """Replay a captured stream byte for byte (in `piece`-byte writes when given)."""

    async def script(request: web.Request) -> web.StreamResponse:
        fake: FakeUpstream = request.app[FAKE]
        response = await fake.start_sse(request)
        body = fixture_bytes(name)
        step = piece or len(body)
        for i in range(0, len(body), step):
            await fake.write(response, body[i : i + step])
        await response.write_eof()
        return response

    return script


def frames(*items: bytes, then: str = "end") -> Script:
    """Send these SSE frames, then `end` the body, `stall` forever, or `reset` the connection."""

    async def script(request: web.Request) -> web.StreamResponse:
        fake: FakeUpstream = request.app[FAKE]
        response = await fake.start_sse(request)
        for item in items:
            await fake.write(response, item)
        if then == "stall":
            await fake.stall()
        elif then == "reset":
            assert request.transport is not None
            request.transport.abort()
            await asyncio.Event().wait()
        else:
            await response.write_eof()
        return response

    return script


def status(code: int, body: dict[str, Any] | str, headers: dict[str, str] | None = None) -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        if isinstance(body, str):
            return web.Response(status=code, text=body, content_type="text/html", headers=headers)
        return web.json_response(body, status=code, headers=headers)

    return script


def hang_before_headers() -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        fake: FakeUpstream = request.app[FAKE]
        await fake.stall()
        raise AssertionError("unreachable")

    return script


def completion(content: str, *, finish: str = "stop") -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": "fake-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": finish,
                    }
                ],
                "usage": USAGE,
            }
        )

    return script


def embedding_vectors() -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [
            {"object": "embedding", "index": i, "embedding": [0.5, -0.5]}
            for i in range(len(inputs))
        ]
        usage = {"prompt_tokens": 3, "total_tokens": 3}
        return web.json_response(
            {"object": "list", "data": data, "model": body["model"], "usage": usage}
        )

    return script


def paused(first: list[bytes], rest: list[bytes], end: asyncio.Event | None = None) -> Script:
    """Send `first`, stall until the test sets `release`, then send `rest` and end (once `end`
    is set, when given: the body's end in a write of its own, later)."""

    async def script(request: web.Request) -> web.StreamResponse:
        fake: FakeUpstream = request.app[FAKE]
        response = await fake.start_sse(request)
        for item in first:
            await fake.write(response, item)
        fake.stalled.set()
        await fake.release.wait()
        for item in rest:
            await fake.write(response, item)
        if end is not None:
            await end.wait()
        await response.write_eof()
        return response

    return script


def feed_fixture(name: str, parser: StreamParser) -> tuple[list[StreamEvent], list[str]]:
    """A captured stream through the SSE decoder and a wire parser: its events and frame kinds."""
    events: list[StreamEvent] = []
    kinds: list[str] = []
    for frame in SSEDecoder().feed(fixture_bytes(name)):
        new, kind = parser.feed(frame)
        events += new
        kinds.append(kind)
    return events, kinds
