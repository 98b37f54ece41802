"""A non-streaming answer: the upstream's JSON body read whole under the attempt's deadlines,
and checked to be an answer at all."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.errors import UpstreamProtocolError
from gateway.pipeline.deadline import AttemptClock
from gateway.providers.base import UpstreamResponse

MAX_BODY = 64 * 1024 * 1024


async def read_json(
    upstream: UpstreamResponse, clock: AttemptClock
) -> tuple[bytes, dict[str, Any]]:
    """The body's bytes and the JSON object they hold; `UpstreamProtocolError` for a body that
    is too large, not JSON, or not an object."""
    clock.holding = False  # the headers came: from here on, gaps are idle time
    parts: list[bytes] = []
    size = 0
    while True:
        clock.arm()
        chunk = await upstream.read()
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
        if size > MAX_BODY:
            raise UpstreamProtocolError(f"the upstream response exceeded {MAX_BODY} bytes")
    raw = b"".join(parts)
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise UpstreamProtocolError(
            f"the upstream answered with invalid JSON: {raw[:200]!r}"
        ) from None
    if not isinstance(obj, dict):
        raise UpstreamProtocolError("the upstream answer is not a JSON object")
    return raw, obj
