"""Forward HTTP proxies for upstream connections: which one (if any) serves a URL, and the
CONNECT tunnel through it.

Which proxy is decided once per `Endpoint`, when it is built (at start), never per request:

- a deployment's `proxy` setting: a proxy URL, or `none` (directly, whatever the environment
  says);
- else the environment, as curl, requests and httpx read it: `https_proxy` for https URLs,
  `http_proxy` for http ones (lower-case first, then upper-case; `HTTP_PROXY` is ignored when
  `REQUEST_METHOD` is set, the CGI "httpoxy" rule), unless `no_proxy` matches the host.

`no_proxy` is a comma-separated list: `*` (every host), a host name (itself and its subdomains;
a leading `.` or `*.` changes nothing), an IP address or CIDR range (`10.0.0.0/8`), each with an
optional `:port`.

Through a proxy, an https upstream is reached by `CONNECT host:port` and TLS to the upstream
inside the tunnel (`open_tunnel`); a plain http one by sending the proxy the request itself with
its absolute URL as the target (`Endpoint` writes that form). Only `http://` proxies are spoken
to. Credentials in the proxy URL (`http://user:password@host:port`) become a
`Proxy-Authorization: Basic` header, and never appear in a message: a proxy is named by
`Proxy.display`, its URL without them.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import ipaddress
import os
import re
import ssl
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit

from gateway.errors import UpstreamConnectError

# A deployment's `proxy` values that mean "directly, whatever the environment says".
DIRECT = frozenset({"", "none", "direct", "off"})

_MAX_HEAD = 64 * 1024
_STATUS_LINE = re.compile(rb"HTTP/1\.[01] ([0-9]{3})([^\r\n]*)")


class Proxy:
    """An http:// forward proxy: where it is and the credentials it is sent."""

    __slots__ = ("authorization", "display", "host", "key", "port")

    def __init__(self, url: str, where: str = "") -> None:
        """ValueError for a URL that is not an http:// proxy's, its message prefixed with
        `where` (the variable read: `HTTPS_PROXY`) and never holding the URL's credentials."""
        prefix = f"{where}: " if where else ""
        if "://" not in url:  # `host:port`, as curl and requests take it
            url = "http://" + url
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError:
            raise ValueError(
                f"{prefix}not a proxy URL (http://[user:password@]host:port)"
            ) from None
        scheme = parts.scheme.lower()
        if scheme != "http":
            raise ValueError(
                f"{prefix}a {scheme}:// proxy is not supported; the gateway speaks to"
                " http:// proxies (https upstreams go through them in a CONNECT tunnel)"
            )
        if not parts.hostname:
            raise ValueError(f"{prefix}the proxy URL has no host (http://host:port)")
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ValueError(f"{prefix}a proxy URL is http://[user:password@]host:port only")
        self.host = parts.hostname
        self.port = port or 80
        authority = f"[{self.host}]" if ":" in self.host else self.host
        self.display = f"http://{authority}:{self.port}"
        self.authorization: str | None = None
        self.key = self.display
        if parts.username is not None:
            userinfo = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
            self.authorization = "Basic " + base64.b64encode(userinfo.encode()).decode()
            # Connections made with other credentials are not shared (the key never holds
            # them: it names the pool's metrics and messages' origins).
            self.key += "#" + hashlib.sha256(userinfo.encode()).hexdigest()[:16]

    def __repr__(self) -> str:
        return f"Proxy({self.display})"


