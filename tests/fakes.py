"""Fake upstreams: real aiohttp servers on loopback, each speaking its provider's exact wire
format (the URL, the auth header, the SSE framing, the error bodies).

`FakeServer` is what they share: each request runs the next queued script (`push`), or the
format's default answer; every request's JSON body is kept in `requests` and the request itself
(path, query, headers, transport) in `seen`; `disconnected` is set when the gateway drops the
connection while an answer is being sent, so tests can prove it closed the upstream request.

Scripts come two ways. Byte-level ones (`replay`, `frames`, `paused`, `status`, ...) say exactly
what goes on the wire. Format-neutral ones (`text`, `reasoning_then_text`, `tool_call`,
`http_error`, `error_mid_stream`, `cut_after`, `stall_after`) are rendered by each format's
`frames()`, so one test reads the same against every format (tests/providers/ has the other
providers' formats, upstreams.py names them all; the adapter contract suite runs over them).

`FakeUpstream` is the one fake OpenAI-compatible upstream: chat completions (streamed and not),
embeddings, responses, and Azure OpenAI's deployment paths. With nothing queued it replays a real
captured stream (tests/fixtures/real-streams).
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.providers.wire import StreamParser
from gateway.stream.events import StreamEvent
from gateway.stream.sse import SSEDecoder

FIXTURES = Path(__file__).parent / "fixtures" / "real-streams"

Script = Callable[[web.Request], Awaitable[web.StreamResponse]]
MakeServer = Callable[[web.Application], Awaitable[TestServer]]

API_KEY = "sk-up"  # the key every fake's `deployment()` configures
PROMPT_TOKENS = 11  # a format-neutral answer reports this many input tokens...
COMPLETION_TOKENS = 7  # ...and this many output tokens once finished


def fixture_bytes(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


def expected(name: str) -> dict[str, Any]:
    data: dict[str, dict[str, Any]] = json.loads((FIXTURES / "expected.json").read_text())
    return data[name]


def sse(obj: dict[str, Any], event: str | None = None, end: bytes = b"\n\n") -> bytes:
    """One SSE frame carrying `obj` as JSON (with an `event:` line when given)."""
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj, ensure_ascii=False).encode() + end


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
    return sse(obj)


DONE = b"data: [DONE]\n\n"
# The events of a turn whose only attempt failed (docs/recording.md, "Order inside a turn").
FAILED_TURN = ["user/message", "assistant/attempt", "request/error", "turn/end"]
USAGE = {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


# -- format-neutral answers --------------------------------------------------------------------

Ending = Literal["end", "stall", "cut"]


@dataclass(frozen=True)
class Block:
    """A piece of scripted content: a text, reasoning or tool call block sent in parts."""

    kind: Literal["text", "reasoning", "tool_call"]
    parts: list[str]
    id: str = ""
    name: str = ""


@dataclass(frozen=True)
class Reply:
    """A scripted answer: an HTTP error, or a stream of blocks and how the stream ends.

    `finish` is None for a stream that never gets to its finish (it errs, stalls or is cut).
    """

    blocks: list[Block] = field(default_factory=list)
    finish: Literal["stop", "tool_calls"] | None = "stop"
    error_message: str | None = None  # an in-band error event after the blocks
    then: Ending = "end"
    status: int = 200  # an HTTP error status: the answer is the format's error body


# -- the server every format shares ------------------------------------------------------------


class FakeServer(ABC):
    """The machinery and interface of every fake upstream; subclasses supply the wire format."""

    provider: ClassVar[str]  # the deployment's `provider`
    model: ClassVar[str] = "upstream-model"
    # A signature the format attaches to reasoning blocks (Anthropic's thinking), else None.
    reasoning_signature: ClassVar[str | None] = None
    base_path: ClassVar[str] = ""  # `url` is the server's root plus this

    def __init__(self) -> None:
        # Whatever the gateway forwards (server.max_body_mb at most), unlike aiohttp's 1 MiB.
        self.app = web.Application(client_max_size=64 * 2**20)
        self.scripts: list[Script] = []
        self.requests: list[dict[str, Any]] = []  # the JSON body of each request
        self.seen: list[web.Request] = []  # path, query, headers and transport of each request
        self.request_times: list[float] = []  # time.monotonic() of each request
        self.received = asyncio.Event()  # a request has arrived
        self.disconnected = asyncio.Event()  # the gateway dropped a connection mid-answer
        self.stalled = asyncio.Event()  # a script reached its stall (or cut) point
        self.release = asyncio.Event()  # lets a `paused` script go on, a `cut_after` one cut
        self.bytes_sent = 0
        self.url = ""
        self.add_routes(self.app.router)

    async def start(self, make_server: MakeServer) -> Self:
        """Serve on loopback with `make_server` (pytest-aiohttp's `aiohttp_server`)."""
        server = await make_server(self.app)
        self.url = str(server.make_url(self.base_path)).rstrip("/")
        return self

    def deployment(self, **extra: Any) -> dict[str, Any]:
        """The gateway deployment config pointing at this fake; `extra` fields are merged in."""
        return {
            "provider": self.provider,
            "api_base": self.api_base(),
            "api_key": API_KEY,
            "model": self.model,
            **extra,
        }

    def api_base(self) -> str:
        return self.url

    def push(self, *scripts: Script) -> None:
        self.scripts.extend(scripts)

    # -- format-neutral answers, rendered by the format's `frames` -----------------------------

    def text(self, parts: list[str]) -> None:
        """A text answer sent in `parts`, finished with "stop" and usage."""
        self.push(self.answer(Reply([Block("text", parts)])))

    def reasoning_then_text(self, reasoning: list[str], text: list[str]) -> None:
        """A reasoning block, then a text block, finished with "stop"."""
        self.push(self.answer(Reply([Block("reasoning", reasoning), Block("text", text)])))

    def tool_call(self, id: str, name: str, arg_parts: list[str]) -> None:
        """One tool call whose JSON arguments arrive in `arg_parts`, finished with "tool_calls"."""
        block = Block("tool_call", arg_parts, id, name)
        self.push(self.answer(Reply([block], finish="tool_calls")))

    def http_error(self, status: int, message: str) -> None:
        """An HTTP error status before any stream, with the format's own error body."""
        self.push(self.answer(Reply(status=status, error_message=message)))

    def error_mid_stream(self, parts: list[str], message: str) -> None:
        """Text `parts`, then the format's in-band error event, then the end of the body."""
        self.push(self.answer(Reply([Block("text", parts)], finish=None, error_message=message)))

    def cut_after(self, parts: list[str]) -> None:
        """Text `parts`, then wait for `release`, then abort the TCP connection."""
        self.push(self.answer(Reply([Block("text", parts)], finish=None, then="cut")))

    def stall_after(self, parts: list[str]) -> None:
        """Text `parts`, then nothing more until the gateway goes away."""
        self.push(self.answer(Reply([Block("text", parts)], finish=None, then="stall")))

    def answer(self, reply: Reply) -> Script:
        """`reply` as a script, in this format."""

        async def script(request: web.Request) -> web.StreamResponse:
            if reply.status != 200:
                message = reply.error_message or "error"
                body = self.error_body(reply.status, message)
                return web.json_response(body, status=reply.status)
            response = await self.start_sse(request)
            for frame in self.frames(reply, request, await request.json()):
                await self.write(response, frame)
            if reply.then == "stall":
                await self.stall()
            elif reply.then == "cut":
                self.stalled.set()
                await self.release.wait()
                assert request.transport is not None
                request.transport.abort()
                await asyncio.Event().wait()  # aiohttp cancels the handler
            await response.write_eof()
            return response

        return script

    # -- the wire format -----------------------------------------------------------------------

    @abstractmethod
    def add_routes(self, router: web.UrlDispatcher) -> None: ...

    @abstractmethod
    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        """Assert that the request is in this format: URL, auth, model, streaming."""

    @abstractmethod
    def question(self, body: dict[str, Any]) -> str:
        """The text of the request's last user message, read the format's way."""

    @abstractmethod
    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        """The SSE frames of a streamed `reply` to this request."""

    @abstractmethod
    def error_body(self, status: int, message: str) -> dict[str, Any]: ...

    def default(self, request: web.Request, body: dict[str, Any]) -> Script:
        """The answer when no script is queued: an error saying so, unless the format has one."""
        return status(501, self.error_body(501, "the test queued no reply"))

    # -- serving -------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.request_times.append(time.monotonic())
        body = await request.json()
        self.requests.append(body)
        self.seen.append(request)
        self.received.set()
        script = self.scripts.pop(0) if self.scripts else self.default(request, body)
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


# -- OpenAI-compatible: chat completions, embeddings, responses, Azure OpenAI ------------------


class FakeUpstream(FakeServer):
    """`POST /v1/chat/completions` with `Authorization: Bearer`; chunks, then `data: [DONE]`.

    Also `/v1/embeddings` and `/v1/responses`, and Azure OpenAI's paths (the deployment in the
    URL; its streams open with a chunk of prompt filter results and no choices). `url` is the
    API base (`.../v1`). With nothing queued: embeddings get vectors, anything else the captured
    OpenAI text stream, or with `plain_answer`, a non-streaming chat request gets that text as
    a whole `chat.completion`.
    """

    provider = "openai"
    model = "fake-model"
    base_path = "/v1"

    def __init__(self, *, plain_answer: str | None = None) -> None:
        super().__init__()
        self.plain_answer = plain_answer
        self.app[FAKE] = self

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/chat/completions", self.handle)
        router.add_post("/v1/completions", self.handle)
        router.add_post("/v1/embeddings", self.handle)
        router.add_post("/v1/responses", self.handle)
        # Azure OpenAI's paths: the deployment is in the URL.
        router.add_post("/openai/deployments/{deployment}/chat/completions", self.handle)
        router.add_post("/openai/deployments/{deployment}/completions", self.handle)
        router.add_post("/openai/deployments/{deployment}/embeddings", self.handle)

    def default(self, request: web.Request, body: dict[str, Any]) -> Script:
        if request.path.endswith("/embeddings"):
            return embedding_vectors()
        chat = request.path.endswith("/chat/completions")
        if chat and self.plain_answer is not None and not body.get("stream"):
            return completion(self.plain_answer)
        return replay("openai-chat-text-usage.sse")

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == "/v1/chat/completions"
        assert request.headers["Authorization"] == f"Bearer {API_KEY}"
        assert body["model"] == self.model
        assert body["stream"] is True

    def question(self, body: dict[str, Any]) -> str:
        return str(body["messages"][-1]["content"])

    def chunk_object(
        self, delta: dict[str, Any], finish: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        return {
            "id": "chatcmpl-fake",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": self.model,
            "choices": [choice],
            **extra,
        }

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        out = []
        if request.path.startswith("/openai/deployments/"):
            filtered = {"prompt_index": 0, "content_filter_results": {}}
            head = {"choices": [], "created": 0, "id": "", "model": "", "object": ""}
            out.append(sse({**head, "prompt_filter_results": [filtered]}))
        out.append(sse(self.chunk_object({"role": "assistant", "content": "", "refusal": None})))
        for block in reply.blocks:
            if block.kind == "text":
                out += [sse(self.chunk_object({"content": p})) for p in block.parts]
            elif block.kind == "reasoning":
                out += [sse(self.chunk_object({"reasoning_content": p})) for p in block.parts]
            else:
                call = {"index": 0, "id": block.id, "type": "function"}
                call["function"] = {"name": block.name, "arguments": ""}
                out.append(sse(self.chunk_object({"tool_calls": [call]})))
                for part in block.parts:
                    arguments = {"index": 0, "function": {"arguments": part}}
                    out.append(sse(self.chunk_object({"tool_calls": [arguments]})))
        if reply.error_message is not None:
            error = {"message": reply.error_message, "type": "server_error", "code": None}
            out.append(sse({"error": error}))
        if reply.finish is None:
            return out
        out.append(sse(self.chunk_object({}, reply.finish)))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            usage = {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            }
            out.append(sse({**self.chunk_object({}), "choices": [], "usage": usage}))
        out.append(DONE)
        return out

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class AzureUpstream(FakeUpstream):
    """The same fake, configured as an Azure OpenAI deployment: its API base is the server's
    root, the request goes to `/openai/deployments/{model}/chat/completions?api-version=...`
    with an `api-key` header."""

    provider = "azure"
    model = "gpt-4o-deployment"
    api_version = "2024-10-21"

    def api_base(self) -> str:
        return self.url.removesuffix(self.base_path)

    def deployment(self, **extra: Any) -> dict[str, Any]:
        return super().deployment(api_version=self.api_version, **extra)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == f"/openai/deployments/{self.model}/chat/completions"
        assert dict(request.query) == {"api-version": self.api_version}
        assert request.headers["api-key"] == API_KEY
        assert "Authorization" not in request.headers
        assert body["stream"] is True


FAKE = web.AppKey("fake", FakeUpstream)


# -- byte-level scripts for FakeUpstream -------------------------------------------------------


def replay(name: str, piece: int = 0) -> Script:
    """Replay a captured stream byte for byte (in `piece`-byte writes when given)."""

    async def script(request: web.Request) -> web.StreamResponse:
        fake = request.app[FAKE]
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
        fake = request.app[FAKE]
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
        await request.app[FAKE].stall()
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
        fake = request.app[FAKE]
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
