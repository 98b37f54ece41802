"""POST /v1/chat/completions, and the cancel of one in flight from another connection."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.truncate import cancel_content_chars, truncate_cancelled
from gateway.dialects.openai_chat import OPENAI_CHAT, parse_chat_request
from gateway.errors import Conflict, NotFound
from gateway.http.auth import PRINCIPAL
from gateway.http.large_bodies import read_parsed
from gateway.http.middleware import REQUEST_ID
from gateway.pipeline.turn import TurnRequest, run_turn, shape_of


async def chat_completions(request: web.Request) -> web.StreamResponse:
    shape = shape_of(request)
    body, stream = await read_parsed(request, lambda raw: parse_chat_request(raw, shape))
    turn = TurnRequest(body, stream, OPENAI_CHAT, request[REQUEST_ID])
    return await run_turn(request.app[GATEWAY], request, request[PRINCIPAL], turn)


async def cancel(request: web.Request) -> web.Response:
    """POST /v1/chat/completions/{request_id}/cancel: stop a stream from another connection.

    The stream ends cleanly after the last delta its client got: a final chunk with
    `finish_reason: "cancelled"`, then `data: [DONE]`; the turn records exactly what it got.
    With `{"content_chars": N}`, once the turn has ended its interrupted answer is truncated to
    what the client showed (docs/recording.md, "What the user saw"), and `truncation` says so.
    """
    request_id = request.match_info["request_id"]
    content_chars = cancel_content_chars(await request.read())
    entry = request.app[GATEWAY].in_flight(request_id, request[PRINCIPAL])
    if entry is None:
        raise NotFound(
            f"No chat completion with request id '{request_id}' is in progress"
            " (it may have finished already)."
        )
    if not entry.cancel():
        raise Conflict(f"The request '{request_id}' is already finishing.", code="not_cancellable")
    answer: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.cancellation",
        "status": "cancelled",
    }
    if content_chars is not None:
        answer["truncation"] = await truncate_cancelled(
            request.app[GATEWAY].conversations, entry.turn, content_chars, request[PRINCIPAL]
        )
    return web.json_response(answer)
