"""Upstream answers for the framework tests, in whichever shape the request asked for.

The frameworks choose for themselves whether to stream (LangChain's `ainvoke` does not, its
`astream` does; the Agents SDK's `Runner.run` does not, `Runner.run_streamed` does; the gateway
forwards the client's choice upstream), so `reply` answers a streaming request with chat
completion chunks (and the usage chunk when `stream_options.include_usage` asks for it) and any
other with one whole `chat.completion`, as OpenAI does. It can hold text, several tool calls
(parallel ones: `index` 0, 1, ... in one answer) or both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from tests.fakes import COMPLETION_TOKENS, DONE, FAKE, PROMPT_TOKENS, Script, sse

USAGE = {
    "prompt_tokens": PROMPT_TOKENS,
    "completion_tokens": COMPLETION_TOKENS,
    "total_tokens": PROMPT_TOKENS + COMPLETION_TOKENS,
}


@dataclass(frozen=True)
class Call:
    """A tool call the model makes: its id, the function's name, its arguments."""

    id: str
    name: str
    arguments: dict[str, Any]

    @property
    def json(self) -> str:
        return json.dumps(self.arguments, separators=(",", ":"))


def reply(text: str | Sequence[str] = "", calls: Sequence[Call] = ()) -> Script:
    """An answer of `text` (a streamed one in these parts) and `calls`, finished with
    "tool_calls" when there are calls, else "stop"."""
    parts = [text] if isinstance(text, str) else list(text)
    parts = [p for p in parts if p]
    finish = "tool_calls" if calls else "stop"

    async def script(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if not body.get("stream"):
            return web.json_response(_completion("".join(parts), calls, finish))
        fake = request.app[FAKE]
        response = await fake.start_sse(request)
        frames = [sse(fake.chunk_object({"role": "assistant", "content": "", "refusal": None}))]
        frames += [sse(fake.chunk_object({"content": p})) for p in parts]
        for index, call in enumerate(calls):
            head = {"index": index, "id": call.id, "type": "function"}
            head["function"] = {"name": call.name, "arguments": ""}
            frames.append(sse(fake.chunk_object({"tool_calls": [head]})))
            # The arguments in two pieces, as a model streams them.
            half = len(call.json) // 2
            for piece in (call.json[:half], call.json[half:]):
                delta = {"index": index, "function": {"arguments": piece}}
                frames.append(sse(fake.chunk_object({"tool_calls": [delta]})))
        frames.append(sse(fake.chunk_object({}, finish)))
        options = body.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage"):
            frames.append(sse({**fake.chunk_object({}), "choices": [], "usage": USAGE}))
        frames.append(DONE)
        for frame in frames:
            await fake.write(response, frame)
        await response.write_eof()
        return response

    return script


def _completion(content: str, calls: Sequence[Call], finish: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content or None, "refusal": None}
    if calls:
        message["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.json}}
            for c in calls
        ]
    return {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model",
        "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish}],
        "usage": USAGE,
    }
