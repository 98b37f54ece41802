"""A fake Mistral API (`POST /v1/chat/completions`), as a `mistral/...` deployment calls it.

Mistral's stream is OpenAI's chat chunks with its own habits: a Magistral model's reasoning
comes as content *parts*, `{"type": "thinking", "thinking": [{"type": "text", "text": ...}]}`,
where the answer's text is a plain string; a tool call comes whole in one chunk (Mistral's ids
are nine letters and digits); the finish chunk carries the usage itself (no usage-only chunk);
the body ends with `data: [DONE]`. Errors are `{"object": "error", "message", "type", "param",
"code"}`. Mistral documents no in-band error event: the fake sends its error object as a data
frame, as an OpenAI-compatible server built like it does.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes import API_KEY, COMPLETION_TOKENS, DONE, PROMPT_TOKENS, FakeUpstream, Reply, sse


def thinking(text: str) -> list[dict[str, Any]]:
    return [{"type": "thinking", "thinking": [{"type": "text", "text": text}]}]


class MistralServer(FakeUpstream):
    """La Plateforme's chat completions endpoint, configured as litellm's `mistral` provider."""

    provider = "litellm"
    mistral_model = "magistral-medium-latest"  # reasons: the contract asks for reasoning_effort
    model = f"mistral/{mistral_model}"

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == "/v1/chat/completions"
        assert request.headers["Authorization"] == f"Bearer {API_KEY}"
        assert body["model"] == self.mistral_model
        assert body["stream"] is True

    def question(self, body: dict[str, Any]) -> str:
        content = body["messages"][-1]["content"]
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") for part in content)

    def chunk_object(
        self, delta: dict[str, Any], finish: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {
            "id": "8b2f1e6c4d2a4b0f9d1e2c3a4b5c6d7e",
            "object": "chat.completion.chunk",
            "created": 1759752086,
            "model": self.mistral_model,
            "choices": [choice],
            **extra,
        }

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        out = [sse(self.chunk_object({"role": "assistant", "content": ""}))]
        for block in reply.blocks:
            if block.kind == "text":
                out += [sse(self.chunk_object({"content": p})) for p in block.parts]
            elif block.kind == "reasoning":
                out += [sse(self.chunk_object({"content": thinking(p)})) for p in block.parts]
            else:
                function = {"name": block.name, "arguments": "".join(block.parts)}
                call = {"id": block.id, "function": function, "index": 0}
                out.append(sse(self.chunk_object({"tool_calls": [call]})))
        if reply.error_message is not None:
            out.append(sse(self.error_body(503, reply.error_message)))
        if reply.finish is None:
            return out
        usage = {
            "prompt_tokens": PROMPT_TOKENS,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            "completion_tokens": COMPLETION_TOKENS,
        }
        out.append(sse(self.chunk_object({"content": ""}, reply.finish, usage=usage)))
        out.append(DONE)
        return out

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "internal_server_error"
        return {"object": "error", "message": message, "type": kind, "param": None, "code": None}

    def whole(self, reasoning: str, text: str) -> None:
        """A whole (non-streaming) Magistral answer: its content a thinking part and a text
        part, finished with "stop", with usage."""

        async def script(request: web.Request) -> web.StreamResponse:
            content = [*thinking(reasoning), {"type": "text", "text": text}]
            content[0]["closed"] = True
            message = {"role": "assistant", "tool_calls": None, "content": content}
            body = {
                "id": "cmpl-e5cc70bb28c444948073e77776eb30ef",
                "object": "chat.completion",
                "created": 1759752086,
                "model": self.mistral_model,
                "usage": {
                    "prompt_tokens": PROMPT_TOKENS,
                    "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
                    "completion_tokens": COMPLETION_TOKENS,
                },
                "choices": [{"index": 0, "finish_reason": "stop", "message": message}],
            }
            return web.json_response(body)

        self.push(script)
