"""Read a conversation's events and derived messages; make a branch; stop a turn, or watch it."""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.item_refs import resolve_items
from gateway.conversations.items import items_to_messages, path_items
from gateway.conversations.truncate import branch_point, content_chars_of, event_log, truncate
from gateway.dialects.requests import parse_json_object
from gateway.errors import Conflict, InvalidRequest, NotFound
from gateway.http.auth import PRINCIPAL
from gateway.pipeline.cancel import CANCEL_BUS, Outcome, stop
from gateway.storage.records import ContentBlock, Conversation


async def events(request: web.Request) -> web.Response:
    path = await event_log(
        request.app[GATEWAY].conversations, request.match_info["id"], request[PRINCIPAL]
    )
    # What each turn asked for (its recorded request: endpoint, parameters, tools, system
    # prompt, request id, the headers that matter) and the id of the answer it was sent, for
    # the admin UI's request panel.
    turns = await request.app[GATEWAY].store.turn_requests(
        list(dict.fromkeys(e.turn_id for e in path if e.turn_id))
    )
    return web.json_response({"object": "list", "data": [e.to_api() for e in path], "turns": turns})


async def messages(request: web.Request) -> web.Response:
    derived = await request.app[GATEWAY].conversations.messages(
        request.match_info["id"], request[PRINCIPAL]
    )
    return web.json_response({"object": "list", "data": derived})


async def branch(request: web.Request) -> web.Response:
    body = parse_json_object(await request.read())
    conversations, conversation_id = request.app[GATEWAY].conversations, request.match_info["id"]
    at_seq = await branch_point(
        conversations, conversation_id, body.get("at_seq"), request[PRINCIPAL]
    )
    created = await conversations.branch(conversation_id, at_seq, request[PRINCIPAL])
    return web.json_response(
        {
            "id": created.id,
            "object": "conversation",
            "parent_id": created.parent_id,
            "at_seq": created.parent_seq,
            "created_at": created.created_at,
        },
        status=201,
    )


async def truncate_turn(request: web.Request) -> web.Response:
    """Shorten a turn's interrupted answer to what its client showed (docs/recording.md,
    "What the user saw")."""
    body = parse_json_object(await request.read())
    result = await truncate(
        request.app[GATEWAY].conversations,
        request.match_info["id"],
        request.match_info["turn_id"],
        content_chars_of(body),
        request[PRINCIPAL],
    )
    return web.json_response(result)


async def cancel_turn(request: web.Request) -> web.Response:
    """POST /v1/conversations/{id}/turns/{turn_id}/cancel: a Stop button that names the turn.

    The turn ends as a client's cancel ends it: interrupted, with what its client received,
    wherever it runs (gateway.pipeline.cancel); answered once it has ended."""
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    turn_id = request.match_info["turn_id"]
    conversation = await gateway.conversations.get(request.match_info["id"], principal)
    here = gateway.in_flight_turn(turn_id, principal)
    if here is not None and here.turn.conversation_id != conversation.id:
        here = None
    done = await stop(
        gateway,
        request.app.get(CANCEL_BUS),
        principal,
        here=here,
        turn_id=turn_id,
        conversation_id=conversation.id,
    )
    if done.outcome in (Outcome.FINISHING, Outcome.ENDED):
        raise Conflict(f"Turn '{turn_id}' has already ended.", code="turn_ended")
    if done.outcome is Outcome.NOT_ENDED:
        raise Conflict(
            f"Turn '{turn_id}' was cancelled but has not ended yet.", code="turn_in_progress"
        )
    if done.outcome is Outcome.NOT_RUNNING:
        raise NotFound(
            f"Turn '{turn_id}' of conversation '{conversation.id}' is not in progress.",
            code="turn_not_in_flight",
        )
    return web.json_response(
        {
            "object": "conversation.turn.cancellation",
            "conversation_id": conversation.id,
            "turn_id": turn_id,
            "status": _listed_status(done.status),
        }
    )


# How often a live view looks at what its turn's client has.
LIVE_S = 0.25


async def live_turn(request: web.Request) -> web.StreamResponse:
    """GET /v1/conversations/{id}/turns/{turn_id}/live: a streaming turn's answer as its client
    has it, as server-sent events: `answer` (the blocks delivered so far) whenever they grew,
    then `end` (how the turn ended). Only where the turn runs: a turn that has ended answers
    its `end` at once, one open but not run by this process (another replica's) `elsewhere`."""
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    turn_id = request.match_info["turn_id"]
    conversation = await gateway.conversations.get(request.match_info["id"], principal)
    here = gateway.in_flight_turn(turn_id, principal)
    if here is None or here.turn.conversation_id != conversation.id:
        state = await gateway.store.turn_state(turn_id)
        if state is None or state.conversation_id != conversation.id:
            raise NotFound(
                f"No turn found with id '{turn_id}' in conversation '{conversation.id}'."
            )
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    if here is not None:
        shown: list[ContentBlock] | None = None
        while not here.turn.ended:
            now = here.shown()
            if now is not None and now != shown:
                await response.write(_event("answer", {"content": now}))
                shown = now
            try:
                await asyncio.wait_for(here.turn.wait_ended(), LIVE_S)
            except TimeoutError:
                pass
    state = await gateway.store.turn_state(turn_id)
    if state is not None and state.ended_at is None:  # another replica runs it, or none does
        await response.write(_event("elsewhere", {}))
    else:
        status = _listed_status(state.status if state is not None else None)
        await response.write(_event("end", {"status": status}))
    await response.write_eof()
    return response


