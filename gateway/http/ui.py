"""The admin web UI: static files from gateway/ui/, served under /ui with no build step.

The page and its assets are public (they hold no data); every data call the page makes carries
the key the operator pasted, as `Authorization: Bearer`, and is checked like any API call. The
headers keep the page from being framed, sniffed or leaking its URL, and the Content-Security-
Policy allows only the gateway's own scripts and styles: no inline script, nothing external.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from gateway.context import GATEWAY
from gateway.errors import NotFound
from gateway.http.auth import PRINCIPAL
from gateway.metering.limits import Limits, period_start
from gateway.storage.db import StoreUnavailable

ASSETS = Path(__file__).resolve().parent.parent / "ui"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        # The images a user sent: in the record as data URLs, or a remote URL loaded only when
        # the operator asks (gateway/ui/attachments.js).
        "img-src 'self' data: https:",
        "connect-src 'self'",
        "font-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'none'",
        "frame-ancestors 'none'",
    )
)

SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
    # File names carry no version, so the browser revalidates each time (a cheap 304).
    "Cache-Control": "no-cache",
}


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    etag: str


_cache: dict[str, Asset] = {}


def _asset(name: str) -> Asset:
    """A file of gateway/ui/ by its bare name (no directories), read once."""
    found = _cache.get(name)
    if found is not None:
        return found
    path = ASSETS / name
    content_type = CONTENT_TYPES.get(path.suffix)
    if "/" in name or name.startswith(".") or content_type is None or not path.is_file():
        raise NotFound(f"No UI file '{name}'.")
    body = path.read_bytes()
    asset = Asset(body, content_type, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    _cache[name] = asset
    return asset


def _respond(request: web.Request, asset: Asset) -> web.Response:
    headers = {**SECURITY_HEADERS, "ETag": asset.etag}
    if request.headers.get("If-None-Match") == asset.etag:
        return web.Response(status=304, headers=headers)
    headers["Content-Type"] = asset.content_type
    return web.Response(body=asset.body, headers=headers)


async def redirect(request: web.Request) -> web.Response:
    """/ui -> /ui/, so the page's relative asset and API paths resolve under any prefix."""
    return web.Response(status=308, headers={**SECURITY_HEADERS, "Location": "ui/"})


async def index(request: web.Request) -> web.Response:
    return _respond(request, _asset("index.html"))


async def asset(request: web.Request) -> web.Response:
    return _respond(request, _asset(request.match_info["file"]))


async def me(request: web.Request) -> web.Response:
    """GET /v1/me: who the presented key acts as, so the UI shows the right sections without
    probing an admin endpoint (and logging a 403). A virtual key also sees its own limits and
    its team's, each with what its budget has spent this period: the figure the limiter starts
    from, read from the usage records (`UsageStore.spent`)."""
    principal = request[PRINCIPAL]
    gateway = request.app[GATEWAY]
    now = time.time()

    async def scope(kind: str, ident: str, stored: dict[str, object] | None) -> dict[str, object]:
        limits = Limits.model_validate(stored or {})
        shown: dict[str, object] = {**limits.model_dump(), "spent_usd": None, "period_start": None}
        if limits.budget is not None:
            shown["period_start"] = since = period_start(limits.budget.period, now)
            try:
                shown["spent_usd"] = await gateway.usage.spent(kind, ident, since)
            except StoreUnavailable:
                pass  # the store is away: the figure is unknown, the rest still holds
        return shown

    budget = None
    names: dict[str, str | None] = {"team_name": None, "key_name": None}
    if principal.kind == "key" and principal.key_id and principal.team_id:
        budget = {
            "key": await scope("key", principal.key_id, principal.key_limits),
            "team": await scope("team", principal.team_id, principal.team_limits),
        }
        try:  # what the page calls them; ids when the store is away
            team = await gateway.keys.team(principal.team_id)
            key = await gateway.keys.key(principal.key_id)
            names = {
                "team_name": team.name if team else None,
                "key_name": key.name if key else None,
            }
        except StoreUnavailable:
            pass
    return web.json_response(
        {
            "object": "principal",
            "kind": principal.kind,  # admin | key | open (no master key configured)
            "is_admin": principal.is_admin,
            "team_id": principal.team_id,
            "key_id": principal.key_id,
            **names,
            "user": principal.user,
            "models": sorted(principal.models) if principal.models is not None else None,
            "open": gateway.auth.open,
            "budget": budget,
        }
    )
