"""A fake Groq API (`POST /openai/v1/chat/completions`), as a `groq/...` deployment calls it.

Groq's stream is OpenAI's chat chunks with its own habits, as captured from api.groq.com: the
first chunk carries `x_groq.id`; a gpt-oss model's reasoning comes in `delta.reasoning` with
`"channel": "analysis"`; a tool call comes whole in one chunk; the finish chunk repeats the
usage under `x_groq.usage` (and, when `stream_options.include_usage` asked for it, as `usage`,
followed by a usage-only chunk with `service_tier`); an in-band error is an `event: error` frame
(tests/fixtures/real-streams/groq-chat-reasoning-error-event.sse), after which the body ends.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from tests.fakes import API_KEY, COMPLETION_TOKENS, DONE, PROMPT_TOKENS, FakeUpstream, Reply, sse

REQUEST_ID = "req_01k88s35vyfamba7t4z3e4xhqx"


class GroqServer(FakeUpstream):
    """Groq's OpenAI-compatible endpoint, configured as litellm's `groq` provider."""

    provider = "litellm"
    base_path = "/openai/v1"
    groq_model = "openai/gpt-oss-120b"  # reasons, so the contract's `reasoning_effort` is taken
    model = f"groq/{groq_model}"

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/openai/v1/chat/completions", self.handle)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == "/openai/v1/chat/completions"
        assert request.headers["Authorization"] == f"Bearer {API_KEY}"
        assert body["model"] == self.groq_model
        assert body["stream"] is True

    def chunk_object(
        self, delta: dict[str, Any], finish: str | None = None, **extra: Any
    ) -> dict[str, Any]:
        obj = super().chunk_object(delta, finish, **extra)
        obj["model"] = self.groq_model
        obj["system_fingerprint"] = "fp_c82faf3ca0"
        return obj

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        first = {"role": "assistant", "content": ""}
        out = [sse(self.chunk_object(first, x_groq={"id": REQUEST_ID, "seed": 581043163}))]
        for block in reply.blocks:
            if block.kind == "text":
                out += [sse(self.chunk_object({"content": p})) for p in block.parts]
            elif block.kind == "reasoning":
                deltas = [{"reasoning": p, "channel": "analysis"} for p in block.parts]
                out += [sse(self.chunk_object(delta)) for delta in deltas]
            else:
                function = {"name": block.name, "arguments": "".join(block.parts)}
                call = {"id": block.id, "type": "function", "function": function, "index": 0}
                out.append(sse(self.chunk_object({"tool_calls": [call]})))
        if reply.error_message is not None:
            error = {
                "message": reply.error_message,
                "type": "internal_server_error",
                "code": "service_unavailable",
                "status_code": 503,
            }
            out.append(sse({"error": error}, "error"))
        if reply.finish is None:
            return out
        usage = {
            "queue_time": 0.16,
            "prompt_tokens": PROMPT_TOKENS,
            "prompt_time": 0.028,
            "completion_tokens": COMPLETION_TOKENS,
            "completion_time": 0.11,
            "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            "total_time": 0.138,
        }
        options = body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        last: dict[str, Any] = {"x_groq": {"id": REQUEST_ID, "usage": usage}}
        if asked:
            last["usage"] = usage
        out.append(sse(self.chunk_object({}, reply.finish, **last)))
        if asked:
            tail = {**self.chunk_object({}), "choices": [], "usage": usage}
            out.append(sse({**tail, "service_tier": "on_demand"}))
        out.append(DONE)
        return out

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        kind = "invalid_request_error" if status < 500 else "internal_server_error"
        return {"error": {"message": message, "type": kind}}

    def whole(self, text: str) -> None:
        """A whole (non-streaming) answer, shaped as Groq's: usage with its timings, `x_groq`,
        `service_tier`."""

        async def script(request: web.Request) -> web.StreamResponse:
            message = {"role": "assistant", "content": text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": "stop"}
            usage = {
                "queue_time": 0.19,
                "prompt_tokens": PROMPT_TOKENS,
                "prompt_time": 0.0098,
                "completion_tokens": COMPLETION_TOKENS,
                "completion_time": 0.0087,
                "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
                "total_time": 0.0185,
            }
            body = {
                "id": "chatcmpl-46177a1f-ece6-437d-891d-b31f860e1ea5",
                "object": "chat.completion",
                "created": 1761231344,
                "model": self.groq_model,
                "choices": [choice],
                "usage": usage,
                "usage_breakdown": None,
                "system_fingerprint": "fp_05df423bab",
                "x_groq": {"id": REQUEST_ID},
                "service_tier": "on_demand",
            }
            return web.json_response(body)

        self.push(script)
