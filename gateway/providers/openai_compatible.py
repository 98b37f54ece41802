"""Adapters for OpenAI-compatible `/chat/completions` endpoints, and Azure OpenAI's variant."""

from __future__ import annotations

from typing import Any

import aiohttp

from gateway.config import DeploymentConfig
from gateway.providers.responses_request import to_responses_request
from gateway.upstream import UpstreamBody, post, read_all


class OpenAICompatibleProvider:
    wire = "openai_chat"

    def __init__(
        self, config: DeploymentConfig, session: aiohttp.ClientSession, model: str
    ) -> None:
        assert config.api_base is not None
        self._url = config.api_base.rstrip("/") + "/chat/completions"
        self._embeddings_url = config.api_base.rstrip("/") + "/embeddings"
        self._session = session
        self._model = model
        self._headers = {"Content-Type": "application/json", **config.extra_headers}
        if config.api_key:
            self._headers["Authorization"] = f"Bearer {config.api_key}"
        # First-token, idle and total timeouts are the pipeline's; only connecting is timed here.
        self._timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.timeouts.connect_s)

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        payload = dict(body)
        payload["model"] = self._model
        usage_injected = False
        if stream:
            options = payload.get("stream_options")
            if not isinstance(options, dict) or "include_usage" not in options:
                # Metering needs the provider's count; the client never sees this extra chunk.
                payload["stream_options"] = {**(options or {}), "include_usage": True}
                usage_injected = True
        response = await post(self._session, self._url, payload, self._headers, self._timeout)
        return UpstreamBody(response, usage_injected)

    async def embeddings(self, body: dict[str, Any]) -> bytes:
        """The upstream's embeddings JSON, unchanged."""
        payload = {**body, "model": self._model}
        response = await post(
            self._session, self._embeddings_url, payload, self._headers, self._timeout
        )
        return await read_all(response)


class AzureOpenAIProvider(OpenAICompatibleProvider):
    """Azure OpenAI: the deployment is in the URL, the key in `api-key`, plus `api-version`."""

    def __init__(
        self, config: DeploymentConfig, session: aiohttp.ClientSession, model: str
    ) -> None:
        super().__init__(config, session, model)
        assert config.api_base is not None
        base = f"{config.api_base.rstrip('/')}/openai/deployments/{model}"
        query = f"?api-version={config.api_version}"
        self._url = f"{base}/chat/completions{query}"
        self._embeddings_url = f"{base}/embeddings{query}"
        self._headers.pop("Authorization", None)
        if config.api_key:
            self._headers["api-key"] = config.api_key


class OpenAIResponsesProvider(OpenAICompatibleProvider):
    """A deployment that speaks the native Responses API upstream."""

    wire = "openai_responses"

    def __init__(
        self, config: DeploymentConfig, session: aiohttp.ClientSession, model: str
    ) -> None:
        super().__init__(config, session, model)
        assert config.api_base is not None
        self._url = config.api_base.rstrip("/") + "/responses"

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        payload = to_responses_request(body, self._model, stream=stream)
        response = await post(self._session, self._url, payload, self._headers, self._timeout)
        return UpstreamBody(response)