def resolve(
    scheme: str,
    host: str,
    port: int,
    setting: str | None,
    environ: Mapping[str, str] | None = None,
) -> Proxy | None:
    """The proxy for `scheme://host:port`: the deployment's `setting` (None: the environment's;
    a value in `DIRECT`: none), else the one `environ` (default: os.environ) names for it."""
    if setting is not None:
        return None if setting.strip().lower() in DIRECT else Proxy(setting, "proxy")
    env = os.environ if environ is None else environ
    name = f"{scheme}_proxy"
    value = env.get(name)
    if value is None and (scheme != "http" or "REQUEST_METHOD" not in env):
        name = name.upper()
        value = env.get(name)
    if not value or not value.strip():
        return None
    no_proxy = env.get("no_proxy")
    if no_proxy is None:
        no_proxy = env.get("NO_PROXY", "")
    if bypassed(host, port, no_proxy):
        return None
    return Proxy(value.strip(), name)


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether `no_proxy` names `host` (and `port`, where an entry gives one)."""
    host = host.lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        address = None
    for entry in no_proxy.replace(" ", ",").split(","):
        entry = entry.strip().lower()
        if not entry:
            continue
        if entry == "*":
            return True
        # An optional :port (an IPv6 address is bracketed, or has no port).
        if entry.startswith("["):
            name, _, rest = entry[1:].partition("]")
            wanted = rest[1:] if rest.startswith(":") else ""
        elif entry.count(":") == 1:
            name, _, wanted = entry.partition(":")
        else:
            name, wanted = entry, ""
        if wanted and wanted != str(port):
            continue
        if address is not None:
            try:
                if address in ipaddress.ip_network(name, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name = name.removeprefix("*").lstrip(".").rstrip(".")
        if name and (host == name or host.endswith("." + name)):
            return True
    return False


class _Tunnel(asyncio.Protocol):
    """The proxy's answer to CONNECT: its head, whole, on `answer`."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.answer: asyncio.Future[bytes] = loop.create_future()
        self._buf = b""

    def data_received(self, data: bytes) -> None:
        if self.answer.done():
            return  # nothing may come before the TLS handshake; the handshake would fail
        self._buf += data
        end = self._buf.find(b"\r\n\r\n")
        if end >= 0:
            self.answer.set_result(self._buf[:end])
        elif len(self._buf) > _MAX_HEAD:
            self.answer.set_exception(UpstreamConnectError("the proxy's answer is too large"))

    def eof_received(self) -> bool:
        self._lost(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost(exc)

    def _lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            detail = f": {exc}" if exc else ""
            self.answer.set_exception(
                UpstreamConnectError("the proxy closed the connection before answering" + detail)
            )


async def open_tunnel(
    loop: asyncio.AbstractEventLoop,
    protocol: asyncio.Protocol,
    proxy: Proxy,
    host: str,
    port: int,
    context: ssl.SSLContext,
    user_agent: str,
) -> None:
    """Connect to `proxy`, ask it for a tunnel to `host:port`, and hand `protocol` the TLS
    connection to the upstream through it (its `connection_made` is called, as
    `create_connection` would). Faults of the proxy raise `UpstreamConnectError`; TLS faults
    raise as `create_connection` raises them (ssl.SSLError)."""
    try:
        transport, tunnel = await loop.create_connection(
            lambda: _Tunnel(loop), proxy.host, proxy.port
        )
    except OSError as exc:
        raise UpstreamConnectError(f"cannot reach the proxy {proxy.display}: {exc}") from None
    try:
        authority = f"[{host}]" if ":" in host else host
        lines = [
            f"CONNECT {authority}:{port} HTTP/1.1",
            f"Host: {authority}:{port}",
            f"User-Agent: {user_agent}",
        ]
        if proxy.authorization is not None:
            lines.append(f"Proxy-Authorization: {proxy.authorization}")
        transport.write(("\r\n".join(lines) + "\r\n\r\n").encode())
        try:
            head = await tunnel.answer
        except UpstreamConnectError as exc:
            raise UpstreamConnectError(f"{exc} (proxy {proxy.display})") from None
        status = _STATUS_LINE.match(head)
        if status is None:
            raise UpstreamConnectError(
                f"the proxy {proxy.display} answered CONNECT with a malformed status line"
            )
        code = int(status[1])
        if not 200 <= code < 300:
            reason = status[2].decode("latin-1").strip()[:100]
            hint = " (its credentials are missing or wrong)" if code == 407 else ""
            raise UpstreamConnectError(
                f"the proxy {proxy.display} refused to tunnel to {authority}:{port}:"
                f" HTTP {code} {reason}{hint}".rstrip()
            )
        tls = await loop.start_tls(transport, protocol, context, server_hostname=host)
    except BaseException:
        transport.abort()
        raise
    if tls is None:  # the loop closed the connection (as it does when it is closing)
        raise UpstreamConnectError(f"the TLS connection through the proxy {proxy.display} closed")
    protocol.connection_made(tls)
