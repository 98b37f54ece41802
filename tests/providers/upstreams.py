"""Fake upstream servers, one per wire format, behind one small interface.

Each fake is a real aiohttp server on loopback that speaks its provider's exact wire format: the
URL, the auth header, the SSE framing, the error bodies. A test queues scripted answers with the
same calls whatever the format (`text`, `reasoning_then_text`, `tool_call`, `http_error`,
`error_mid_stream`, `cut_after`, `stall_after`) and each request takes the next one. Every
request is kept in `requests`; `disconnected` is set when a connection closes while an answer is
still being sent (aiohttp's test server cancels the handler then): the gateway went away, or a
`cut_after` answer cut it.
"""

from __future__ import annotations

import asyncio
import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from aiohttp import web
from aiohttp.test_utils import TestServer

API_KEY = "sk-upstream"
PROMPT_TOKENS = 11  # every fake reports this many input tokens...
COMPLETION_TOKENS = 7  # ...and this many output tokens for a finished answer

Ending = Literal["end", "stall", "cut"]
MakeServer = Callable[[web.Application], Awaitable[TestServer]]


@dataclass(frozen=True)
class Received:
    """One request as the fake saw it."""

    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-cased names
    body: dict[str, Any]


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


class FakeServer(ABC):
    """The interface every fake upstream offers; subclasses supply their wire format."""

    provider: ClassVar[str]  # the deployment's `provider`
    model: ClassVar[str] = "upstream-model"
    # A signature the format attaches to reasoning blocks (Anthropic's thinking), else None.
    reasoning_signature: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.app = web.Application()
        self.replies: list[Reply] = []
        self.requests: list[Received] = []
        self.stalled = asyncio.Event()  # a reply reached its stall or cut point
        self.release = asyncio.Event()  # lets a `cut_after` reply cut its connection
        self.disconnected = asyncio.Event()  # the gateway dropped a connection mid-answer
        self.url = ""

    async def start(self, make_server: MakeServer) -> FakeServer:
        self.add_routes(self.app.router)
        server = await make_server(self.app)
        self.url = str(server.make_url("")).rstrip("/")
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

    # -- scripted answers ------------------------------------------------------------------------

    def text(self, parts: list[str]) -> None:
        """A text answer sent in `parts`, finished with "stop" and usage."""
        self.replies.append(Reply([Block("text", parts)]))

    def reasoning_then_text(self, reasoning: list[str], text: list[str]) -> None:
        """A reasoning block, then a text block, finished with "stop"."""
        self.replies.append(Reply([Block("reasoning", reasoning), Block("text", text)]))

    def tool_call(self, id: str, name: str, arg_parts: list[str]) -> None:
        """One tool call whose JSON arguments arrive in `arg_parts`, finished with "tool_calls"."""
        self.replies.append(Reply([Block("tool_call", arg_parts, id, name)], finish="tool_calls"))

    def http_error(self, status: int, message: str) -> None:
        """An HTTP error status before any stream, with the format's own error body."""
        self.replies.append(Reply(status=status, error_message=message))

    def error_mid_stream(self, parts: list[str], message: str) -> None:
        """Text `parts`, then the format's in-band error event, then the end of the body."""
        self.replies.append(Reply([Block("text", parts)], finish=None, error_message=message))

    def cut_after(self, parts: list[str]) -> None:
        """Text `parts`, then wait for `release`, then abort the TCP connection."""
        self.replies.append(Reply([Block("text", parts)], finish=None, then="cut"))

    def stall_after(self, parts: list[str]) -> None:
        """Text `parts`, then nothing more until the gateway goes away."""
        self.replies.append(Reply([Block("text", parts)], finish=None, then="stall"))

    # -- the wire format -------------------------------------------------------------------------

    @abstractmethod
    def api_base(self) -> str: ...

    @abstractmethod
    def add_routes(self, router: web.UrlDispatcher) -> None: ...

    @abstractmethod
    def check_request(self, received: Received) -> None:
        """Assert that the request is in this format: URL, auth, model, streaming."""

    @abstractmethod
    def question(self, received: Received) -> str:
        """The text of the request's last user message, read the format's way."""

    @abstractmethod
    def frames(self, reply: Reply, received: Received) -> list[bytes]:
        """The SSE frames of a streamed reply, each written on its own."""

    @abstractmethod
    def error_body(self, status: int, message: str) -> dict[str, Any]: ...

    # -- serving ---------------------------------------------------------------------------------

    async def handle(self, request: web.Request) -> web.StreamResponse:
        received = Received(
            request.path,
            dict(request.query),
            {k.lower(): v for k, v in request.headers.items()},
            await request.json(),
        )
        self.requests.append(received)
        if not self.replies:
            return web.json_response(self.error_body(501, "the test queued no reply"), status=501)
        reply = self.replies.pop(0)
        if reply.status != 200:
            message = reply.error_message or "error"
            return web.json_response(self.error_body(reply.status, message), status=reply.status)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            for frame in self.frames(reply, received):
                await response.write(frame)
            if reply.then == "stall":
                self.stalled.set()
                await asyncio.Event().wait()  # until the gateway goes away
            elif reply.then == "cut":
                self.stalled.set()
                await self.release.wait()
                assert request.transport is not None
                request.transport.abort()
                await asyncio.Event().wait()  # aiohttp cancels the handler
            await response.write_eof()
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnected.set()
            raise
        return response


