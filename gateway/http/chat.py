"""POST /v1/chat/completions, and the cancel of one in flight from another connection."""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.openai_chat import OPENAI_CHAT, parse_chat_request
from gateway.errors import Conflict, NotFound
from gateway.http.auth import PRINCIPAL
from gateway.http.middleware import REQUEST_ID
from gateway.pipeline.turn import TurnRequest, run_turn


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body, parsed = parse_chat_request(await request.read())
    turn = TurnRequest(body, bool(parsed.stream), OPENAI_CHAT, request[REQUEST_ID])
    return await run_turn(request.app[GATEWAY], request, request[PRINCIPAL], turn)


async def cancel(request: web.Request) -> web.Response:
    """POST /v1/chat/completions/{request_id}/cancel: stop a stream from another connection.

    The stream ends cleanly after the last delta its client got: a final chunk with
    `finish_reason: "cancelled"`, then `data: [DONE]`; the turn records exactly what it got.
    """
    request_id = request.match_info["request_id"]
    entry = request.app[GATEWAY].cancels.get(request_id)
    if entry is None or not request[PRINCIPAL].sees(entry[0]):
        raise NotFound(
            f"No chat completion with request id '{request_id}' is in progress"
            " (it may have finished already)."
        )
    if not entry[1]():
        raise Conflict(f"The request '{request_id}' is already finishing.", code="not_cancellable")
    return web.json_response(
        {"id": request_id, "object": "chat.completion.cancellation", "status": "cancelled"}
    )
