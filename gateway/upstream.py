"""The HTTP seam to upstreams: one place that posts, reads bodies and maps aiohttp's faults.

Every HTTP adapter sends through `post()` and reads through `UpstreamBody`, so a connection
error, a reset mid-stream or an HTTP error status becomes the same `UpstreamError` whatever the
provider. Adapters differ only in URL, headers, and how they translate bodies and error JSON.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import aiohttp
import orjson

from gateway.errors import (
    GatewayError,
    UpstreamConnectError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamTimeout,
)

_ERROR_BODY_LIMIT = 1 << 20
# Request headers whose values are credentials (Authorization, api-key, x-api-key, ...).
_CREDENTIAL_HEADER = re.compile(r"auth|key|token|secret|cookie|password", re.IGNORECASE)
REDACTED = "[redacted]"

# Turns a provider's error JSON into the OpenAI error shape (None: it is not the provider's).
ErrorConverter = Callable[[int, dict[str, Any]], dict[str, Any] | None]


class UpstreamBody:
    """A successful upstream response, read piece by piece."""

    def __init__(self, response: aiohttp.ClientResponse, usage_injected: bool = False) -> None:
        self._response = response
        self.usage_injected = usage_injected

    async def read(self) -> bytes:
        try:
            return await self._response.content.readany()
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamProtocolError(
                f"the upstream connection broke mid-stream: {exc}"
            ) from None

    def close(self) -> None:
        self._response.close()


def openai_error(status: int, body: dict[str, Any]) -> dict[str, Any] | None:
    return body if isinstance(body.get("error"), dict) else None


async def post(
    session: aiohttp.ClientSession,
    url: str,
    payload: Any,
    headers: Mapping[str, str],
    timeout: aiohttp.ClientTimeout,
    convert: ErrorConverter = openai_error,
) -> aiohttp.ClientResponse:
    """POST JSON; an HTTP error status raises `UpstreamHTTPError` with an OpenAI-shaped body."""
    try:
        response = await session.post(
            url,
            data=orjson.dumps(payload),
            headers=headers,
            timeout=timeout,
            # Never followed: a redirect would take the request, and key headers other than
            # Authorization (x-api-key, api-key), to a URL that is not in the config.
            allow_redirects=False,
        )
    except aiohttp.ConnectionTimeoutError:
        raise UpstreamTimeout("connecting to the upstream timed out", phase="connect") from None
    except aiohttp.ClientConnectionError as exc:
        raise UpstreamConnectError(f"cannot reach the upstream: {exc}") from None
    if response.status >= 400:
        raise await _http_error(response, convert, credentials(headers))
    if response.status >= 300:
        response.release()
        raise UpstreamProtocolError(
            f"the upstream answered HTTP {response.status}, a redirect; the gateway calls only"
            " the api_base of its config",
            code="upstream_redirect",
        )
    return response


def credentials(headers: Mapping[str, str]) -> list[str]:
    """The secrets among request headers: each credential header's value, and its token after
    a scheme (`Bearer sk-...`), longest first."""
    found: set[str] = set()
    for name, value in headers.items():
        if value and _CREDENTIAL_HEADER.search(name):
            found.update((value, value.rpartition(" ")[2]))
    return sorted((s for s in found if len(s) >= 4), key=len, reverse=True)


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


async def read_all(response: aiohttp.ClientResponse) -> bytes:
    try:
        return await response.read()
    except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
        raise UpstreamProtocolError(f"the upstream connection broke: {exc}") from None
    finally:
        response.release()


async def _http_error(
    response: aiohttp.ClientResponse, convert: ErrorConverter, secrets: list[str]
) -> UpstreamHTTPError:
    status = response.status
    try:
        raw = await response.content.read(_ERROR_BODY_LIMIT)
    except (aiohttp.ClientError, TimeoutError):
        raw = b""
    finally:
        response.release()
    for secret in secrets:  # an upstream quoting back the key it was sent
        raw = raw.replace(secret.encode(), REDACTED.encode())
    retry_after = retry_after_seconds(response.headers.get("Retry-After"))
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
