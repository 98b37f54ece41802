"""Cross-origin access for browser apps (`server.cors_origins`).

A page on another origin (a Vite dev server on :5173, an app's own domain) may call the API
when its origin is listed: its preflight `OPTIONS` is answered here, before any key is asked
for (a browser never sends credentials with one), and every answer to it, errors and streams
included, carries `Access-Control-Allow-Origin`. Nothing of this runs when the setting is
unset: no CORS header is ever sent, and the API stays closed to other sites' pages.

Credentials stay in the `Authorization` / `x-api-key` header the page's code sets; no cookie is
ever one, so `Access-Control-Allow-Credentials` is never sent. The operator endpoints
(`/v1/gateway/...`) and the admin UI stay same-origin whatever the setting
(gateway.http.auth refuses other sites' requests to them).
"""

from __future__ import annotations

import re

from aiohttp import web
from aiohttp.typedefs import Handler

METHODS = "GET, POST, PUT, PATCH, DELETE, OPTIONS"
# What a page may read of an answer beyond the CORS-safelisted headers: the gateway's own
# (`*` covers the rest in browsers that take it; the names, those that do not).
EXPOSED = (
    "*, X-Request-Id, X-Conversation-Id, X-Gateway-Turn-Id, X-Gateway-Deployment,"
    " X-Gateway-Attempts, X-Gateway-History-Repaired, X-Gateway-Dropped-Params,"
    " X-Gateway-Cost-USD, Retry-After"
)
MAX_AGE_S = "600"
_HEADER_LIST = re.compile(r"^[A-Za-z0-9!#$%&'*+\-.^_`|~]+(\s*,\s*[A-Za-z0-9!#$%&'*+\-.^_`|~]+)*$")
# The headers a preflight is told are allowed when it names none (or an unreadable list).
_DEFAULT_HEADERS = (
    "Authorization, Content-Type, x-api-key, anthropic-version, anthropic-beta, openai-beta,"
    " X-Conversation-Id, X-Request-Id"
)


class Cors:
    """The configured origins: exact `scheme://host[:port]` strings, or every origin (`*`)."""

    def __init__(self, origins: list[str] | str) -> None:
        self.any = origins == "*" or "*" in origins
        self.origins = frozenset(() if self.any else origins)

    def allows(self, origin: str | None) -> bool:
        return origin is not None and (self.any or origin in self.origins)

    def allow_origin(self, origin: str) -> str:
        return "*" if self.any else origin

    @web.middleware
    async def preflight(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A preflight from an allowed origin, answered without a key; anything else goes on
        (a disallowed origin's preflight gets what any keyless request gets)."""
        origin = request.headers.get("Origin")
        if (
            request.method != "OPTIONS"
            or "Access-Control-Request-Method" not in request.headers
            or not self.allows(origin)
        ):
            return await handler(request)
        assert origin is not None
        asked = request.headers.get("Access-Control-Request-Headers", "").strip()
        allowed = asked if _HEADER_LIST.match(asked) else _DEFAULT_HEADERS
        headers = {
            "Access-Control-Allow-Origin": self.allow_origin(origin),
            "Access-Control-Allow-Methods": METHODS,
            "Access-Control-Allow-Headers": allowed,
            "Access-Control-Max-Age": MAX_AGE_S,
            "Vary": "Origin, Access-Control-Request-Headers",
        }
        return web.Response(status=204, headers=headers)

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """on_response_prepare: an answer to an allowed origin says so, a stream's included
        (its headers go out before its first byte)."""
        origin = request.headers.get("Origin")
        if not self.allows(origin) or "Access-Control-Allow-Origin" in response.headers:
            return
        assert origin is not None
        response.headers["Access-Control-Allow-Origin"] = self.allow_origin(origin)
        response.headers["Access-Control-Expose-Headers"] = EXPOSED
        if not self.any:
            response.headers.add("Vary", "Origin")


CORS = web.AppKey("cors", Cors)
