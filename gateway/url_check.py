"""What a URL in the config must hold to be usable, checked without connecting: its scheme, a
host where one is needed, and a port in range. A bad one fails `check-config` with its field,
rather than `serve` with a traceback from the client library that first parses it.

The errors never quote the URL: a store's or a Redis's URL carries its password.
"""

from __future__ import annotations

from urllib.parse import urlsplit

_MAX_PORT = 65535


def check_url(
    value: str,
    schemes: tuple[str, ...],
    example: str,
    *,
    host_required: bool = True,
    many_hosts: bool = False,
) -> None:
    """ValueError saying what is wrong with `value` (`example` shows a right one); `many_hosts`:
    `host:port,host:port` (libpq's failover list)."""
    scheme, sep, _ = value.partition("://")
    if not sep or scheme.lower() not in schemes:
        wanted = [f"{s}://" for s in schemes]
        one_of = " or ".join(wanted) if len(wanted) < 3 else "one of " + ", ".join(wanted)
        raise ValueError(f"the URL must start with {one_of} (e.g. {example})")
    if any(c.isspace() for c in value):
        raise ValueError(f"the URL holds white space (e.g. {example})")
    netloc = urlsplit(value).netloc
    hosts = netloc.rpartition("@")[2]
    for host_port in hosts.split(",") if many_hosts else [hosts]:
        host, port = _host_and_port(host_port)
        if not host and host_required:
            raise ValueError(f"the URL names no host (e.g. {example})")
        if port is not None and not (port.isdigit() and 0 < int(port) <= _MAX_PORT):
            raise ValueError(f"the URL's port must be a number from 1 to {_MAX_PORT}")


def _host_and_port(host_port: str) -> tuple[str, str | None]:
    if host_port.startswith("["):  # an IPv6 address, `[::1]:6379`
        address, _, after = host_port.partition("]")
        if not after:
            return address[1:], None
        if not after.startswith(":"):
            raise ValueError("the URL's host is not a valid [IPv6] address")
        return address[1:], after[1:]
    host, colon, port = host_port.rpartition(":")
    return (host, port) if colon else (host_port, None)
