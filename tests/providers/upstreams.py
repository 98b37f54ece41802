"""The fake upstreams of the other wire formats: Anthropic Messages, Google Gemini and (in
tests/providers/bedrock.py) Amazon Bedrock's Converse.

They share `FakeServer` (tests/fakes.py) with the OpenAI-compatible fake, `FakeUpstream`: the
same scripted answers (`text`, `reasoning_then_text`, `tool_call`, `http_error`,
`error_mid_stream`, `cut_after`, `stall_after`), each rendered in the format's own frames, the
same record of requests, and the same `stalled` / `release` / `disconnected` events. SERVERS
names every format the adapter contract suite (test_adapter_contract.py) runs over.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.fakes import (
    API_KEY,
    COMPLETION_TOKENS,
    PROMPT_TOKENS,
    AzureUpstream,
    Block,
    FakeServer,
    FakeUpstream,
    Reply,
    sse,
)
from tests.providers.bedrock import BedrockServer

# -- Anthropic Messages ------------------------------------------------------------------------


class AnthropicServer(FakeServer):
    """`POST /v1/messages` with `x-api-key`; message_start, content blocks, message_delta,
    message_stop, pings between, and `event: error` for an in-band error."""

    provider = "anthropic"
    model = "claude-fake"
    reasoning_signature = "EqsDCpQBsig=="

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/messages", self.handle)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == "/v1/messages"
        assert request.headers["x-api-key"] == API_KEY
        assert request.headers["anthropic-version"]
        assert body["model"] == self.model
        assert body["max_tokens"] > 0
        assert body["stream"] is True

    def question(self, body: dict[str, Any]) -> str:
        content = body["messages"][-1]["content"]
        return "".join(block["text"] for block in content if block["type"] == "text")

    @staticmethod
    def event(obj: dict[str, Any]) -> bytes:
        return sse(obj, obj["type"])

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
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
    # A model that thinks: litellm refuses `reasoning_effort` for one that does not, and so does
    # the gateway (gateway.providers.params), where the contract suite asks every adapter for it.
    gemini_model = "gemini-2.5-flash"
    model = f"gemini/{gemini_model}"

    def api_base(self) -> str:
        return self.url + "/v1beta"

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1beta/models/{action}", self.handle)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == f"/v1beta/models/{self.gemini_model}:streamGenerateContent"
        assert request.query.get("alt") == "sse"
        assert request.headers["x-goog-api-key"] == API_KEY

    def question(self, body: dict[str, Any]) -> str:
        parts = body["contents"][-1]["parts"]
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
        return sse(obj, end=b"\r\n\r\n")

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
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
            out.append(sse({"error": error}, end=b"\r\n\r\n"))
        if reply.finish is not None:
            out.append(self.chunk([{"text": ""}], "STOP", COMPLETION_TOKENS))
        return out

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = {400: "INVALID_ARGUMENT", 503: "UNAVAILABLE"}.get(status, "INTERNAL")
        return {"error": {"code": status, "message": message, "status": kind}}


SERVERS: dict[str, type[FakeServer]] = {
    "openai": FakeUpstream,
    "azure": AzureUpstream,
    "anthropic": AnthropicServer,
    "litellm": GeminiServer,
    "bedrock": BedrockServer,
}
