"""GET /v1/conversations (the list the admin UI browses) and GET /v1/conversations/{id}/usage.

`/v1/gateway/*` is the master key's alone, so the list lives beside the Conversations API: a
team key lists only its own team's conversations, the master key all of them (or one team's
with `team_id`).
"""

from __future__ import annotations

import time

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.listing import (
    MAX_LIMIT,
    ORDERS,
    RANGES,
    SORTS,
    STATUSES,
    BadCursor,
    Cursor,
    ListQuery,
    Page,
    attempt_usage,
    list_conversations,
    parse_when,
)
from gateway.errors import InvalidRequest, NotFound, ServiceUnavailable
from gateway.http.auth import PRINCIPAL
from gateway.storage.db import ReadTimeout


def _time(request: web.Request, name: str) -> float | None:
    try:
        return parse_when(request.query.get(name))
    except ValueError:
        raise InvalidRequest(
            f"'{name}' takes Unix seconds or an ISO 8601 date or time.", param=name
        ) from None


def _ranges(request: web.Request) -> tuple[tuple[str, float], ...]:
    bounds = []
    for name in RANGES:
        value = request.query.get(name)
        if value is None or value == "":
            continue
        try:
            bound = float(value)
        except ValueError:
            bound = -1.0
        if not 0 <= bound < float("inf"):  # NaN and infinities too
            raise InvalidRequest(f"'{name}' must be a number, 0 or more.", param=name)
        bounds.append((name, bound))
    return tuple(bounds)


def _metadata(request: web.Request) -> tuple[tuple[str, str], ...]:
    pairs = []
    for name, value in request.query.items():
        if name.startswith("metadata."):
            key = name[len("metadata.") :]
            if not key:
                raise InvalidRequest("'metadata.' needs a key: metadata.<key>=<value>.", param=name)
            pairs.append((key, value))
    return tuple(pairs)


def _choice(request: web.Request, name: str, choices: tuple[str, ...], default: str) -> str:
    value = request.query.get(name) or default
    if value not in choices:
        raise InvalidRequest(f"'{name}' must be one of {', '.join(choices)}.", param=name)
    return value


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

    lookup = query.get("id") or None
    given = query.get("after") or None
    try:
        cursor = Cursor.decode(given) if given is not None else None
    except BadCursor as exc:
        raise InvalidRequest(str(exc), param="after") from None
    # A cursor from an earlier page, or the id of the row to start after.
    after: str | Cursor | None = cursor if cursor is not None else await named("after")
    since, until = _time(request, "since"), _time(request, "until")
    if since is not None and until is not None and until < since:
        raise InvalidRequest(
            "'until' is before 'since': no conversation can be in that range.", param="until"
        )
    id_tail = (query.get("id_tail") or "").strip() or None
    if id_tail is not None and len(id_tail.rpartition("…")[2]) < 4:
        raise InvalidRequest(
            "'id_tail' takes the end of an id, 4 characters or more (`conv_…3f9a0c1d`).",
            param="id_tail",
        )
    list_query = ListQuery(
        team_id=team,
        key_id=query.get("key_id") or None,
        model=query.get("model") or None,
        status=status,
        since=since,
        until=until,
        q=(query.get("q") or "").strip() or None,
        parent_id=await named("parent_id"),
        id=await named("id"),
        lookup=lookup,
        user=(query.get("user") or "").strip() or None,
        id_tail=id_tail,
        metadata=_metadata(request),
        ranges=_ranges(request),
        sort=_choice(request, "sort", tuple(SORTS), "created"),
        order=_choice(request, "order", ORDERS, "desc"),
        limit=limit,
        after=after,
        with_usage=query.get("include") == "usage",
        stopped=query.get("stopped") in ("true", "1"),
        failed=query.get("failed") in ("true", "1"),
    )
    try:
        page = await _bounded(request, list_query)
    except BadCursor as exc:
        raise InvalidRequest(str(exc), param="after") from None
    return web.json_response(
        {
            "object": "list",
            "data": page.data,
            "first_id": page.data[0]["id"] if page.data else None,
            "last_id": page.last_id,
            "has_more": page.has_more,
            "cursor": page.cursor,
        }
    )


async def _bounded(request: web.Request, query: ListQuery) -> Page:
    """The page, within `store.search_timeout_s`: a search waits for the key's earlier ones
    (a key searches one at a time), and that wait counts. Past it, 503 `search_timeout`."""
    gateway = request.app[GATEWAY]
    timeout_s = gateway.config.store.search_timeout_s
    try:
        if query.q is None:
            return await list_conversations(gateway.store, query, timeout_s)
        principal = request[PRINCIPAL]
        lane = principal.key_id or principal.team_id or principal.kind
        deadline = time.monotonic() + timeout_s
        async with gateway.search_lanes.hold(lane, 1, timeout_s):
            left = deadline - time.monotonic()
            return await list_conversations(gateway.store, query, left)
    except (ReadTimeout, TimeoutError):
        raise ServiceUnavailable(
            f"The search took longer than {timeout_s:g} s (store.search_timeout_s) and was"
            " stopped: narrow it (fewer or rarer words, a time range with since and until) or"
            " try again later.",
            code="search_timeout",
        ) from None


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
