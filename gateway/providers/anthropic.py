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
from multidict import CIMultiDict

from gateway.config import DeploymentConfig
from gateway.providers.anthropic_messages import openai_error_body, to_anthropic_request
from gateway.upstream import UpstreamBody, post

DEFAULT_API_BASE = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"


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

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        payload = to_anthropic_request(body, self._model, stream=stream)
        response = await post(
            self._session, self._url, payload, self._headers, self._timeout, _error_body
        )
        # Anthropic always reports usage; the gateway never adds a request for it.
        return UpstreamBody(response)


def _error_body(status: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """Anthropic's error JSON in the OpenAI shape; None for anything else."""
    return openai_error_body(status, body) if isinstance(body.get("error"), dict) else None
