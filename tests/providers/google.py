"""A fake Gemini API (Google AI Studio, generativelanguage.googleapis.com), whose stream Vertex
AI's Gemini endpoint sends too (tests/providers/vertex.py)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from tests.fakes import API_KEY, COMPLETION_TOKENS, PROMPT_TOKENS, FakeServer, Reply, sse


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
