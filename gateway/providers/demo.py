"""The built-in `demo` provider: a deterministic multi-paragraph answer, no key, no network.

It speaks the OpenAI chat wire format byte for byte, so a request to it takes exactly the path a
real upstream's does (SSE decoding, assembly, delivery tracking, recording). The default pace,
about 20 chunks a second, is slow enough to cancel by hand.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import os
import re
import struct
import time
from typing import Any

import orjson

from gateway.config import DeploymentConfig
from gateway.errors import InvalidRequest

_ANSWER = (
    "Thanks for trying the gateway. You asked: \u201c{question}\u201d\n\n"
    "This answer comes from the built-in demo provider, which streams the same words every time "
    "at a steady pace, so you can watch a stream arrive and cut it off halfway. Every request is "
    "recorded as a turn in the conversation store, with the timing of each chunk.\n\n"
    "If you cancel now, the gateway records exactly the part of this answer that reached you, "
    "marked as interrupted. Ask a follow-up in the same conversation and the model's history "
    "holds precisely what you read, not a word more.\n\n"
    "Point a real model alias at an OpenAI-compatible endpoint in config/gateway.yaml to talk "
    "to a real model; nothing else in your application has to change."
)

# The most `completion_tokens` an answer reports (a question is cut to 200 characters and an
# ellipsis): what a budget reserves for one.
MAX_ANSWER_TOKENS = (len(_ANSWER) + 201) // 4 + 1


def _question(body: dict[str, Any]) -> str:
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            text = " ".join(str(content or "").split())
            return text[:200] + ("\u2026" if len(text) > 200 else "")
    return ""


def demo_answer(body: dict[str, Any]) -> str:
    return _ANSWER.format(question=_question(body))


def _pieces(text: str) -> list[str]:
    return re.findall(r"\S+\s*|\s+", text)


class DemoResponse:
    def __init__(self, body: dict[str, Any], model: str, stream: bool, delay_s: float) -> None:
        self._delay = delay_s
        self._closed = False
        answer = demo_answer(body)
        prompt_tokens = max(1, len(orjson.dumps(body.get("messages", []))) // 4)
        completion_tokens = max(1, len(answer) // 4)
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        ident = f"chatcmpl-demo-{os.urandom(12).hex()}"
        created = int(time.time())
        if stream:
            self._chunks = _stream(ident, created, model, answer, usage)
        else:
            self._chunks = [_completion(ident, created, model, answer, usage)]
        self._first = True
        options = body.get("stream_options")
        # Like the OpenAI adapter: usage always comes, and is the gateway's unless asked for.
        self.usage_injected = not (isinstance(options, dict) and options.get("include_usage"))

    async def read(self) -> bytes:
        if self._closed or not self._chunks:
            return b""
        if not self._first and self._delay:
            await asyncio.sleep(self._delay)
        self._first = False
        return self._chunks.pop(0)

    def close(self, *, keep_alive: bool = False) -> None:
        self._closed = True


def _sse(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def _stream(
    ident: str, created: int, model: str, answer: str, usage: dict[str, Any]
) -> list[bytes]:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": ident,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        }

    out = [_sse(chunk({"role": "assistant", "content": ""}))]
    out += [_sse(chunk({"content": piece})) for piece in _pieces(answer)]
    out.append(_sse(chunk({}, "stop")))
    usage_chunk = {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
    }
    out.append(_sse({**usage_chunk, "choices": [], "usage": usage}))
    out.append(b"data: [DONE]\n\n")
    return out


def _completion(ident: str, created: int, model: str, answer: str, usage: dict[str, Any]) -> bytes:
    return orjson.dumps(
        {
            "id": ident,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": usage,
        }
    )


class DemoProvider:
    wire = "openai_chat"

    def __init__(self, config: DeploymentConfig, model: str) -> None:
        self._model = model
        self._delay = config.chunk_delay_ms / 1000.0

    async def chat(self, body: dict[str, Any], *, stream: bool) -> DemoResponse:
        return DemoResponse(body, self._model, stream, self._delay)

    async def embeddings(self, body: dict[str, Any]) -> bytes:
        return demo_embeddings(body, self._model)


DEMO_DIMENSIONS = 16  # the length of a demo embedding


def demo_embeddings(body: dict[str, Any], model: str) -> bytes:
    """Deterministic unit vectors from a hash of each input: same text, same vector. Each value
    is a float32, as OpenAI's are, so the float and base64 forms of a vector are the same
    numbers. `dimensions` (at most 16) keeps the first components, renormalised, as OpenAI's
    text-embedding-3 models do."""
    dimensions = body.get("dimensions") or DEMO_DIMENSIONS
    if dimensions > DEMO_DIMENSIONS:
        raise InvalidRequest(
            f"The demo model's embeddings have {DEMO_DIMENSIONS} dimensions;"
            f" 'dimensions' must be at most {DEMO_DIMENSIONS}.",
            param="dimensions",
        )
    inputs = body.get("input")
    texts = [inputs] if isinstance(inputs, str) else list(inputs or [])
    data = []
    for i, text in enumerate(texts):
        digest = hashlib.sha256(str(text).encode()).digest()
        vector = [(b - 127.5) / 127.5 for b in digest[:dimensions]]
        norm = math.sqrt(sum(v * v for v in vector)) or 1.0
        unit = [v / norm for v in vector]
        as_float32 = struct.unpack(f"<{dimensions}f", struct.pack(f"<{dimensions}f", *unit))
        data.append({"object": "embedding", "index": i, "embedding": list(as_float32)})
    tokens = sum(max(1, len(str(t)) // 4) for t in texts)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return orjson.dumps({"object": "list", "data": data, "model": model, "usage": usage})
