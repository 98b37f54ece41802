"""The OpenAI Responses API: stateful responses for every provider behind the gateway."""

from __future__ import annotations

import time
from typing import Any, cast

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.derive import close_unanswered
from gateway.conversations.history import resent
from gateway.conversations.item_refs import resolve_item_references
from gateway.conversations.items import path_items
from gateway.conversations.recorder import TurnRecorder
from gateway.conversations.service import Joined
from gateway.conversations.stored_responses import ResponseStore, StoredResponse, answer_of
from gateway.conversations.truncate import cancel_content_chars
from gateway.dialects.openai_responses import (
    Responses,
    ResponsesRequest,
    chat_body,
    output_items,
    parse_request,
    response_object,
)
from gateway.errors import Conflict
from gateway.http.auth import PRINCIPAL
from gateway.http.large_bodies import read_parsed
from gateway.http.middleware import REQUEST_ID
from gateway.ids import new_id
from gateway.pipeline.cancel import CANCEL_BUS, Outcome, stop, truncated
from gateway.pipeline.turn import TurnRequest, run_turn, shape_of, turn_user


def _store(request: web.Request) -> ResponseStore:
    gateway = request.app[GATEWAY]
    return ResponseStore(gateway.store, gateway.conversations)


async def create(request: web.Request) -> web.StreamResponse:
    shape = shape_of(request)
    parsed, new_messages = await read_parsed(request, lambda raw: parse_request(raw, shape))
    # `item_reference` input items, read back from the store (the key's team only): a 400
    # naming one that is unknown, before anything is recorded or sent.
    gateway = request.app[GATEWAY]
    new_messages = await resolve_item_references(
        gateway.store,
        gateway.conversations,
        request[PRINCIPAL],
        request.headers,
        parsed,
        new_messages,
    )
    principal = request[PRINCIPAL]
    store = _store(request)
    conversations = request.app[GATEWAY].conversations
    named = conversations.requested_id(request.headers, parsed.metadata)
    if parsed.previous_response_id is None and parsed.conversation_id is None and named is None:
        # A stateless request (the whole history in `input`, as agent SDKs send it): it
        # continues the conversation its history matches, as a chat request does.
        body = chat_body(parsed, [], new_messages)
        user = turn_user(principal, cast("dict[str, Any]", body))
        # Only an Anthropic deployment needs the stored answers' signed thinking back (found by
        # comparing the history with the stored one); the plan is made later, so any of the
        # alias's counts.
        routes = request.app[GATEWAY].routes
        restore = routes.reaches(routes.alias(body.get("model"), principal), "anthropic")
        joined = await conversations.join(
            None, body["messages"], principal, user, restore_thinking=restore
        )
    else:
        joined, history = await store.history(
            principal,
            parsed.previous_response_id,
            parsed.conversation_id,
            named,
            new_messages=new_messages,
        )
        # One history: what the input repeats of the stored last turn is not recorded twice.
        new_messages = new_messages[resent(history, new_messages) :]
        joined = Joined(joined.conversation_id, joined.create, new_messages)
        body = chat_body(parsed, history, new_messages)
    response_id = f"resp_{new_id('r')[2:]}"
    created_at = time.time()
    initial = response_object(
        response_id,
        parsed,
        status="in_progress",
        output=[],
        usage=None,
        created_at=int(created_at),
        previous_response_id=parsed.previous_response_id,
        conversation_id=parsed.conversation_id,
    )
    body["messages"] = close_unanswered(body["messages"])

    def remember(turn: TurnRecorder) -> None:
        store.save(
            StoredResponse(
                response_id,
                turn.turn_id,
                joined.conversation_id,
                joined.create.team_id if joined.create else principal.team_id,
                created_at,
                parsed.model_dump(mode="json", exclude_none=True),
                parsed.previous_response_id,
                parsed.store,
            )
        )

    turn = TurnRequest(
        body,
        bool(parsed.stream),
        Responses(initial),
        request[REQUEST_ID],
        joined=joined,
        cancel_key=response_id,
        on_turn=remember,
    )
    return await run_turn(request.app[GATEWAY], request, principal, turn)


async def _object(request: web.Request, stored: StoredResponse) -> dict[str, Any]:
    events = await _store(request).turn_events(stored)
    status, blocks, usage = answer_of(events)
    item_status = "incomplete" if status in ("cancelled", "incomplete") else "completed"
    parsed = ResponsesRequest.model_validate(stored.request)
    response = response_object(
        stored.id,
        parsed,
        status=status,
        output=output_items(blocks, status=item_status, response_id=stored.id),
        usage=usage,
        created_at=int(stored.created_at),
        previous_response_id=stored.previous_response_id,
        conversation_id=parsed.conversation_id,
    )
    return response


async def retrieve(request: web.Request) -> web.Response:
    stored = await _store(request).get(request.match_info["id"], request[PRINCIPAL])
    return web.json_response(await _object(request, stored))


async def delete(request: web.Request) -> web.Response:
    response_id = request.match_info["id"]
    await _store(request).delete(response_id, request[PRINCIPAL])
    return web.json_response({"id": response_id, "object": "response", "deleted": True})


async def input_items(request: web.Request) -> web.Response:
    store = _store(request)
    stored = await store.get(request.match_info["id"], request[PRINCIPAL])
    events = await store.turn_events(stored)
    items = path_items([e for e in events if e.type in ("user/message", "tool/result")])
    if request.query.get("order", "desc") == "desc":
        items.reverse()
    return web.json_response(
        {
            "object": "list",
            "data": items,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None,
            "has_more": False,
        }
    )


async def cancel(request: web.Request) -> web.Response:
    """Stop an in-flight response from another connection (a Stop button). With
    `{"content_chars": N}`, once its turn has ended its interrupted output is truncated to what
    the client showed (docs/recording.md, "What the user saw"): the answer shows it."""
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    response_id = request.match_info["id"]
    content_chars = cancel_content_chars(await request.read())
    stored = await _store(request).get(response_id, principal)
    # Running here, else perhaps on another replica (gateway.pipeline.cancel).
    here = gateway.in_flight(response_id, principal)
    bus = request.app.get(CANCEL_BUS)
    turn_id = stored.turn_id if here is None and bus is not None else None
    done = await stop(gateway, bus, principal, here=here, turn_id=turn_id, wait=False)
    if done.outcome is not Outcome.CANCELLED:
        raise Conflict(
            f"The response '{response_id}' is not in progress; only an in-flight response can be"
            " cancelled.",
            code="response_not_in_progress",
        )
    if content_chars is not None:
        await truncated(gateway, here, done, content_chars, principal)
    await gateway.store.flush()
    response = await _object(request, stored)
    response["status"] = "cancelled"
    return web.json_response(response)