def _listed_status(status: str | None) -> str | None:
    """A turn's end as the conversation list names it: `interrupted` for one its client left
    or cancelled (unless the whole answer had reached it, finish included: `completed`)."""
    return "interrupted" if status == "aborted" else status


def _event(name: str, data: dict[str, Any]) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _conversation(conversation: Conversation) -> dict[str, Any]:
    return {
        "id": conversation.id,
        "object": "conversation",
        "created_at": int(conversation.created_at),
        "metadata": conversation.metadata or {},
    }


async def create(request: web.Request) -> web.Response:
    body = parse_json_object(await request.read()) if request.can_read_body else {}
    # An `item_reference` to a response's output item the team can read (no conversation yet
    # for a conversation item's seq id to resolve in).
    gateway = request.app[GATEWAY]
    items = await resolve_items(
        gateway.store, gateway.conversations, request[PRINCIPAL], None, body.get("items")
    )
    messages = items_to_messages(items or [])
    metadata = checked_metadata(body.get("metadata"))
    made = await request.app[GATEWAY].conversations.create(request[PRINCIPAL], messages, metadata)
    return web.json_response(_conversation(made))


async def update(request: web.Request) -> web.Response:
    """POST /v1/conversations/{id}: its metadata replaced (the SDKs' `conversations.update`)."""
    body = parse_json_object(await request.read())
    if "metadata" not in body:
        raise InvalidRequest("Missing required parameter: 'metadata'.", param="metadata")
    unknown = sorted(set(body) - {"metadata"})
    if unknown:
        raise InvalidRequest(f"Unknown parameter: '{unknown[0]}'.", param=unknown[0])
    metadata = checked_metadata(body["metadata"])
    updated = await request.app[GATEWAY].conversations.update(
        request.match_info["id"], request[PRINCIPAL], metadata
    )
    return web.json_response(_conversation(updated))


# OpenAI's limits on an object's metadata.
METADATA_PAIRS = 16
METADATA_KEY_CHARS = 64
METADATA_VALUE_CHARS = 512


def checked_metadata(value: Any) -> dict[str, str]:
    """Metadata as OpenAI takes it: at most 16 string values, keys of 64 characters at most,
    values of 512; `null` is none."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("'metadata' must be an object.", param="metadata")
    if len(value) > METADATA_PAIRS:
        raise InvalidRequest(
            f"'metadata' may hold at most {METADATA_PAIRS} keys.", param="metadata"
        )
    for key, item in value.items():
        if len(key) > METADATA_KEY_CHARS:
            raise InvalidRequest(
                f"A metadata key is at most {METADATA_KEY_CHARS} characters.", param="metadata"
            )
        if not isinstance(item, str) or len(item) > METADATA_VALUE_CHARS:
            raise InvalidRequest(
                f"'metadata.{key}' must be a string of at most {METADATA_VALUE_CHARS} characters.",
                param=f"metadata.{key}",
            )
    return value


async def retrieve(request: web.Request) -> web.Response:
    found = await request.app[GATEWAY].conversations.get(
        request.match_info["id"], request[PRINCIPAL]
    )
    return web.json_response(_conversation(found))


async def delete(request: web.Request) -> web.Response:
    conversation_id = request.match_info["id"]
    await request.app[GATEWAY].conversations.delete(conversation_id, request[PRINCIPAL])
    return web.json_response(
        {"id": conversation_id, "object": "conversation.deleted", "deleted": True}
    )


async def list_items(request: web.Request) -> web.Response:
    path = await request.app[GATEWAY].conversations.path(
        request.match_info["id"], request[PRINCIPAL]
    )
    items = path_items(path)
    if request.query.get("order", "asc") == "desc":
        items.reverse()
    after = request.query.get("after")
    if after:
        ids = [i["id"] for i in items]
        items = items[ids.index(after) + 1 :] if after in ids else []
    try:
        limit = max(1, min(100, int(request.query.get("limit", "20"))))
    except ValueError:
        raise InvalidRequest("'limit' must be a number from 1 to 100.", param="limit") from None
    page = items[:limit]
    return web.json_response(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )


async def add_items(request: web.Request) -> web.Response:
    body = parse_json_object(await request.read())
    gateway = request.app[GATEWAY]
    items = await resolve_items(
        gateway.store,
        gateway.conversations,
        request[PRINCIPAL],
        request.match_info["id"],
        body.get("items"),
    )
    messages = items_to_messages(items)
    events = await request.app[GATEWAY].conversations.add_items(
        request.match_info["id"], request[PRINCIPAL], messages
    )
    items = path_items(events)
    return web.json_response(
        {
            "object": "list",
            "data": items,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None,
            "has_more": False,
        }
    )
