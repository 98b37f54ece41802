"""GET /v1/usage: usage grouped by team, key, user, model, deployment or a metadata tag, per hour
or day. GET /v1/usage/latency: time to first token and duration percentiles by group.
GET /v1/usage/requests: every usage record of a range, for a bill, as CSV or JSON Lines."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any

import orjson
from aiohttp import web

from gateway.context import GATEWAY
from gateway.errors import InvalidRequest, ServiceUnavailable
from gateway.http.auth import PRINCIPAL
from gateway.metering import usage_export
from gateway.metering.reports import (
    GRANULARITY,
    GROUPS,
    TAG_KEY,
    TAG_PREFIX,
    Name,
    Names,
    parse_time,
    to_csv,
)
from gateway.storage.db import ReadTimeout

_MONTH = 31 * 86400
# Percentiles sort every attempt of the range: a long range at scale may take seconds, so
# they are read beside the writer, and stopped past this.
_LATENCY_TIMEOUT_S = 15.0


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
    reports = request.app[GATEWAY].usage
    if query.get("format") == "csv":
        # Every team's report, by something teams share: each team's rows apart, so that
        # each row can name its team.
        if team is None and group_by not in ("team", "key"):
            rows = await reports.report_by_team(
                group_by=group_by, start=start, end=end, granularity=granularity
            )
        else:
            rows = await reports.report(
                group_by=group_by, start=start, end=end, granularity=granularity, team_id=team
            )
        names, every, teams = await _names(request, group_by, team)
        return web.Response(
            text=to_csv(rows, names, every, teams),
            content_type="text/csv",
            headers={"Content-Disposition": _attachment(f"usage-by-{group_by}", start, end, "csv")},
        )
    rows = await reports.report(
        group_by=group_by, start=start, end=end, granularity=granularity, team_id=team
    )
    return json_answer(
        {
            "object": "list",
            "group_by": group_by,
            "granularity": granularity,
            "from": start,
            "to": end,
            "data": rows,
        }
    )


async def latency(request: web.Request) -> web.StreamResponse:
    """Time to first token and duration percentiles of the attempts of a range, by group."""
    group_by = request.query.get("group_by", "model")
    if group_by not in GROUPS:
        raise InvalidRequest(f"'group_by' must be one of {', '.join(GROUPS)}.", param="group_by")
    start, end = _range(request)
    team = _team(request)
    try:
        rows = await request.app[GATEWAY].usage.latency(
            group_by=group_by, start=start, end=end, team_id=team, timeout_s=_LATENCY_TIMEOUT_S
        )
    except ReadTimeout:
        raise ServiceUnavailable(
            f"The percentiles took longer than {_LATENCY_TIMEOUT_S:g} s and were stopped:"
            " ask for a shorter range, or one team's.",
            code="report_timeout",
        ) from None
    return json_answer(
        {"object": "list", "group_by": group_by, "from": start, "to": end, "data": rows}
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
            "Content-Disposition": _attachment("usage-requests", start, end, kind),
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


def json_answer(body: dict[str, Any]) -> web.Response:
    # A report by key over months is some 18,000 rows: the standard library's encoder took
    # ten times as long as orjson's.
    return web.Response(body=orjson.dumps(body), content_type="application/json")


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


async def _names(
    request: web.Request, group_by: str, team: str | None
) -> tuple[Names, Name, dict[str, str]]:
    """For the CSV: each group's name and team (a team's or a key's name, and a key's
    team); the team of every group when the report is of one team; every team's name."""
    keys = request.app[GATEWAY].keys
    teams = {t.id: t.name for t in await keys.teams()}
    every: Name = (None, team, teams.get(team)) if team is not None else (None, None, None)
    if group_by == "team":
        return {i: (name, i, name) for i, name in teams.items()}, every, teams
    if group_by == "key":
        named: Names = {
            k.id: (k.name, k.team_id, teams.get(k.team_id)) for k in await keys.keys(team)
        }
        return named, every, teams
    return {}, every, teams


def _attachment(name: str, start: float, end: float, extension: str) -> str:
    """A download's file name that says its range: `<name>-<from>_<to>.<extension>`, whole
    UTC days as dates (the last day in it, as a date picker says it), else minutes."""
    days = start % 86400 == 0 and end % 86400 == 0
    first = _moment(start, days)
    last = _moment(end - 86400 if days else end, days)
    safe = re.sub(r"[^A-Za-z0-9._-]", "-", name)
    return f'attachment; filename="{safe}-{first}_{last}.{extension}"'


def _moment(seconds: float, day: bool) -> str:
    moment = datetime.fromtimestamp(seconds, UTC)
    return moment.strftime("%Y-%m-%d" if day else "%Y-%m-%dT%H%MZ")
