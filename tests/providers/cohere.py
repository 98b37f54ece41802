"""A fake Cohere v2 chat API (`POST /v2/chat`), as a `cohere_chat/...` deployment calls it.

Cohere's v2 stream names each event twice, in the SSE `event:` line and the JSON's `type`:
`message-start`, then per content block `content-start` / `content-delta` / `content-end` (a
reasoning model's thinking is a block of type `thinking`, its deltas `{"thinking": ...}`), a
tool call as `tool-call-start` (id and name) / `tool-call-delta` (argument pieces) /
`tool-call-end`, and `message-end` carrying the finish reason (`COMPLETE`, `TOOL_CALL`, ...)
and the usage (`billed_units` and `tokens`). A failure after the stream began is a
`message-end` whose finish reason is `ERROR`, with the error's text beside it. HTTP errors are
`{"id", "message"}`.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes import API_KEY, COMPLETION_TOKENS, PROMPT_TOKENS, Block, FakeServer, Reply, sse

# Cohere's api_base is the chat endpoint's whole URL, as litellm takes it.
CHAT_PATH = "/v2/chat"


def event(obj: dict[str, Any]) -> bytes:
    return sse(obj, obj["type"])


def usage() -> dict[str, Any]:
    tokens = {"input_tokens": PROMPT_TOKENS, "output_tokens": COMPLETION_TOKENS}
    return {"billed_units": tokens, "tokens": tokens}


class CohereServer(FakeServer):
    """Cohere's v2 chat endpoint, configured as litellm's `cohere_chat` provider."""

    provider = "litellm"
    cohere_model = "command-a-03-2025"
    model = f"cohere_chat/{cohere_model}"

    def api_base(self) -> str:
        return self.url + CHAT_PATH

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post(CHAT_PATH, self.handle)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == CHAT_PATH
        assert request.headers["Authorization"].lower() == f"bearer {API_KEY}"
        assert body["model"] == self.cohere_model
        assert body["stream"] is True

    def question(self, body: dict[str, Any]) -> str:
        content = body["messages"][-1]["content"]
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") for part in content)

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        message = {"role": "assistant", "content": [], "tool_plan": "", "tool_calls": []}
        start = {"id": "29f14a5a-11de-4cae-9800-25e4747408ea", "type": "message-start"}
        out = [event({**start, "delta": {"message": message}})]
        last = len(reply.blocks) - 1
        for index, block in enumerate(reply.blocks):
            out += self.block(index, block, complete=reply.finish is not None or index < last)
        if reply.error_message is not None:
            delta = {"error": reply.error_message, "finish_reason": "ERROR", "usage": usage()}
            out.append(event({"type": "message-end", "delta": delta}))
        if reply.finish is None:
            return out
        finish = "TOOL_CALL" if reply.finish == "tool_calls" else "COMPLETE"
        out.append(
            event({"type": "message-end", "delta": {"finish_reason": finish, "usage": usage()}})
        )
        return out

    def block(self, index: int, block: Block, *, complete: bool) -> list[bytes]:
        """A content block or tool call's start and deltas, and its end when `complete`."""
        if block.kind == "tool_call":
            function = {"name": block.name, "arguments": ""}
            call = {"id": block.id, "type": "function", "function": function}
            out = [self.tool_event("tool-call-start", index, call)]
            for part in block.parts:
                out.append(
                    self.tool_event("tool-call-delta", index, {"function": {"arguments": part}})
                )
            if complete:
                out.append(event({"type": "tool-call-end", "index": index}))
            return out
        kind = "thinking" if block.kind == "reasoning" else "text"
        begin = {"message": {"content": {"type": kind, kind: ""}}}
        out = [event({"type": "content-start", "index": index, "delta": begin})]
        for part in block.parts:
            delta = {"message": {"content": {kind: part}}}
            out.append(event({"type": "content-delta", "index": index, "delta": delta}))
        if complete:
            out.append(event({"type": "content-end", "index": index}))
        return out

    @staticmethod
    def tool_event(kind: str, index: int, call: dict[str, Any]) -> bytes:
        delta = {"message": {"tool_calls": call}}
        return event({"type": kind, "index": index, "delta": delta})

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"id": "5b7a4c1e-2f3d-4e5f-8a9b-0c1d2e3f4a5b", "message": message}

    def whole(self, text: str) -> None:
        """A whole (non-streaming) v2 answer: `text`, finished with COMPLETE, and usage."""

        async def script(request: web.Request) -> web.StreamResponse:
            message = {"role": "assistant", "content": [{"type": "text", "text": text}]}
            body = {
                "id": "c14c80c3-18eb-4519-9460-6c92edd8cfb4",
                "message": message,
                "finish_reason": "COMPLETE",
                "usage": usage(),
            }
            return web.json_response(body)

        self.push(script)
