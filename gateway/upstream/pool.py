"""A lean, pooled HTTP/1.1 client for the gateway's upstream POSTs, on asyncio protocols.

aiohttp's client request path cost a large share of the gateway's CPU per request (request and
response objects, multidicts, a StreamReader, timers, tracing hooks). The gateway needs far
less: POST a prebuilt body to a URL from its config, read the status and the few headers that
frame the body, and hand the body out piece by piece as it arrives. This module does only that:

- `Endpoint`: a URL and its headers, encoded once per deployment; a request then costs the
  length of its body and one write. Its proxy (gateway.upstream.proxy: the deployment's, else
  the environment's) and its TLS trust (gateway.upstream.tls) are decided then too, once.
- `UpstreamPool`: keep-alive connections per (scheme, host, port, route): the route is the
  proxy and the TLS context, so no connection serves two settings. A connection goes back only
  after a response that ended cleanly without `Connection: close`; one found closed by the
  server when reused is replaced once by a fresh connection; idle ones expire.
- `Response` (from gateway.upstream.connection, which holds one connection and its response's
  framing): the status, the headers (parsed only when asked for), and `read()`, which returns
  whatever body has arrived (gzip and deflate undone) and pauses the socket while too much
  waits unread.

Faults come out as the gateway's own errors, the same ones whatever the provider: connecting
fails -> `UpstreamConnectError` (also a connection closed before a response began: the request
was not answered), the connect timeout -> `UpstreamTimeout(phase="connect")`, a connection
broken mid-body or a malformed response -> `UpstreamProtocolError`. Only connecting is timed
here: the pipeline owns the first-token, idle and total timeouts and cancels the awaiting task.
A cancelled request drops its connection; a cancelled read leaves its response to be read on
(a drain) or closed, and a connection is pooled only after a clean end: none is reused half-read.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import time
from collections.abc import Mapping
from contextvars import ContextVar
from urllib.parse import quote, unquote, urlsplit

from gateway import __version__, metrics
from gateway.errors import UpstreamConnectError, UpstreamProtocolError, UpstreamTimeout
from gateway.upstream import proxy as proxies
from gateway.upstream import tls
from gateway.upstream.connection import HIGH_WATER, Connection, PoolKey, Response, StaleConnection

__all__ = [
    "HIGH_WATER",
    "TRACE_HEADERS",
    "USER_AGENT",
    "Endpoint",
    "Response",
    "UpstreamPool",
]

USER_AGENT = f"llm-gateway/{__version__}"
IDLE_S = 30.0

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
# Framing is the client's: a caller's value for these would contradict the bytes it sends.
_OWN_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})

# Header lines (`b"name: value\r\n"` each) that the requests of the current task carry besides
# their endpoint's: the `traceparent` of the attempt under way (gateway.tracing). None, the
# default and the case without tracing: nothing is added.
TRACE_HEADERS: ContextVar[bytes | None] = ContextVar("trace_headers", default=None)


class Endpoint:
    """One upstream URL and its request headers, encoded once.

    Headers merge case-insensitively, later ones winning: the defaults (`Host`, `User-Agent`,
    `Accept`, `Accept-Encoding: gzip, deflate`), then `headers` in order. `Content-Length`,
    `Transfer-Encoding` and `Connection` are always the client's own.

    `proxy`: a proxy URL, or `none` (directly); None: the environment's (HTTPS_PROXY,
    HTTP_PROXY, NO_PROXY), read now. `ssl_context`: the TLS context of an https URL (None: the
    pool's default). A plain http URL through a proxy is sent to the proxy in absolute form.
    `method`: POST, unless an API's reads and deletes (`GET`, `DELETE`, with an empty body).
    """

    __slots__ = (
        "connect_s",
        "headers",
        "host",
        "key",
        "port",
        "prefix",
        "proxy",
        "ssl",
        "tls",
        "url",
    )

    def __init__(
        self,
        url: str,
        headers: Mapping[str, str],
        connect_s: float = 10.0,
        *,
        proxy: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
        method: str = "POST",
    ) -> None:
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url
        self.tls = scheme == "https"
        self.host = parts.hostname
        default_port = 443 if self.tls else 80
        self.port = parts.port or default_port  # .port raises ValueError for a bad port
        self.proxy = proxies.resolve(scheme, self.host, self.port, proxy)
        self.ssl = ssl_context if self.tls else None
        # The route: "" for a direct connection with the pool's TLS default (the usual case).
        route = self.proxy.key if self.proxy is not None else ""
        if self.ssl is not None:
            route += f"|tls:{id(self.ssl)}"  # (contexts are made once, kept: ids stay unique)
        self.key: PoolKey = (scheme, self.host, self.port, route)
        self.connect_s = connect_s
        authority = f"[{self.host}]" if ":" in self.host else self.host
        if self.port != default_port:
            authority += f":{self.port}"
        merged: dict[str, tuple[str, str]] = {}
        defaults = {
            "Host": authority,
            "User-Agent": USER_AGENT,
            "Accept": "*/*",
            "Accept-Encoding": "gzip, deflate",
        }
        if parts.username is not None:
            userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            basic = base64.b64encode(userinfo.encode()).decode()
            defaults["Authorization"] = f"Basic {basic}"
        absolute = self.proxy is not None and not self.tls
        if absolute and self.proxy is not None and self.proxy.authorization is not None:
            defaults["Proxy-Authorization"] = self.proxy.authorization
        for name, value in [*defaults.items(), *headers.items()]:
            if not _TOKEN.fullmatch(name) or any(c in value for c in "\r\n\0"):
                raise ValueError(f"invalid header for {url}: {name!r}")
            if name.lower() not in _OWN_HEADERS:
                merged[name.lower()] = (name, value)
        # What the caller may see of them (credentials() reads the secrets from these).
        self.headers = dict(merged.values())
        target = quote(parts.path or "/", safe="/%:@!$&'()*+,;=~")
        if parts.query:
            target += "?" + quote(parts.query, safe="/?%:@!$&'()*+,;=~")
        if absolute:  # to a proxy: the whole URL (its credentials left out)
            target = f"{scheme}://{authority}{target}"
        lines = [f"{method} {target} HTTP/1.1", *(f"{n}: {v}" for n, v in merged.values())]
        lines += ["Connection: keep-alive", "Content-Length: "]
        self.prefix = "\r\n".join(lines).encode("utf-8")


class UpstreamPool:
    """Keep-alive connections per (scheme, host, port, route), shared by every deployment.

    `ssl_context` replaces the default verifying context, of endpoints without one of their own
    (tests trust their own CA with it). Else the default trusts `SSL_CERT_FILE` and
    `SSL_CERT_DIR` when the environment names them, read here, at start: a path that does not
    exist raises `TrustError` naming it (a config load has checked them already).
    """

    def __init__(self, *, idle_s: float = IDLE_S, ssl_context: ssl.SSLContext | None = None):
        self._idle_s = idle_s
        self._ssl = ssl_context
        # Checked now; the context itself is made at the first https connection.
        self._trust = tls.environment_trust() if ssl_context is None else (None, None)
        # Idle connections per key, oldest first: reuse takes the newest, expiry the oldest.
        self._idle: dict[PoolKey, list[Connection]] = {}
        self._all: set[Connection] = set()
        self._sweep: asyncio.TimerHandle | None = None
        self._closed = False

    @property
    def idle_connections(self) -> int:
        return sum(len(conns) for conns in self._idle.values())

    @property
    def open_connections(self) -> int:
        return len(self._all)

    async def post(self, endpoint: Endpoint, body: bytes) -> Response:
        """Send `body` and wait for the response's status and headers (any status)."""
        trace = TRACE_HEADERS.get()
        conn = self._take(endpoint.key)
        if conn is not None:
            try:
                return await conn.exchange(endpoint.prefix, body, trace)
            except StaleConnection:
                pass  # closed by the server while idle: the request reached nobody; once more
        conn = await self._connect(endpoint)
        return await conn.exchange(endpoint.prefix, body, trace)

    async def close(self) -> None:
        """Close every connection; requests still reading fail with `UpstreamProtocolError`."""
        self._closed = True
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        self._idle.clear()
        for conn in list(self._all):
            conn.in_pool = False
            conn.fail(UpstreamProtocolError("the gateway closed its upstream connections"))
        await asyncio.sleep(0)  # the transports' connection_lost callbacks run

    # -- the pool ----------------------------------------------------------------------------

    def _take(self, key: PoolKey) -> Connection | None:
        conns = self._idle.get(key)
        if not conns:
            return None
        conn = conns.pop()
        conn.in_pool = False
        if time.monotonic() - conn.idle_since < self._idle_s:
            conn.reused = True
            return conn
        for old in [conn, *conns]:  # the newest expired: so did every older one
            old.in_pool = False
            old.abort()
        conns.clear()
        return None

    # What its connections tell it (gateway.upstream.connection.Pool): opened, release, discard.

    def opened(self, conn: Connection) -> None:
        self._all.add(conn)
        scheme, host, port, _ = conn.key
        metrics.UPSTREAM_CONNECTIONS.labels(f"{scheme}://{host}:{port}").inc()

    def release(self, conn: Connection) -> None:
        if self._closed:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        conn.in_pool = True
        conns = self._idle.get(conn.key)
        if conns is None:
            self._idle[conn.key] = [conn]
        else:
            conns.append(conn)
        if self._sweep is None:
            self._sweep = conn.loop.call_later(self._idle_s, self._expire, conn.loop)

    def discard(self, conn: Connection, *, lost: bool = False) -> None:
        if lost:
            self._all.discard(conn)
        if conn.in_pool:
            conn.in_pool = False
            conns = self._idle.get(conn.key)
            if conns is not None and conn in conns:
                conns.remove(conn)

    def _expire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._sweep = None
        now = time.monotonic()
        next_at: float | None = None
        for key, conns in list(self._idle.items()):
            while conns and now - conns[0].idle_since >= self._idle_s:
                old = conns.pop(0)
                old.in_pool = False
                old.abort()
            if conns:
                due = conns[0].idle_since + self._idle_s
                next_at = due if next_at is None else min(next_at, due)
            else:
                del self._idle[key]
        if next_at is not None and not self._closed:
            self._sweep = loop.call_later(max(0.0, next_at - now) + 0.01, self._expire, loop)

    def _context(self, endpoint: Endpoint) -> ssl.SSLContext:
        if endpoint.ssl is not None:
            return endpoint.ssl
        if self._ssl is None:
            self._ssl = tls.context(*self._trust)
        return self._ssl

    async def _connect(self, endpoint: Endpoint) -> Connection:
        if self._closed:
            raise UpstreamConnectError("the gateway is closing its upstream connections")
        loop = asyncio.get_running_loop()
        conn = Connection(self, endpoint.key, loop)
        context = self._context(endpoint) if endpoint.tls else None
        proxy = endpoint.proxy
        try:
            try:
                # The TCP connect (and the proxy's tunnel) and the TLS handshake, all within
                # connect_s.
                async with asyncio.timeout(endpoint.connect_s):
                    if proxy is None:
                        await loop.create_connection(
                            lambda: conn,
                            endpoint.host,
                            endpoint.port,
                            ssl=context,
                            server_hostname=endpoint.host if context is not None else None,
                        )
                    elif context is None:  # http through the proxy: requests in absolute form
                        try:
                            await loop.create_connection(lambda: conn, proxy.host, proxy.port)
                        except OSError as exc:
                            raise UpstreamConnectError(
                                f"cannot reach the proxy {proxy.display}: {exc}"
                            ) from None
                    else:
                        await proxies.open_tunnel(
                            loop, conn, proxy, endpoint.host, endpoint.port, context, USER_AGENT
                        )
            except TimeoutError as exc:
                if exc.errno is None:  # ours, not the kernel's ETIMEDOUT
                    via = f" through the proxy {proxy.display}" if proxy is not None else ""
                    raise UpstreamTimeout(
                        f"connecting to the upstream{via} timed out", phase="connect"
                    ) from None
                raise UpstreamConnectError(f"cannot reach the upstream: {exc}") from None
            except ssl.SSLCertVerificationError as exc:
                raise UpstreamConnectError(
                    f"cannot reach the upstream {endpoint.host}: its TLS certificate is not"
                    f" trusted ({exc.verify_message}; {exc.reason}); trust the CA that signed"
                    " it with the deployment's tls.ca_bundle or SSL_CERT_FILE"
                ) from None
            except OSError as exc:  # refused, DNS, TLS (ssl.SSLError is an OSError)
                raise UpstreamConnectError(f"cannot reach the upstream: {exc}") from None
        except BaseException:
            conn.abort()  # cancelled, or timed out just as the connection was made
            raise
        if self._closed:
            conn.abort()
            raise UpstreamConnectError("the gateway is closing its upstream connections")
        return conn
