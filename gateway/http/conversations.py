"""Read a conversation's events and derived messages; make a branch."""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.openai_chat import parse_json_object
from gateway.http.auth import PRINCIPAL


async def events(request: web.Request) -> web.Response:
    path = await request.app[GATEWAY].conversations.path(
        request.match_info["id"], request[PRINCIPAL]
    )
    return web.json_response({"object": "list", "data": [e.to_api() for e in path]})


async def messages(request: web.Request) -> web.Response:
    derived = await request.app[GATEWAY].conversations.messages(
        request.match_info["id"], request[PRINCIPAL]
    )
    return web.json_response({"object": "list", "data": derived})


async def branch(request: web.Request) -> web.Response:
    body = parse_json_object(await request.read())
    created = await request.app[GATEWAY].conversations.branch(
        request.match_info["id"], body.get("at_seq"), request[PRINCIPAL]
    )
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
