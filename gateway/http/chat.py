"""POST /v1/chat/completions, and the cancel of one in flight from another connection."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.truncate import cancel_content_chars
from gateway.dialects.openai_chat import OPENAI_CHAT, parse_chat_request
from gateway.errors import Conflict, NotFound
from gateway.http.auth import PRINCIPAL
from gateway.http.large_bodies import read_parsed
from gateway.http.middleware import REQUEST_ID
from gateway.pipeline.cancel import CANCEL_BUS, Outcome, stop, truncated
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
    On replicas sharing Redis the stream may run on another one (gateway.pipeline.cancel).
    With `{"content_chars": N}`, once the turn has ended its interrupted answer is truncated to
    what the client showed (docs/recording.md, "What the user saw"), and `truncation` says so.
    """
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    request_id = request.match_info["request_id"]
    content_chars = cancel_content_chars(await request.read())
    bus = request.app.get(CANCEL_BUS)
    here = gateway.in_flight(request_id, principal)
    turn_id = None
    if here is None and bus is not None:
        team = None if principal.is_admin else principal.team_id
        turn_id = await gateway.store.open_turn_of_request(request_id, team)
    done = await stop(gateway, bus, principal, here=here, turn_id=turn_id, wait=False)
    if done.outcome is Outcome.FINISHING:
        raise Conflict(f"The request '{request_id}' is already finishing.", code="not_cancellable")
    if done.outcome is not Outcome.CANCELLED:
        raise NotFound(
            f"No chat completion with request id '{request_id}' is in progress"
            " (it may have finished already)."
        )
    answer: dict[str, Any] = {
        "id": request_id,
        "object": "chat.completion.cancellation",
        "status": "cancelled",
    }
    if content_chars is not None:
        answer["truncation"] = await truncated(gateway, here, done, content_chars, principal)
    return web.json_response(answer)
