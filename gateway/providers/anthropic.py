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
from gateway.providers.anthropic_messages import as_sent, openai_error_body, to_anthropic_request
from gateway.providers.params import ANTHROPIC_HEADERS, ANTHROPIC_REQUEST, ClientBody
from gateway.upstream.pool import Endpoint
from gateway.upstream.seam import Transport, UpstreamBody, post, read_all
from gateway.upstream.tls import deployment_context

DEFAULT_API_BASE = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
BETA = "anthropic-beta"
VERSION = "anthropic-version"
# The client header sets a deployment keeps endpoints for (Claude Code sends one set a run).
_HEADER_SETS = 64


class AnthropicProvider:
    wire = "anthropic"

    def __init__(self, config: DeploymentConfig, pool: Transport, model: str) -> None:
        base = (config.api_base or DEFAULT_API_BASE).rstrip("/")
        self._url = base + ("/messages" if base.endswith("/v1") else "/v1/messages")
        self._pool = pool
        self._model = model
        self._config = config
        headers = {"content-type": "application/json", VERSION: ANTHROPIC_VERSION}
        if config.api_key:
            headers["x-api-key"] = config.api_key
        # Merged case-insensitively by the endpoint: an extra `Anthropic-Version` replaces the
        # default, not doubles it.
        headers.update(config.extra_headers)
        self._headers = {k.lower(): v for k, v in headers.items()}
        self._messages = self._endpoint(self._url, self._headers)
        # By (path, anthropic-version, anthropic-beta) a client asked for.
        self._variants: dict[tuple[str, str, str], Endpoint] = {}

    def _endpoint(self, url: str, headers: dict[str, str]) -> Endpoint:
        # First-token, idle and total timeouts are the pipeline's; only connecting is timed
        # here. Its proxy (the deployment's, else the environment's) and TLS trust.
        config = self._config
        return Endpoint(
            url,
            headers,
            config.timeouts.connect_s,
            proxy=config.proxy,
            ssl_context=deployment_context(config.tls.ca_bundle, config.tls.verify),
        )

    def _for(self, client: Any, path: str = "") -> Endpoint:
        """The endpoint at `path` past the Messages URL with the client's `anthropic-version`
        (over the deployment's) and its betas added to the deployment's own."""
        if not client and not path:
            return self._messages  # the usual request: the deployment's own headers
        asked = client if isinstance(client, dict) else {}
        version = asked.get(VERSION) or self._headers[VERSION]
        own = [b.strip() for b in self._headers.get(BETA, "").split(",") if b.strip()]
        betas = [*own, *(b.strip() for b in asked.get(BETA, "").split(",") if b.strip())]
        beta = ",".join(dict.fromkeys(betas))
        if not path and version == self._headers[VERSION] and beta == ",".join(own):
            return self._messages
        key = (path, version, beta)
        endpoint = self._variants.get(key)
        if endpoint is None:
            headers = {**self._headers, VERSION: version}
            if beta:
                headers[BETA] = beta
            if len(self._variants) >= _HEADER_SETS:
                self._variants.clear()
            endpoint = self._variants[key] = self._endpoint(self._url + path, headers)
        return endpoint

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        # A Messages client's body goes as it came, unless the gateway changed its history.
        raw = body.get(ANTHROPIC_REQUEST)
        client = raw.current(body) if isinstance(raw, ClientBody) else None
        if client is not None:
            payload = as_sent(client, self._model, stream=stream)
        else:
            payload = to_anthropic_request(body, self._model, stream=stream)
        # Anthropic always reports usage; the gateway never adds a request for it.
        endpoint = self._for(body.get(ANTHROPIC_HEADERS))
        return await post(self._pool, endpoint, payload, _error_body)

    async def count_tokens(self, body: dict[str, Any], headers: dict[str, str]) -> bytes:
        """Anthropic's own count of a Messages request (`/v1/messages/count_tokens`), its JSON
        answer unchanged; `body` as the client sent it, `headers` its version and betas."""
        payload = {**body, "model": self._model}
        endpoint = self._for(headers, "/count_tokens")
        return await read_all(await post(self._pool, endpoint, payload, _error_body))


def _error_body(status: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """Anthropic's error JSON in the OpenAI shape; None for anything else."""
    return openai_error_body(status, body) if isinstance(body.get("error"), dict) else None
