"""GET /v1/requests: the request log of API calls that are no conversation turn
(gateway.metering.request_log). A team key reads its own team's calls only; the master key all,
or one team's."""

from __future__ import annotations

import time

from aiohttp import web

from gateway.context import GATEWAY
from gateway.errors import InvalidRequest
from gateway.http.auth import PRINCIPAL
from gateway.metering.reports import parse_time
from gateway.metering.request_log import STATUSES, CallFilter, cursor_of, list_calls, parse_cursor


async def list_(request: web.Request) -> web.Response:
    query = request.query
    principal = request[PRINCIPAL]
    status = query.get("status")
    if status is not None and status not in STATUSES:
        raise InvalidRequest(f"'status' must be one of {', '.join(STATUSES)}.", param="status")
    try:
        limit = int(query.get("limit", "50"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise InvalidRequest("'limit' must be a number from 1 to 100.", param="limit")
    now = time.time()
    try:
        since = parse_time(query["since"], now) if "since" in query else None
        until = parse_time(query["until"], now) if "until" in query else None
    except ValueError:
        raise InvalidRequest(
            "'since' and 'until' take Unix seconds or ISO 8601 dates.", param="since"
        ) from None
    after = parse_cursor(query["after"]) if "after" in query else None
    filters = CallFilter(
        team_id=principal.team_id if not principal.is_admin else query.get("team_id"),
        key_id=query.get("key_id"),
        endpoint=query.get("endpoint"),
        status=status,
        model=query.get("model"),
        id=query.get("id"),
        since=since,
        until=until,
        limit=limit,
        after=after,
    )
    rows, more = await list_calls(request.app[GATEWAY].store, filters)
    cursor = cursor_of(rows[-1]) if rows and more else None
    for row in rows:
        del row["row_id"]
    return web.json_response({"object": "list", "data": rows, "has_more": more, "cursor": cursor})
