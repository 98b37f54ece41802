"""The HTTP seam to upstreams: one place that posts, reads bodies and maps HTTP statuses.

Every HTTP adapter sends through `post()` and reads through `UpstreamBody`, so a connection
error, a reset mid-stream or an HTTP error status becomes the same `UpstreamError` whatever the
provider. Adapters differ only in URL, headers, and how they translate bodies and error JSON.

`post()` takes any `Transport`: one call sends an `Endpoint`'s request with a body and returns
the response once its status and headers have arrived. The lean client
(gateway.upstream.pool.UpstreamPool: keep-alive, proxies, TLS trust) is the one the gateway
makes. A transport maps connection faults itself; here an error status becomes
`UpstreamHTTPError` (the provider's error JSON converted, credentials redacted) and a redirect
is refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import orjson

from gateway.errors import (
    GatewayError,
    UpstreamConnectError,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamProtocolError,
)
from gateway.scrub import REDACTED, credentials
from gateway.upstream.pool import Endpoint

_ERROR_BODY_LIMIT = 1 << 20
# Request headers whose values are credentials (Authorization, api-key, x-api-key, ...).

# Turns a provider's error JSON into the OpenAI error shape (None: it is not the provider's).
ErrorConverter = Callable[[int, dict[str, Any]], dict[str, Any] | None]


class UpstreamBody(Protocol):
    """An upstream response whose status and headers have arrived; its body comes by `read()`
    (gateway.upstream.connection.Response; gateway.providers.base.UpstreamResponse is what the
    pipeline needs of it)."""

    status: int
    usage_injected: bool

    @property
    def headers(self) -> Mapping[str, str]:
        """By lowercased name."""
        ...

    async def read(self) -> bytes:
        """The body received so far and not yet read; b"" at its end."""
        ...

    def close(self, *, keep_alive: bool = False) -> None:
        """Drop the connection, unless the body has ended (or, `keep_alive`, ends soon)."""
        ...


class Transport(Protocol):
    """What the adapters post through (gateway.upstream.pool.UpstreamPool)."""

    async def post(self, endpoint: Endpoint, body: bytes) -> UpstreamBody:
        """Send `body` to `endpoint` and wait for the response's status and headers (any
        status). Faults: `UpstreamConnectError`, `UpstreamTimeout(phase="connect")`,
        `UpstreamProtocolError`."""
        ...

    async def close(self) -> None:
        """Close every connection."""
        ...


def openai_error(status: int, body: dict[str, Any]) -> dict[str, Any] | None:
    return body if isinstance(body.get("error"), dict) else None


async def post(
    transport: Transport,
    endpoint: Endpoint,
    payload: Any,
    convert: ErrorConverter = openai_error,
) -> UpstreamBody:
    """POST JSON; an HTTP error status raises `UpstreamHTTPError` with an OpenAI-shaped body.
    Connection faults come from the client as `UpstreamConnectError`, `UpstreamTimeout` (the
    connect phase) or `UpstreamProtocolError`."""
    return await send(transport, endpoint, orjson.dumps(payload), convert)


async def send(
    transport: Transport,
    endpoint: Endpoint,
    body: bytes,
    convert: ErrorConverter = openai_error,
) -> UpstreamBody:
    """`post` for a body already encoded (a multipart form, or none for a GET), with the
    `Content-Type` its endpoint says."""
    response = await transport.post(endpoint, body)
    status = response.status
    if status < 300:
        return response
    if status == 407 and (proxy := endpoint.proxy) is not None:
        # A plain http request through a proxy, refused by the proxy (an https one's CONNECT
        # was refused before this): the request reached no upstream.
        response.close()
        raise UpstreamConnectError(
            f"the proxy {proxy.display} refused the request: HTTP 407 (its credentials are"
            " missing or wrong)"
        )
    if status >= 400:
        raise await _http_error(response, convert, credentials(endpoint.headers))
    # Never followed: a redirect would take the request, and key headers other than
    # Authorization (x-api-key, api-key), to a URL that is not in the config.
    response.close()
    raise UpstreamProtocolError(
        f"the upstream answered HTTP {status}, a redirect; the gateway calls only"
        " the api_base of its config",
        code="upstream_redirect",
    )


def redact(text: str, secrets: Iterable[str]) -> str:
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text


def redact_error(error: GatewayError, secrets: Iterable[str]) -> None:
    """Take the upstream's credentials out of an error, in place, before it is logged, recorded
    or answered: an upstream that quotes the key it was sent (a proxy's error page, a self-hosted
    server's "invalid key sk-...") must not hand it to the gateway's clients or its logs."""
    secrets = [s for s in secrets if s and len(s) >= 4]
    if not secrets:
        return
    error.message = redact(error.message, secrets)
    error.args = (error.message,)
    body = getattr(error, "body", None)
    if isinstance(body, dict):
        dumped = orjson.dumps(body).decode()
        cleaned = redact(dumped, secrets)
        if cleaned != dumped:
            error.body = orjson.loads(cleaned)  # type: ignore[attr-defined]


async def read_all(response: UpstreamBody, limit: int | None = None) -> bytes:
    """The whole body, or its first `limit` bytes; then the connection is pooled or dropped."""
    parts: list[bytes] = []
    size = 0
    try:
        while chunk := await response.read():
            parts.append(chunk)
            size += len(chunk)
            if limit is not None and size >= limit:
                break
    finally:
        response.close()
    body = b"".join(parts)
    return body if limit is None else body[:limit]


async def _http_error(
    response: UpstreamBody, convert: ErrorConverter, secrets: list[str]
) -> UpstreamHTTPError:
    status = response.status
    try:
        raw = await read_all(response, _ERROR_BODY_LIMIT)
    except UpstreamError:
        raw = b""  # the body broke off: the status alone is the answer
    for secret in secrets:  # an upstream quoting back the key it was sent
        raw = raw.replace(secret.encode(), REDACTED.encode())
    retry_after = retry_after_seconds(response.headers.get("retry-after"))
    try:
        parsed = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        parsed = None
    body = convert(status, parsed) if isinstance(parsed, dict) else None
    if body is not None:
        message = str(body["error"].get("message") or f"upstream returned HTTP {status}")
        return UpstreamHTTPError(status, message, body=body, retry_after=retry_after)
    # Not the provider's error JSON (a load balancer's HTML page, say): keep its text.
    text = raw[:300].decode("utf-8", "replace").strip()
    message = f"upstream returned HTTP {status}" + (f": {text}" if text else "")
    return UpstreamHTTPError(status, message, retry_after=retry_after)


def retry_after_seconds(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
