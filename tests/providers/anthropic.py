"""A fake Anthropic Messages API (`POST /v1/messages`), and the frames Vertex AI's Anthropic
endpoint sends too (tests/providers/vertex.py)."""

from __future__ import annotations

from typing import Any, ClassVar

from aiohttp import web

from tests.fakes import API_KEY, COMPLETION_TOKENS, PROMPT_TOKENS, Block, FakeServer, Reply, sse


class AnthropicServer(FakeServer):
    """`POST /v1/messages` with `x-api-key`; message_start, content blocks, message_delta,
    message_stop, pings between, and `event: error` for an in-band error."""

    provider = "anthropic"
    model = "claude-fake"
    signature = "EqsDCpQBsig=="  # sent with each thinking block...
    reasoning_signature: ClassVar[str | None] = signature  # ...and so recorded with it

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
            deltas.append({"type": "signature_delta", "signature": self.signature})
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
