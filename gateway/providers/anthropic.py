"""Adapter for Anthropic's Messages API (`POST /v1/messages`), over the shared session.

It behaves like the OpenAI-compatible adapter in everything the pipeline relies on (only the
connect timeout lives here, the same error classes, a body read in pieces), so the retry and
fallback logic need not know which provider answered. What differs is the wire: the request is
translated by `anthropic_messages`, auth is an `x-api-key` header, and Anthropic's error bodies
are turned into OpenAI ones here so that a client never sees the other vendor's error shape.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from multidict import CIMultiDict

from gateway.config import DeploymentConfig
from gateway.errors import UpstreamConnectError, UpstreamHTTPError, UpstreamTimeout
from gateway.providers.anthropic_messages import openai_error_body, to_anthropic_request
from gateway.providers.openai_compatible import OpenAICompatibleResponse, _retry_after

DEFAULT_API_BASE = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
_ERROR_BODY_LIMIT = 1 << 20


class AnthropicResponse(OpenAICompatibleResponse):
    """The body is read and its faults mapped exactly as for an OpenAI-compatible upstream."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        # Anthropic always reports usage; the gateway never adds a request for it.
        super().__init__(response, usage_injected=False)


class AnthropicProvider:
    wire = "anthropic"

    def __init__(
        self, config: DeploymentConfig, session: aiohttp.ClientSession, model: str
    ) -> None:
        base = (config.api_base or DEFAULT_API_BASE).rstrip("/")
        self._url = base + ("/messages" if base.endswith("/v1") else "/v1/messages")
        self._session = session
        self._model = model
        # Case-insensitive, so an extra `Anthropic-Version` replaces the default, not doubles it.
        headers: CIMultiDict[str] = CIMultiDict(
            {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        )
        if config.api_key:
            headers["x-api-key"] = config.api_key
        headers.update(config.extra_headers)
        self._headers = headers
        # First-token, idle and total timeouts are the pipeline's; only connecting is timed here.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.timeouts.connect_s)

    async def chat(self, body: dict[str, Any], *, stream: bool) -> AnthropicResponse:
        payload = to_anthropic_request(body, self._model, stream=stream)
        try:
            response = await self._session.post(
                self._url, data=orjson.dumps(payload), headers=self._headers, timeout=self._timeout
            )
        except aiohttp.ConnectionTimeoutError:
            raise UpstreamTimeout("connecting to the upstream timed out", phase="connect") from None
        except aiohttp.ClientConnectionError as exc:
            raise UpstreamConnectError(f"cannot reach the upstream: {exc}") from None
        if response.status >= 400:
            raise await _http_error(response)
        return AnthropicResponse(response)


async def _http_error(response: aiohttp.ClientResponse) -> UpstreamHTTPError:
    try:
        raw = await response.content.read(_ERROR_BODY_LIMIT)
    except (aiohttp.ClientError, TimeoutError):
        raw = b""
    finally:
        response.release()
    status = response.status
    retry_after = _retry_after(response.headers.get("Retry-After"))
    body: Any = None
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        converted = openai_error_body(status, body)
        message = str(converted["error"]["message"])
        return UpstreamHTTPError(status, message, body=converted, retry_after=retry_after)
    # Not Anthropic's JSON (a proxy's HTML page, say): the error's own status-derived shape.
    text = raw[:300].decode("utf-8", "replace").strip()
    message = f"upstream returned HTTP {status}" + (f": {text}" if text else "")
    return UpstreamHTTPError(status, message, retry_after=retry_after)
