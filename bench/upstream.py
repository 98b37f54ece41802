"""A fast fake OpenAI-compatible upstream: `python -m bench.upstream --port P`.

Every response body is built once at import, so the upstream spends its CPU on HTTP, not on
JSON; the bench then measures the proxy in front of it, not this process. A stream is written
a chunk per write (one HTTP chunk each, no sleeps), as a provider sends tokens as it makes
them; a request whose `user` is `bench-burst` gets the whole stream in a single write instead,
the worst case for a proxy's per-frame work.
"""

from __future__ import annotations

import argparse
import itertools

import orjson
import uvloop
from aiohttp import web

STREAM_CHUNKS = 50
BURST = "bench-burst"  # the request's `user`: the stream in one write
ANSWER = "Hello from the bench upstream."  # the non-streaming answer
MODEL = "fake-model"
CREATED = 1_700_000_000
# Each response gets its own id (real upstreams do, and a recorder may key on it). The
# placeholder has the same length as the ids we substitute, so the bodies are built once.
_ID_PLACEHOLDER = b"chatcmpl-0000000000000000"
_ids = itertools.count(1)
USAGE = {"prompt_tokens": 5, "completion_tokens": STREAM_CHUNKS, "total_tokens": 5 + STREAM_CHUNKS}


def _chunk(delta: dict[str, str], finish_reason: str | None) -> dict[str, object]:
    return {
        "id": _ID_PLACEHOLDER.decode(),
        "object": "chat.completion.chunk",
        "created": CREATED,
        "model": MODEL,
        "system_fingerprint": "fp_bench",
        "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
    }


def _sse(payload: object) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


def build_stream(include_usage: bool) -> bytes:
    # The role rides on the first content chunk so there are exactly STREAM_CHUNKS content chunks.
    parts = [_sse(_chunk({"role": "assistant", "content": "word "}, None))]
    parts += [_sse(_chunk({"content": "word "}, None)) for _ in range(STREAM_CHUNKS - 1)]
    parts.append(_sse(_chunk({}, "stop")))
    if include_usage:
        usage_chunk = _chunk({}, None)
        usage_chunk["choices"] = []
        usage_chunk["usage"] = USAGE
        parts.append(_sse(usage_chunk))
    parts.append(b"data: [DONE]\n\n")
    return b"".join(parts)


def build_completion() -> bytes:
    return orjson.dumps(
        {
            "id": _ID_PLACEHOLDER.decode(),
            "object": "chat.completion",
            "created": CREATED,
            "model": MODEL,
            "system_fingerprint": "fp_bench",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ANSWER},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        }
    )


STREAM_BODY = build_stream(include_usage=False)
STREAM_BODY_USAGE = build_stream(include_usage=True)
COMPLETION_BODY = build_completion()


def _with_new_id(body: bytes) -> bytes:
    return body.replace(_ID_PLACEHOLDER, b"chatcmpl-%016d" % next(_ids))


async def chat_completions(request: web.Request) -> web.StreamResponse:
    try:
        body = orjson.loads(await request.read())
    except orjson.JSONDecodeError:
        return web.json_response({"error": {"message": "invalid JSON"}}, status=400)
    if not body.get("stream"):
        return web.Response(body=_with_new_id(COMPLETION_BODY), content_type="application/json")
    options = body.get("stream_options") or {}
    template = STREAM_BODY_USAGE if options.get("include_usage") else STREAM_BODY
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)  # chunked transfer encoding, as real upstreams send
    stream = _with_new_id(template)
    if body.get("user") == BURST:
        await response.write(stream)
    else:
        for frame in stream.split(b"\n\n")[:-1]:
            await response.write(frame + b"\n\n")
    await response.write_eof()
    return response


def make_app() -> web.Application:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat_completions)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    # No access log: formatting a log line per request would dominate a handler this small.
    web.run_app(
        make_app(),
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        shutdown_timeout=1,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
