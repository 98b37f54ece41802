"""The fake upstreams the coding-agent CLIs reach through the gateway, and a proxy that refuses
everything.

- `ClaudeUpstream`: Anthropic's Messages API (tests/providers/upstreams.py's `AnthropicServer`)
  that also records any request to another path.
- `ResponsesUpstream`: OpenAI's native Responses API (`POST /v1/responses`, the wire of an
  `openai` deployment with `api: responses`), streamed as OpenAI streams it: `response.created`,
  `response.in_progress`, each output item's `added`, deltas, `done`, then `response.completed`
  with usage.

Both answer from the queue of scripted replies (`tool_call`, `text`: tests/fakes.py's
`FakeServer`); a request with nothing queued gets a 400, which neither CLI retries, so a request
a test did not expect is seen at once: in `requests`, and as the CLI's failure.

`DeadEndProxy` is set as the CLIs' HTTP(S) proxy, loopback excepted: a connection a CLI tries
to make beyond loopback (telemetry, update checks, plugin syncs) arrives here, is recorded in
`attempts` and refused, so a test fails instead of depending on the internet.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

from aiohttp import web

from tests.fakes import (
    API_KEY,
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    Block,
    FakeServer,
    Reply,
    Script,
    sse,
    status,
)
from tests.providers.upstreams import AnthropicServer


class StrictFake(FakeServer):
    """What both fakes add to their format: a request with no reply queued gets a 400 (the
    CLIs retry a 5xx), and a catch-all route records any other method or path in `strays`
    and answers it 404."""

    strays: list[str]

    def default(self, request: web.Request, body: dict[str, Any]) -> Script:
        return status(400, self.error_body(400, "the test queued no reply for this request"))

    def add_stray_route(self, router: web.UrlDispatcher) -> None:
        self.strays = []
        router.add_route("*", "/{tail:.*}", self.stray)

    async def stray(self, request: web.Request) -> web.Response:
        self.strays.append(f"{request.method} {request.path_qs}")
        return web.json_response({"error": {"message": "not served by this fake"}}, status=404)


class ClaudeUpstream(StrictFake, AnthropicServer):
    """Anthropic's `POST /v1/messages` (Anthropic SSE), anything else recorded as a stray."""

    def add_routes(self, router: web.UrlDispatcher) -> None:
        super().add_routes(router)
        self.add_stray_route(router)


class ResponsesUpstream(StrictFake):
    """OpenAI's `POST /v1/responses` with `Authorization: Bearer`, streamed as Responses SSE.

    A `text` block is one `message` item with one `output_text` part; a `tool_call` block is
    one `function_call` item, its `call_id` the block's id, its arguments sent in the block's
    parts. `url` is the API base (`.../v1`).
    """

    provider = "openai"
    model = "gpt-upstream"
    base_path = "/v1"

    def deployment(self, **extra: Any) -> dict[str, Any]:
        return super().deployment(api="responses", **extra)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/responses", self.handle)
        self.add_stray_route(router)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == "/v1/responses"
        assert request.headers["Authorization"] == f"Bearer {API_KEY}"
        assert body["model"] == self.model
        assert body["stream"] is True

    def question(self, body: dict[str, Any]) -> str:
        item = body["input"][-1]
        content = item["content"]
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") for part in content)

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "server_error"
        return {"error": {"message": message, "type": kind, "param": None, "code": None}}

    def response(self, body: dict[str, Any], status: str, output: list[Any]) -> dict[str, Any]:
        usage = None
        if status == "completed":
            usage = {
                "input_tokens": PROMPT_TOKENS,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": COMPLETION_TOKENS,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            }
        return {
            "id": "resp_fake",
            "object": "response",
            "created_at": 1,
            "status": status,
            "error": None,
            "incomplete_details": None,
            "model": body.get("model", self.model),
            "output": output,
            "parallel_tool_calls": True,
            "store": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        numbers = itertools.count()

        def event(kind: str, **fields: Any) -> bytes:
            return sse({"type": kind, "sequence_number": next(numbers), **fields}, kind)

        out = [
            event("response.created", response=self.response(body, "in_progress", [])),
            event("response.in_progress", response=self.response(body, "in_progress", [])),
        ]
        items = []
        for index, block in enumerate(reply.blocks):
            items.append(self.item(index, block))
            out += self.item_frames(index, block, items[-1], event)
        if reply.finish is not None:
            out.append(
                event("response.completed", response=self.response(body, "completed", items))
            )
        return out

    @staticmethod
    def item(index: int, block: Block) -> dict[str, Any]:
        if block.kind == "text":
            part = {"type": "output_text", "text": "".join(block.parts), "annotations": []}
            return {
                "id": f"msg_fake{index}",
                "type": "message",
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
        assert block.kind == "tool_call", block.kind
        return {
            "id": f"fc_fake{index}",
            "type": "function_call",
            "status": "completed",
            "call_id": block.id,
            "name": block.name,
            "arguments": "".join(block.parts),
        }

    @staticmethod
    def item_frames(index: int, block: Block, item: dict[str, Any], event: Any) -> list[bytes]:
        where = {"item_id": item["id"], "output_index": index}
        if item["type"] == "message":
            empty = {"type": "output_text", "text": "", "annotations": []}
            out = [
                event(
                    "response.output_item.added",
                    output_index=index,
                    item={**item, "status": "in_progress", "content": []},
                ),
                event("response.content_part.added", **where, content_index=0, part=empty),
            ]
            for part in block.parts:
                out.append(
                    event("response.output_text.delta", **where, content_index=0, delta=part)
                )
            text = item["content"][0]["text"]
            out.append(event("response.output_text.done", **where, content_index=0, text=text))
            out.append(
                event(
                    "response.content_part.done", **where, content_index=0, part=item["content"][0]
                )
            )
        else:
            added = {**item, "status": "in_progress", "arguments": ""}
            out = [event("response.output_item.added", output_index=index, item=added)]
            for part in block.parts:
                out.append(event("response.function_call_arguments.delta", **where, delta=part))
            out.append(
                event("response.function_call_arguments.done", **where, arguments=item["arguments"])
            )
        out.append(event("response.output_item.done", output_index=index, item=item))
        return out


class DeadEndProxy:
    """An HTTP proxy on loopback that forwards nothing: each request's first line (`CONNECT
    api.anthropic.com:443 HTTP/1.1`, `GET http://host/ HTTP/1.1`) is recorded, answered 403,
    and the connection closed."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self.url = ""
        self._server: asyncio.Server | None = None

    async def start(self) -> DeadEndProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            self.attempts.append(line.decode("latin-1").strip() or "(nothing sent)")
            writer.write(
                b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            await writer.drain()
        except (TimeoutError, ConnectionError):
            self.attempts.append("(nothing sent)")
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()


def tool_arguments(arguments: dict[str, Any]) -> list[str]:
    """`arguments` as JSON, in two parts (the way providers stream them)."""
    text = json.dumps(arguments)
    return [text[: len(text) // 2], text[len(text) // 2 :]]
