"""Read a conversation's events and derived messages; make a branch."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.events import Conversation
from gateway.conversations.item_refs import resolve_items
from gateway.conversations.items import items_to_messages, path_items
from gateway.conversations.truncate import branch_point, content_chars_of, event_log, truncate
from gateway.dialects.requests import parse_json_object
from gateway.errors import InvalidRequest
from gateway.http.auth import PRINCIPAL


async def events(request: web.Request) -> web.Response:
    path = await event_log(
        request.app[GATEWAY].conversations, request.match_info["id"], request[PRINCIPAL]
    )
    return web.json_response({"object": "list", "data": [e.to_api() for e in path]})


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
    items = await resolve_items(request.app[GATEWAY], request[PRINCIPAL], None, body.get("items"))
    messages = items_to_messages(items or [])
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise InvalidRequest("'metadata' must be an object.", param="metadata")
    made = await request.app[GATEWAY].conversations.create(request[PRINCIPAL], messages, metadata)
    return web.json_response(_conversation(made))


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
    items = await resolve_items(
        request.app[GATEWAY], request[PRINCIPAL], request.match_info["id"], body.get("items")
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
