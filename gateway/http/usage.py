"""GET /v1/usage: usage grouped by team, key, user, model or deployment, per hour or day."""

from __future__ import annotations

import time

from aiohttp import web

from gateway.context import GATEWAY
from gateway.errors import InvalidRequest
from gateway.http.auth import PRINCIPAL
from gateway.metering.reports import GRANULARITY, GROUPS, parse_time, to_csv

_MONTH = 31 * 86400


async def usage(request: web.Request) -> web.StreamResponse:
    query = request.query
    group_by = query.get("group_by", "team")
    if group_by not in GROUPS:
        raise InvalidRequest(f"'group_by' must be one of {', '.join(GROUPS)}.", param="group_by")
    granularity = query.get("granularity", "day")
    if granularity not in GRANULARITY:
        raise InvalidRequest("'granularity' must be hour or day.", param="granularity")
    now = time.time()
    try:
        end = parse_time(query.get("to"), now)
        start = parse_time(query.get("from"), end - _MONTH)
    except ValueError:
        raise InvalidRequest(
            "'from' and 'to' take Unix seconds or ISO 8601 dates.", param="from"
        ) from None
    principal = request[PRINCIPAL]
    # A team key reads its own team's usage only; the admin reads all, or one team.
    team = principal.team_id if not principal.is_admin else query.get("team_id")
    rows = await request.app[GATEWAY].usage.report(
        group_by=group_by, start=start, end=end, granularity=granularity, team_id=team
    )
    if query.get("format") == "csv":
        return web.Response(text=to_csv(rows), content_type="text/csv")
    return web.json_response(
        {
            "object": "list",
            "group_by": group_by,
            "granularity": granularity,
            "from": start,
            "to": end,
            "data": rows,
        }
    )
