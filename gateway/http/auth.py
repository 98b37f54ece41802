"""The auth middleware: every route needs a key except an explicit allow-list."""

from __future__ import annotations

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.context import GATEWAY
from gateway.errors import Forbidden, TooManyFailedKeys, Unauthorized
from gateway.http.auth_failures import FAILED_KEYS
from gateway.http.cors import CORS
from gateway.metering.keys import Principal

PRINCIPAL = web.RequestKey("principal", Principal)

PUBLIC = frozenset({"/health/live", "/health/ready", "/metrics", "/openapi.json"})
ADMIN_PREFIX = "/v1/gateway/"
UI = "/ui"  # the admin UI's static files: public, its data calls carry the key
# What a browser says of where a request comes from (`Sec-Fetch-Site`). The API answers no
# other site unless `server.cors_origins` lists it, so another site's request can only be a
# forged one: a form or a no-cors fetch on another page, acting as the admin on a gateway that
# runs open. A listed origin's pages may call the API, never the operator endpoints.
CROSS_SITE = frozenset({"cross-site", "same-site"})


@web.middleware
async def authenticate(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path in PUBLIC or request.path == UI or request.path.startswith(UI + "/"):
        return await handler(request)
    if request.headers.get("Sec-Fetch-Site") in CROSS_SITE and not _allowed_origin(request):
        raise Forbidden(
            "Requests from another site's page are not accepted.", code="cross_site_request"
        )
    principal = await principal_of(request)
    if request.path.startswith(ADMIN_PREFIX) and not principal.is_admin:
        raise Forbidden("This endpoint needs the master key.")
    request[PRINCIPAL] = principal
    return await handler(request)


async def principal_of(request: web.Request) -> Principal:
    """Who the request's key says it is; a wrong key counted against its client's address
    (gateway.http.auth_failures), and past the limit 429 for wrong keys and the master key."""
    try:
        principal = await request.app[GATEWAY].auth.principal(request.headers)
    except Unauthorized as error:
        failed_keys = request.app.get(FAILED_KEYS)
        if failed_keys is not None and error.code == "invalid_api_key":
            blocked = failed_keys.failed(request.remote or "")
            if blocked:
                raise TooManyFailedKeys(blocked) from None
        raise
    if principal.kind == "admin":  # the master key: no answer tells it right while blocked
        failed_keys = request.app.get(FAILED_KEYS)
        if failed_keys is not None and (blocked := failed_keys.blocked_for(request.remote or "")):
            raise TooManyFailedKeys(blocked)
    return principal


def _allowed_origin(request: web.Request) -> bool:
    """A page of an origin `server.cors_origins` lists, calling anything but the operator
    endpoints."""
    cors = request.app.get(CORS)
    return (
        cors is not None
        and cors.allows(request.headers.get("Origin"))
        and not request.path.startswith(ADMIN_PREFIX)
    )
