"""GET /v1/conversations (the list the admin UI browses) and GET /v1/conversations/{id}/usage.

`/v1/gateway/*` is the master key's alone, so the list lives beside the Conversations API: a
team key lists only its own team's conversations, the master key all of them (or one team's
with `team_id`).
"""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.listing import (
    MAX_LIMIT,
    STATUSES,
    ListQuery,
    attempt_usage,
    list_conversations,
    parse_when,
)
from gateway.errors import InvalidRequest, NotFound
from gateway.http.auth import PRINCIPAL


def _time(request: web.Request, name: str) -> float | None:
    try:
        return parse_when(request.query.get(name))
    except ValueError:
        raise InvalidRequest(
            f"'{name}' takes Unix seconds or an ISO 8601 date or time.", param=name
        ) from None


async def list_(request: web.Request) -> web.Response:
    query = request.query
    principal = request[PRINCIPAL]
    status = query.get("status") or None
    if status is not None and status not in (*STATUSES, "active"):
        raise InvalidRequest(
            "'status' must be completed, interrupted, error or active.", param="status"
        )
    try:
        limit = int(query.get("limit", "20"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidRequest(f"'limit' must be a number from 1 to {MAX_LIMIT}.", param="limit")
    # A team key lists its own team's conversations, whatever it asks for.
    team = query.get("team_id") or None
    if not principal.is_admin:
        team = principal.team_id

    async def named(name: str) -> str | None:
        """An id filter as stored: a team's own ids are in its namespace."""
        value = query.get(name) or None
        if value is None:
            return None
        try:
            return await request.app[GATEWAY].conversations.named(value, principal)
        except NotFound:
            return value  # another team's: the team filter leaves nothing of it

    page = await list_conversations(
        request.app[GATEWAY].store,
        ListQuery(
            team_id=team,
            key_id=query.get("key_id") or None,
            model=query.get("model") or None,
            status=status,
            since=_time(request, "since"),
            until=_time(request, "until"),
            q=(query.get("q") or "").strip() or None,
            parent_id=await named("parent_id"),
            id=await named("id"),
            limit=limit,
            after=await named("after"),
            with_usage=query.get("include") == "usage",
            stopped=query.get("stopped") in ("true", "1"),
            failed=query.get("failed") in ("true", "1"),
        ),
    )
    return web.json_response(
        {
            "object": "list",
            "data": page.data,
            "first_id": page.data[0]["id"] if page.data else None,
            "last_id": page.last_id,
            "has_more": page.has_more,
        }
    )


async def usage(request: web.Request) -> web.Response:
    """The usage record of every attempt on the conversation's path (its parents' included):
    deployment, status, tokens, cost, time to first token and duration."""
    gateway = request.app[GATEWAY]
    conversation_id, path = await gateway.conversations.named_path(
        request.match_info["id"], request[PRINCIPAL]
    )
    ids = list(dict.fromkeys(e.conversation_id for e in path))
    if conversation_id not in ids:
        ids.append(conversation_id)
    return web.json_response({"object": "list", "data": await attempt_usage(gateway.store, ids)})
