"""An open gateway (no master key) answers only requests meant for this machine.

Running open, every caller is admin: safe only while the only callers are the user's own
programs. A web page can reach the gateway anyway, through the user's browser:

- **DNS rebinding**: a page on `evil.example` has its name re-resolved to 127.0.0.1, and its
  scripts then read the gateway's answers as their own origin's. Its requests still say
  `Host: evil.example`: only a loopback name (`localhost`, `127.0.0.1`, `[::1]`, any port) or a
  name listed in `server.allowed_hosts` is answered.
- **Cross-site requests**: a page's form or fetch that changes something (POST, PUT, PATCH,
  DELETE) carries the page's `Origin`: one whose host is not such a name, and not listed in
  `server.cors_origins`, is refused, whatever `Sec-Fetch-Site` says (older browsers send none).

Probes and scrapers (`/health/*`, `/metrics`) address replicas by IP or service name, and read
nothing secret: never refused. With a master key none of this runs (gateway.app does not install
the middleware): a page cannot present a key it does not know.
"""

from __future__ import annotations

from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.errors import Forbidden
from gateway.http.cors import Cors

LOOPBACK = frozenset({"localhost", "127.0.0.1", "[::1]"})
UNGUARDED = frozenset({"/health/live", "/health/ready", "/metrics"})
CHANGES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
_QUOTED = 100  # characters of a refused Host or Origin quoted back


def host_name(host: str) -> str:
    """`Host` (or an origin's authority) without its port, lower case, without a final dot."""
    if not host.endswith("]"):  # `[::1]` alone has no port; `[::1]:4000` does
        name, colon, _ = host.rpartition(":")
        if colon:
            host = name
    return host.lower().rstrip(".")


class HostGuard:
    def __init__(self, allowed_hosts: Iterable[str], cors: Cors | None) -> None:
        self.names = LOOPBACK | {host_name(h) for h in allowed_hosts}
        self.cors = cors

    @web.middleware
    async def check(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        headers = request.headers
        host = headers.get("Host")
        # A request without Host is no browser's (each sends one).
        if (
            host is not None
            and host not in self.names
            and host_name(host) not in self.names
            and request.path not in UNGUARDED
        ):
            raise Forbidden(
                "This gateway runs without a master key, so it answers only requests"
                " addressed to localhost, 127.0.0.1 or [::1], or to a name listed in"
                f" server.allowed_hosts; this one was addressed to {host[:_QUOTED]!r}.",
                code="host_not_allowed",
            )
        if request.method in CHANGES:
            origin = headers.get("Origin")
            if origin is not None and not self._same_machine(origin):
                raise Forbidden(
                    "This gateway runs without a master key, so it takes no change from"
                    f" another site's page (Origin {origin[:_QUOTED]!r}); list that origin in"
                    " server.cors_origins, or set a master key.",
                    code="cross_site_request",
                )
        return await handler(request)

    def _same_machine(self, origin: str) -> bool:
        """A page served from an allowed name (any scheme and port), or a listed origin."""
        _, sep, authority = origin.partition("://")
        if sep and host_name(authority) in self.names:
            return True
        return self.cors is not None and self.cors.allows(origin)
