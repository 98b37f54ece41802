"""A fake Gemini API (Google AI Studio) on loopback, speaking its exact wire format.

`POST /v1beta/models/{model}:streamGenerateContent?alt=sse` answers Server-Sent Events whose
`data:` lines are `GenerateContentResponse` objects, separated by `\\r\\n\\r\\n` as Google sends
them; `POST /v1beta/models/{model}:generateContent` answers one such object as JSON. Errors
are Google's `{"error": {"code", "message", "status", "details"}}`. A request without the right
`x-goog-api-key` gets Google's 400 API_KEY_INVALID.

Each request runs the next queued script, or `stream_of(TEXT_CHUNKS)` / `TEXT_COMPLETION` by
default. Every request's path, query, headers and JSON body are recorded.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

KEY = "AIza-test-key"
MODEL = "gemini-2.0-flash"

Script = Callable[[web.Request], Awaitable[web.StreamResponse]]


def usage(prompt: int, candidates: int, thoughts: int = 0) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "promptTokenCount": prompt,
        "candidatesTokenCount": candidates,
        "totalTokenCount": prompt + candidates + thoughts,
        "promptTokensDetails": [{"modality": "TEXT", "tokenCount": prompt}],
    }
    if thoughts:
        meta["thoughtsTokenCount"] = thoughts
    return meta


def response(
    *parts: dict[str, Any],
    finish: str | None = None,
    usage_metadata: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One `GenerateContentResponse`: a stream chunk, or a whole answer."""
    candidate: dict[str, Any] = {"content": {"parts": list(parts), "role": "model"}}
    if finish is not None:
        candidate["finishReason"] = finish
    candidate["index"] = 0
    obj: dict[str, Any] = {"candidates": [candidate]}
    if usage_metadata is not None:
        obj["usageMetadata"] = usage_metadata
    obj["modelVersion"] = MODEL
    obj["responseId"] = "resp-fake-1"
    return obj


def text(value: str) -> dict[str, Any]:
    return {"text": value}


def thought(value: str) -> dict[str, Any]:
    return {"text": value, "thought": True}


def function_call(name: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"functionCall": {"name": name, "args": args}}


def frame(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\r\n\r\n"


def google_error(code: int, status: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "status": status, **extra}}


# "Hello, world!" in three chunks, the last with the finish reason and the final usage.
TEXT_CHUNKS = [
    response(text("Hello"), usage_metadata=usage(5, 1)),
    response(text(", wor"), usage_metadata=usage(5, 3)),
    response(text("ld!"), finish="STOP", usage_metadata=usage(5, 4)),
]
TEXT_COMPLETION = response(text("Hello, world!"), finish="STOP", usage_metadata=usage(5, 4))


@dataclass
class Seen:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class FakeGemini:
    scripts: list[Script] = field(default_factory=list)
    requests: list[Seen] = field(default_factory=list)
    disconnected: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""  # the api_base to give litellm: http://127.0.0.1:PORT/v1beta

    def push(self, *scripts: Script) -> None:
        self.scripts.extend(scripts)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1beta/models/{model_action}", self._handle)
        return app

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(
            Seen(request.path, dict(request.query), dict(request.headers), await request.json())
        )
        model, _, action = request.match_info["model_action"].partition(":")
        if request.headers.get("x-goog-api-key") != KEY:
            return error(
                400,
                google_error(
                    400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid key."
                ),
            )(request)
        if action == "streamGenerateContent" and request.query.get("alt") != "sse":
            # Without alt=sse Google streams one JSON array: not what this fake speaks.
            return error(400, google_error(400, "INVALID_ARGUMENT", "expected alt=sse"))(request)
        if action not in ("streamGenerateContent", "generateContent"):
            return error(404, google_error(404, "NOT_FOUND", f"unknown method {action}"))(request)
        if model != MODEL:
            message = f"models/{model} is not found for API version v1beta"
            return error(404, google_error(404, "NOT_FOUND", message))(request)
        if self.scripts:
            script = self.scripts.pop(0)
        elif action == "streamGenerateContent":
            script = stream_of(TEXT_CHUNKS)
        else:
            script = whole(TEXT_COMPLETION)
        try:
            return await script(request)
        except (asyncio.CancelledError, ConnectionResetError):
            self.disconnected.set()
            raise


def stream_of(chunks: list[dict[str, Any]], *, then: bytes = b"", hang: bool = False) -> Script:
    """An SSE answer of `chunks`; `then` raw bytes after them; `hang` keeps it open."""

    async def script(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        for chunk in chunks:
            await answer.write(frame(chunk))
        if then:
            await answer.write(then)
        if hang:
            await asyncio.Event().wait()  # until the client goes away
        await answer.write_eof()
        return answer

    return script


def cut_after(chunks: list[dict[str, Any]]) -> Script:
    """Send `chunks` and half a frame, then drop the connection without ending the body."""

    async def script(request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await answer.prepare(request)
        for chunk in chunks:
            await answer.write(frame(chunk))
        await answer.write(b'data: {"candidates": [{"content": {"par')
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()
        return answer

    return script


def whole(obj: dict[str, Any]) -> Script:
    async def script(request: web.Request) -> web.StreamResponse:
        return web.json_response(obj)

    return script


def error(
    status: int, body: dict[str, Any] | str, headers: dict[str, str] | None = None
) -> Callable[[web.Request], web.Response]:
    def reply(request: web.Request) -> web.Response:
        if isinstance(body, str):
            return web.Response(status=status, text=body, content_type="text/html", headers=headers)
        return web.json_response(body, status=status, headers=headers)

    return reply


def failing(
    status: int, body: dict[str, Any] | str, headers: dict[str, str] | None = None
) -> Script:
    reply = error(status, body, headers)

    async def script(request: web.Request) -> web.StreamResponse:
        return reply(request)

    return script


def stalled() -> Script:
    """Never answers (not even the headers) until the client goes away."""

    async def script(request: web.Request) -> web.StreamResponse:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return script
