"""Adapters for OpenAI-compatible `/chat/completions` endpoints, and Azure OpenAI's variant."""

from __future__ import annotations

from typing import Any

from gateway.config import DeploymentConfig
from gateway.providers.responses_request import to_responses_request
from gateway.upstream.pool import Endpoint
from gateway.upstream.seam import Transport, UpstreamBody, post, read_all
from gateway.upstream.tls import deployment_context


class OpenAICompatibleProvider:
    wire = "openai_chat"

    def __init__(self, config: DeploymentConfig, pool: Transport, model: str) -> None:
        assert config.api_base is not None
        self._pool = pool
        self._model = model
        chat_url, embeddings_url = self._urls(config.api_base.rstrip("/"), config, model)
        headers = self._headers(config)
        # First-token, idle and total timeouts are the pipeline's; only connecting is timed here.
        connect_s = config.timeouts.connect_s
        # Its proxy (the deployment's, else the environment's) and TLS trust: decided now, once.
        proxy, tls = config.proxy, deployment_context(config.tls.ca_bundle, config.tls.verify)
        self._chat = Endpoint(chat_url, headers, connect_s, proxy=proxy, ssl_context=tls)
        self._embeddings = Endpoint(
            embeddings_url, headers, connect_s, proxy=proxy, ssl_context=tls
        )

    def _urls(self, base: str, config: DeploymentConfig, model: str) -> tuple[str, str]:
        """The chat and embeddings URLs."""
        return base + "/chat/completions", base + "/embeddings"

    def _headers(self, config: DeploymentConfig) -> dict[str, str]:
        headers = {"Content-Type": "application/json", **config.extra_headers}
        if config.api_key:
            headers["Authorization"] = f"Bearer {config.api_key}"
        return headers

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        payload = dict(body)
        payload["model"] = self._model
        if payload.get("reasoning_effort") is not None:
            # Anthropic's `thinking`, as the /v1/messages dialect sends it: its OpenAI form is
            # the effort beside it (gateway.providers.params), and OpenAI refuses the field.
            payload.pop("thinking", None)
        usage_injected = False
        if stream:
            options = payload.get("stream_options")
            if not isinstance(options, dict) or options.get("include_usage") is not True:
                # Metering needs the provider's count, whatever the client asked (a client's
                # `include_usage: false` would otherwise leave its turn to an estimate); the
                # client never sees this extra chunk.
                payload["stream_options"] = {**(options or {}), "include_usage": True}
                usage_injected = True
        response = await post(self._pool, self._chat, payload)
        response.usage_injected = usage_injected
        return response

    async def embeddings(self, body: dict[str, Any]) -> bytes:
        """The upstream's embeddings JSON, unchanged."""
        payload = {**body, "model": self._model}
        return await read_all(await post(self._pool, self._embeddings, payload))


class AzureOpenAIProvider(OpenAICompatibleProvider):
    """Azure OpenAI: the deployment is in the URL, the key in `api-key`, plus `api-version`."""

    def _urls(self, base: str, config: DeploymentConfig, model: str) -> tuple[str, str]:
        deployment = f"{base}/openai/deployments/{model}"
        query = f"?api-version={config.api_version}"
        return f"{deployment}/chat/completions{query}", f"{deployment}/embeddings{query}"

    def _headers(self, config: DeploymentConfig) -> dict[str, str]:
        headers = super()._headers(config)
        headers.pop("Authorization", None)
        if config.api_key:
            headers["api-key"] = config.api_key
        return headers


class OpenAIResponsesProvider(OpenAICompatibleProvider):
    """A deployment that speaks the native Responses API upstream."""

    wire = "openai_responses"

    def _urls(self, base: str, config: DeploymentConfig, model: str) -> tuple[str, str]:
        return base + "/responses", base + "/embeddings"

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        payload = to_responses_request(body, self._model, stream=stream)
        return await post(self._pool, self._chat, payload)
