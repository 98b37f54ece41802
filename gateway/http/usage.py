"""GET /v1/usage: usage grouped by team, key, user, model, deployment or a metadata tag, per hour
or day. GET /v1/usage/requests: every usage record of a range, for a bill, as CSV or JSON Lines."""

from __future__ import annotations

import time

from aiohttp import web

from gateway.context import GATEWAY
from gateway.errors import InvalidRequest
from gateway.http.auth import PRINCIPAL
from gateway.metering import usage_export
from gateway.metering.reports import GRANULARITY, GROUPS, TAG_KEY, TAG_PREFIX, parse_time, to_csv

_MONTH = 31 * 86400


async def usage(request: web.Request) -> web.StreamResponse:
    query = request.query
    group_by = query.get("group_by", "team")
    tag = group_by.startswith(TAG_PREFIX) and TAG_KEY.match(group_by[len(TAG_PREFIX) :])
    if group_by not in GROUPS and not tag:
        raise InvalidRequest(
            f"'group_by' must be one of {', '.join(GROUPS)}, or tag:<metadata key> (letters,"
            " digits, '_', '.', ':', '-'; at most 64).",
            param="group_by",
        )
    granularity = query.get("granularity", "day")
    if granularity not in GRANULARITY:
        raise InvalidRequest("'granularity' must be hour or day.", param="granularity")
    start, end = _range(request)
    team = _team(request)
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


async def requests(request: web.Request) -> web.StreamResponse:
    """Every usage record of the range, oldest first, streamed a page at a time."""
    kind = request.query.get("format", "csv")
    if kind not in ("csv", "jsonl"):
        raise InvalidRequest("'format' must be csv or jsonl.", param="format")
    start, end = _range(request)
    team = _team(request)
    store = request.app[GATEWAY].store
    pages = usage_export.records(store, start, end, team)
    # The first page is read before the answer starts: a store that cannot answer is a 503
    # the client can tell from an export cut short.
    first = await anext(pages, None)
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/csv; charset=utf-8" if kind == "csv" else "application/jsonl",
            "Content-Disposition": f'attachment; filename="usage.{kind}"',
        }
    )
    await response.prepare(request)
    render = usage_export.csv_rows if kind == "csv" else usage_export.jsonl
    if kind == "csv":
        await response.write(usage_export.csv_header())
    if first is not None:
        await response.write(render(first))
        async for page in pages:
            await response.write(render(page))
    await response.write_eof()
    return response


def _range(request: web.Request) -> tuple[float, float]:
    query = request.query
    try:
        end = parse_time(query.get("to"), time.time())
        start = parse_time(query.get("from"), end - _MONTH)
    except ValueError:
        raise InvalidRequest(
            "'from' and 'to' take Unix seconds or ISO 8601 dates.", param="from"
        ) from None
    return start, end


def _team(request: web.Request) -> str | None:
    """A team key reads its own team's usage only; the admin reads all, or one team."""
    principal = request[PRINCIPAL]
    return principal.team_id if not principal.is_admin else request.query.get("team_id")
