"""POST /v1/chat/completions: parse the OpenAI dialect, join the conversation, run the pipeline."""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.events import new_id
from gateway.conversations.recorder import TurnRecorder
from gateway.dialects.openai_chat import parse_chat_request
from gateway.errors import Conflict, NotFound
from gateway.http.auth import PRINCIPAL
from gateway.http.middleware import REQUEST_ID
from gateway.pipeline import ChatCall, run_chat


async def chat_completions(request: web.Request) -> web.StreamResponse:
    gateway = request.app[GATEWAY]
    principal = request[PRINCIPAL]
    body, parsed = parse_chat_request(await request.read())
    alias = gateway.routes.alias(parsed.model, principal)
    joined = await gateway.conversations.join(
        request.headers.get("X-Conversation-Id"), body["messages"], principal
    )
    headers = {"X-Conversation-Id": joined.conversation_id}
    if joined.repaired is not None:
        # The upstream gets the history the user saw: the dropped partial answer put back.
        body = {**body, "messages": joined.repaired}
        headers["X-Gateway-History-Repaired"] = "1"
    turn = TurnRecorder(
        gateway.store,
        joined.conversation_id,
        new_id("turn"),
        team_id=principal.team_id,
        key_id=principal.key_id,
        user=principal.user or (body.get("user") if isinstance(body.get("user"), str) else None),
        alias=alias.name,
        prompt=body["messages"],
        meter=gateway.meter,
    )
    turn.begin(
        new_conversation=joined.create,
        new_messages=joined.new_messages,
        request={
            "endpoint": "chat.completions",
            "request_id": request[REQUEST_ID],
            "model": parsed.model,
            "stream": bool(parsed.stream),
            "instructions": [
                m for m in body["messages"] if m.get("role") in ("system", "developer")
            ],
            "params": {k: v for k, v in body.items() if k != "messages"},
        },
    )
    call = ChatCall(
        request=request,
        body=body,
        stream=bool(parsed.stream),
        alias=alias,
        plan=gateway.routes.plan(alias, body),
        turn=turn,
        headers=headers,
        cancel_reason=gateway.cancel_reason,
        spawn=gateway.spawn,
        cancels=gateway.cancels,
        request_id=request[REQUEST_ID],
        team_id=principal.team_id,
    )
    return await run_chat(call)


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
