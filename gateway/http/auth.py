"""The auth middleware: every route needs a key except an explicit allow-list."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.context import GATEWAY
from gateway.errors import Forbidden
from gateway.metering.keys import Principal

PRINCIPAL = web.RequestKey("principal", Principal)

PUBLIC = frozenset({"/health/live", "/health/ready", "/metrics", "/openapi.json"})
ADMIN_PREFIX = "/v1/gateway/"
UI = "/ui"  # the admin UI's static files: public, its data calls carry the key
# What a browser says of where a request comes from (`Sec-Fetch-Site`). The API answers no
# other site (it sends no CORS headers), so such a request can only be a forged one: a form or a
# no-cors fetch on another page, acting as the admin on a gateway that runs open.
CROSS_SITE = frozenset({"cross-site", "same-site"})


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC or request.path == UI or request.path.startswith(UI + "/"):
        return await handler(request)
    if request.headers.get("Sec-Fetch-Site") in CROSS_SITE:
        raise Forbidden(
            "Requests from another site's page are not accepted.", code="cross_site_request"
        )
    principal = await request.app[GATEWAY].auth.principal(request.headers)
    if request.path.startswith(ADMIN_PREFIX) and not principal.is_admin:
        raise Forbidden("This endpoint needs the master key.")
    request[PRINCIPAL] = principal
    return await handler(request)