def _sse(obj: dict[str, Any], event: str | None = None, end: bytes = b"\n\n") -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj, ensure_ascii=False).encode() + end


# -- OpenAI-compatible chat completions --------------------------------------------------------


class OpenAIChatServer(FakeServer):
    """`POST /v1/chat/completions` with `Authorization: Bearer`; chunks, then `data: [DONE]`."""

    provider = "openai"

    def api_base(self) -> str:
        return self.url + "/v1"

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/chat/completions", self.handle)

    def check_request(self, received: Received) -> None:
        assert received.path == "/v1/chat/completions"
        assert received.headers["authorization"] == f"Bearer {API_KEY}"
        assert received.body["model"] == self.model
        assert received.body["stream"] is True

    def question(self, received: Received) -> str:
        return str(received.body["messages"][-1]["content"])

    def chunk(
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

    def first_frames(self) -> list[bytes]:
        return [_sse(self.chunk({"role": "assistant", "content": "", "refusal": None}))]

    def frames(self, reply: Reply, received: Received) -> list[bytes]:
        out = self.first_frames()
        for block in reply.blocks:
            if block.kind == "text":
                out += [_sse(self.chunk({"content": p})) for p in block.parts]
            elif block.kind == "reasoning":
                out += [_sse(self.chunk({"reasoning_content": p})) for p in block.parts]
            else:
                call = {"index": 0, "id": block.id, "type": "function"}
                call["function"] = {"name": block.name, "arguments": ""}
                out.append(_sse(self.chunk({"tool_calls": [call]})))
                for part in block.parts:
                    arguments = {"index": 0, "function": {"arguments": part}}
                    out.append(_sse(self.chunk({"tool_calls": [arguments]})))
        if reply.error_message is not None:
            error = {"message": reply.error_message, "type": "server_error", "code": None}
            out.append(_sse({"error": error}))
        if reply.finish is None:
            return out
        out.append(_sse(self.chunk({}, reply.finish)))
        options = received.body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            usage = {
                "prompt_tokens": PROMPT_TOKENS,
                "completion_tokens": COMPLETION_TOKENS,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            }
            out.append(_sse({**self.chunk({}), "choices": [], "usage": usage}))
        out.append(b"data: [DONE]\n\n")
        return out

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class AzureOpenAIServer(OpenAIChatServer):
    """Azure OpenAI: `/openai/deployments/{deployment}/chat/completions?api-version=...`, an
    `api-key` header, and a first chunk with no choices (the prompt's content filter results)."""

    provider = "azure"
    model = "gpt-4o-deployment"
    api_version = "2024-10-21"

    def api_base(self) -> str:
        return self.url

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/openai/deployments/{deployment}/chat/completions", self.handle)

    def deployment(self, **extra: Any) -> dict[str, Any]:
        return super().deployment(api_version=self.api_version, **extra)

    def check_request(self, received: Received) -> None:
        assert received.path == f"/openai/deployments/{self.model}/chat/completions"
        assert received.query == {"api-version": self.api_version}
        assert received.headers["api-key"] == API_KEY
        assert "authorization" not in received.headers
        assert received.body["stream"] is True

    def first_frames(self) -> list[bytes]:
        filtered = {"prompt_index": 0, "content_filter_results": {}}
        head = {"choices": [], "created": 0, "id": "", "model": "", "object": ""}
        return [_sse({**head, "prompt_filter_results": [filtered]}), *super().first_frames()]


# -- Anthropic Messages ------------------------------------------------------------------------


class AnthropicServer(FakeServer):
    """`POST /v1/messages` with `x-api-key`; message_start, content blocks, message_delta,
    message_stop, pings between, and `event: error` for an in-band error."""

    provider = "anthropic"
    model = "claude-fake"
    reasoning_signature = "EqsDCpQBsig=="

    def api_base(self) -> str:
        return self.url

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/messages", self.handle)

    def check_request(self, received: Received) -> None:
        assert received.path == "/v1/messages"
        assert received.headers["x-api-key"] == API_KEY
        assert received.headers["anthropic-version"]
        assert received.body["model"] == self.model
        assert received.body["max_tokens"] > 0
        assert received.body["stream"] is True

    def question(self, received: Received) -> str:
        content = received.body["messages"][-1]["content"]
        return "".join(block["text"] for block in content if block["type"] == "text")

    @staticmethod
    def event(obj: dict[str, Any]) -> bytes:
        return _sse(obj, obj["type"])

    def frames(self, reply: Reply, received: Received) -> list[bytes]:
        message: dict[str, Any] = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": PROMPT_TOKENS, "output_tokens": 1},
        }
        out = [self.event({"type": "message_start", "message": message})]
        out.append(self.event({"type": "ping"}))
        last = len(reply.blocks) - 1
        for index, block in enumerate(reply.blocks):
            out += self.block(index, block, complete=reply.finish is not None or index < last)
        if reply.error_message is not None:
            error = {"type": "overloaded_error", "message": reply.error_message}
            out.append(self.event({"type": "error", "error": error}))
        if reply.finish is None:
            return out
        stop_reason = "tool_use" if reply.finish == "tool_calls" else "end_turn"
        delta = {"stop_reason": stop_reason, "stop_sequence": None}
        usage = {"output_tokens": COMPLETION_TOKENS}
        out.append(self.event({"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(self.event({"type": "message_stop"}))
        return out

    def block(self, index: int, block: Block, *, complete: bool) -> list[bytes]:
        """A content block's start and deltas, and its stop when `complete`."""
        if block.kind == "text":
            start: dict[str, Any] = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": p} for p in block.parts]
        elif block.kind == "reasoning":
            start = {"type": "thinking", "thinking": "", "signature": ""}
            deltas = [{"type": "thinking_delta", "thinking": p} for p in block.parts]
            deltas.append({"type": "signature_delta", "signature": self.reasoning_signature})
        else:
            start = {"type": "tool_use", "id": block.id, "name": block.name, "input": {}}
            deltas = [{"type": "input_json_delta", "partial_json": p} for p in block.parts]
        out = [self.event({"type": "content_block_start", "index": index, "content_block": start})]
        for delta in deltas:
            out.append(self.event({"type": "content_block_delta", "index": index, "delta": delta}))
        if complete:
            out.append(self.event({"type": "content_block_stop", "index": index}))
        return out

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {400: "invalid_request_error", 529: "overloaded_error"}.get(status, "api_error")
        return {"type": "error", "error": {"type": kind, "message": message}}


# -- Google Gemini (through litellm) -----------------------------------------------------------


class GeminiServer(FakeServer):
    """Google AI Studio's `POST {base}/models/{model}:streamGenerateContent?alt=sse` with
    `x-goog-api-key`, as litellm calls it for a `gemini/...` model given an `api_base`.

    Gemini sends whole parts (a function call's arguments come in one piece), marks reasoning
    with `"thought": true`, and reports an in-band error as a `{"error": {...}}` chunk.
    """

    provider = "litellm"
    gemini_model = "gemini-2.0-flash"
    model = f"gemini/{gemini_model}"

    def api_base(self) -> str:
        return self.url + "/v1beta"

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1beta/models/{action}", self.handle)

    def check_request(self, received: Received) -> None:
        assert received.path == f"/v1beta/models/{self.gemini_model}:streamGenerateContent"
        assert received.query.get("alt") == "sse"
        assert received.headers["x-goog-api-key"] == API_KEY

    def question(self, received: Received) -> str:
        parts = received.body["contents"][-1]["parts"]
        return "".join(part.get("text", "") for part in parts)

    def chunk(
        self, parts: list[dict[str, Any]], finish: str | None = None, completion: int = 0
    ) -> bytes:
        candidate: dict[str, Any] = {"content": {"parts": parts, "role": "model"}, "index": 0}
        if finish is not None:
            candidate["finishReason"] = finish
        usage = {
            "promptTokenCount": PROMPT_TOKENS,
            "candidatesTokenCount": completion,
            "totalTokenCount": PROMPT_TOKENS + completion,
        }
        obj = {"candidates": [candidate], "usageMetadata": usage, "modelVersion": self.model}
        return _sse(obj, end=b"\r\n\r\n")

    def frames(self, reply: Reply, received: Received) -> list[bytes]:
        out: list[bytes] = []
        for block in reply.blocks:
            if block.kind == "text":
                out += [self.chunk([{"text": p}]) for p in block.parts]
            elif block.kind == "reasoning":
                out += [self.chunk([{"text": p, "thought": True}]) for p in block.parts]
            else:
                call = {
                    "id": block.id,
                    "name": block.name,
                    "args": json.loads("".join(block.parts)),
                }
                out.append(self.chunk([{"functionCall": call}]))
        if reply.error_message is not None:
            error = {"code": 503, "message": reply.error_message, "status": "UNAVAILABLE"}
            out.append(_sse({"error": error}, end=b"\r\n\r\n"))
        if reply.finish is not None:
            out.append(self.chunk([{"text": ""}], "STOP", COMPLETION_TOKENS))
        return out

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {400: "INVALID_ARGUMENT", 503: "UNAVAILABLE"}.get(status, "INTERNAL")
        return {"error": {"code": status, "message": message, "status": kind}}


SERVERS: dict[str, type[FakeServer]] = {
    "openai": OpenAIChatServer,
    "azure": AzureOpenAIServer,
    "anthropic": AnthropicServer,
    "litellm": GeminiServer,
}
