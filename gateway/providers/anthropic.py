"""Adapter for Anthropic's Messages API (`POST /v1/messages`), over the shared upstream pool.

It behaves like the OpenAI-compatible adapter in everything the pipeline relies on (only the
connect timeout lives here, the same error classes, a body read in pieces), so the retry and
fallback logic need not know which provider answered. What differs is the wire: the request is
translated by `anthropic_messages`, auth is an `x-api-key` header, and Anthropic's error bodies
are turned into OpenAI ones here so that a client never sees the other vendor's error shape.
"""

from __future__ import annotations

from typing import Any

from gateway.config import DeploymentConfig
from gateway.providers.anthropic_messages import openai_error_body, to_anthropic_request
from gateway.upstream.pool import Endpoint
from gateway.upstream.seam import Transport, UpstreamBody, post
from gateway.upstream.tls import deployment_context

DEFAULT_API_BASE = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"


class AnthropicProvider:
    wire = "anthropic"

    def __init__(self, config: DeploymentConfig, pool: Transport, model: str) -> None:
        base = (config.api_base or DEFAULT_API_BASE).rstrip("/")
        url = base + ("/messages" if base.endswith("/v1") else "/v1/messages")
        self._pool = pool
        self._model = model
        headers = {"content-type": "application/json", "anthropic-version": ANTHROPIC_VERSION}
        if config.api_key:
            headers["x-api-key"] = config.api_key
        # Merged case-insensitively by the endpoint: an extra `Anthropic-Version` replaces the
        # default, not doubles it.
        headers.update(config.extra_headers)
        # First-token, idle and total timeouts are the pipeline's; only connecting is timed here.
        # Its proxy (the deployment's, else the environment's) and TLS trust: decided now, once.
        self._messages = Endpoint(
            url,
            headers,
            config.timeouts.connect_s,
            proxy=config.proxy,
            ssl_context=deployment_context(config.tls.ca_bundle, config.tls.verify),
        )

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        payload = to_anthropic_request(body, self._model, stream=stream)
        # Anthropic always reports usage; the gateway never adds a request for it.
        return await post(self._pool, self._messages, payload, _error_body)


def _error_body(status: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """Anthropic's error JSON in the OpenAI shape; None for anything else."""
    return openai_error_body(status, body) if isinstance(body.get("error"), dict) else None
