"""POST /v1/chat/completions: parse the OpenAI dialect, join the conversation, run the pipeline."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.events import new_id
from gateway.conversations.recorder import TurnRecorder
from gateway.conversations.service import Joined
from gateway.dialects.base import Dialect
from gateway.dialects.openai_chat import OPENAI_CHAT, parse_chat_request
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.http.auth import PRINCIPAL
from gateway.http.middleware import REQUEST_ID
from gateway.metering.keys import Principal
from gateway.metering.limits import Lease, Limiter, scopes_of
from gateway.metering.tokens import count_messages
from gateway.pipeline import ChatCall, run_chat
from gateway.routing.router import Deployment

# The completion a request without max_tokens is assumed to take, for budget reservations.
DEFAULT_COMPLETION_ESTIMATE = 1024


async def chat_completions(request: web.Request) -> web.StreamResponse:
    body, parsed = parse_chat_request(await request.read())
    return await complete(request, body, bool(parsed.stream), OPENAI_CHAT)


async def complete(
    request: web.Request,
    body: dict[str, Any],
    stream: bool,
    dialect: Dialect,
    *,
    joined: Joined | None = None,
    cancel_key: str | None = None,
    on_turn: Callable[[TurnRecorder], None] | None = None,
) -> web.StreamResponse:
    """A completion in any client dialect, `body` already in OpenAI chat shape: limits, join
    the conversation, record the turn, run the pipeline."""
    gateway = request.app[GATEWAY]
    principal = request[PRINCIPAL]
    if isinstance(body.get("user"), str) and "\x00" in body["user"]:
        # Recorded with the turn's usage, where PostgreSQL text refuses NUL: the usage row was
        # dropped and the request went unmetered (a way round budgets).
        raise InvalidRequest("'user' may not contain a NUL character.", param="user")
    alias = gateway.routes.alias(body.get("model"), principal)
    plan = gateway.routes.plan(alias, body)
    lease = await admit(gateway.limiter, principal, body, plan)
    try:
        if joined is None:
            joined = await gateway.conversations.join(
                request.headers.get("X-Conversation-Id"), body["messages"], principal
            )
    except BaseException:
        lease.release()
        raise
    headers = {"X-Conversation-Id": joined.conversation_id, **lease.headers}
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
        lease=lease,
    )
    turn.dialect = dialect.name
    if on_turn is not None:
        on_turn(turn)
    turn.begin(
        new_conversation=joined.create,
        new_messages=joined.new_messages,
        request={
            "endpoint": dialect.name,
            "request_id": request[REQUEST_ID],
            "model": alias.name,
            "stream": stream,
            "instructions": [
                m for m in body["messages"] if m.get("role") in ("system", "developer")
            ],
            "params": {k: v for k, v in body.items() if k != "messages"},
        },
    )
    call = ChatCall(
        request=request,
        body=body,
        stream=stream,
        alias=alias,
        plan=plan,
        turn=turn,
        headers=headers,
        cancel_reason=gateway.cancel_reason,
        spawn=gateway.spawn,
        cancels=gateway.cancels,
        request_id=cancel_key or request[REQUEST_ID],
        team_id=principal.team_id,
        dialect=dialect,
        turn_ends=gateway.turn_ends,
    )
    return await run_chat(call)


async def admit(
    limiter: Limiter, principal: Principal, body: dict[str, Any], plan: list[Deployment]
) -> Lease:
    """Rate limits and budgets, before any upstream call; 429 when one is reached."""
    scopes = scopes_of(
        principal.key_limits, principal.team_limits, principal.key_id, principal.team_id
    )
    if not any(s[2].tpm or s[2].budget for s in scopes):
        return await limiter.admit(scopes, 0, 0.0)  # only counts: no estimate needed
    # Reserve generously: the prompt, plus the most the answer may take.
    prompt = count_messages(body.get("messages") or [])
    completion = body.get("max_completion_tokens") or body.get("max_tokens")
    if not isinstance(completion, int):
        completion = DEFAULT_COMPLETION_ESTIMATE
    price = plan[0].price if plan else None
    cost = price.cost(prompt, completion) if price is not None else 0.0
    return await limiter.admit(scopes, prompt + completion, cost)


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
