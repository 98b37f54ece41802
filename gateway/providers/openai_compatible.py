"""Adapters for OpenAI-compatible `/chat/completions` endpoints, and Azure OpenAI's variant."""

from __future__ import annotations

from typing import Any

import orjson

from gateway.config import DeploymentConfig
from gateway.forms import Form
from gateway.providers.responses_request import to_responses_request
from gateway.upstream.pool import Endpoint
from gateway.upstream.seam import Transport, UpstreamBody, post, read_all, send
from gateway.upstream.tls import deployment_context

# The API calls besides chat and embeddings an OpenAI-compatible server is sent as they are
# (gateway.pipeline.calls); `rerank` is the Cohere/Jina shape vLLM and others serve beside it.
OPENAI_CALLS = frozenset(
    {
        "images.generations",
        "images.edits",
        "images.variations",
        "audio.transcriptions",
        "audio.translations",
        "audio.speech",
        "moderations",
        "rerank",
        "files",
        "batches",
    }
)
# What Azure OpenAI serves of them under a deployment's path.
AZURE_CALLS = frozenset(
    {
        "images.generations",
        "images.edits",
        "audio.transcriptions",
        "audio.translations",
        "audio.speech",
    }
)


def ask_usage(payload: dict[str, Any]) -> bool:
    """Ask a stream for its usage, in place; whether the client had not.

    Metering needs the provider's count, whatever the client asked (a client's
    `include_usage: false` would otherwise leave its turn to an estimate); the client never
    sees this extra chunk."""
    options = payload.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage") is True:
        return False
    payload["stream_options"] = {**(options or {}), "include_usage": True}
    return True


_KEPT_ENDPOINTS = 256


class OpenAICompatibleProvider:
    wire = "openai_chat"
    calls = OPENAI_CALLS

    def __init__(self, config: DeploymentConfig, pool: Transport, model: str) -> None:
        assert config.api_base is not None
        self._pool = pool
        self._model = model
        self._config = config
        base = self._base = config.api_base.rstrip("/")
        chat_url, embeddings_url = self._urls(base, config, model)
        headers = self._headers(config)
        # First-token, idle and total timeouts are the pipeline's; only connecting is timed here.
        connect_s = config.timeouts.connect_s
        # Its proxy (the deployment's, else the environment's) and TLS trust: decided now, once.
        proxy, tls = config.proxy, deployment_context(config.tls.ca_bundle, config.tls.verify)
        self._chat = Endpoint(chat_url, headers, connect_s, proxy=proxy, ssl_context=tls)
        self._embeddings = Endpoint(
            embeddings_url, headers, connect_s, proxy=proxy, ssl_context=tls
        )
        # The API's other paths, made when first used (most deployments never are).
        self._endpoints: dict[tuple[str, str], Endpoint] = {}

    def _urls(self, base: str, config: DeploymentConfig, model: str) -> tuple[str, str]:
        """The chat and embeddings URLs."""
        return base + "/chat/completions", base + "/embeddings"

    def url(self, base: str, path: str) -> str:
        """The URL of one of the API's other paths (`/completions`, `/images/generations`)."""
        return base + path

    def endpoint(
        self, path: str, headers: dict[str, str] | None = None, method: str = "POST"
    ) -> Endpoint:
        """An endpoint of this deployment at another path of its API, with its key, proxy and
        TLS trust; `headers` over its own (a multipart body's `Content-Type`, new each time).
        Without them, kept for the next call (the most recent few hundred paths)."""
        if headers is None:
            made = self._endpoints.get((method, path))
            if made is None:
                if len(self._endpoints) >= _KEPT_ENDPOINTS:
                    self._endpoints.clear()  # paths with ids in them (files, batches)
                made = self._endpoints[method, path] = self._endpoint(path, None, method)
            return made
        return self._endpoint(path, headers, method)

    def _endpoint(self, path: str, headers: dict[str, str] | None, method: str) -> Endpoint:
        config = self._config
        return Endpoint(
            self.url(self._base, path),
            {**self._headers(config), **(headers or {})},
            config.timeouts.connect_s,
            proxy=config.proxy,
            ssl_context=deployment_context(config.tls.ca_bundle, config.tls.verify),
            method=method,
        )

    def serves(self, call: str) -> bool:
        return call in self.calls

    async def call(
        self,
        call: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        form: Form | None = None,
        model: str | None = None,
        method: str = "POST",
    ) -> UpstreamBody:
        """One of the API's other calls (`OPENAI_CALLS`): a JSON body, a multipart form (its
        `model` field, if it has one, made `model`), or none (a GET or DELETE)."""
        if form is not None:
            values = (
                {"model": model} if model is not None and form.value("model") is not None else {}
            )
            body, content_type = form.encode(values)
            endpoint = self.endpoint(path, {"Content-Type": content_type}, method)
        else:
            body = orjson.dumps(json) if json is not None else b""
            endpoint = self.endpoint(path, None, method)
        return await send(self._pool, endpoint, body)

    async def completions(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        """OpenAI's legacy `/completions` with the client's own body, for this model."""
        payload = {**body, "model": self._model}
        usage_injected = stream and ask_usage(payload)
        response = await post(self._pool, self.endpoint("/completions"), payload)
        response.usage_injected = usage_injected
        return response

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
        usage_injected = stream and ask_usage(payload)
        response = await post(self._pool, self._chat, payload)
        response.usage_injected = usage_injected
        return response

    async def embeddings(self, body: dict[str, Any]) -> bytes:
        """The upstream's embeddings JSON, unchanged."""
        payload = {**body, "model": self._model}
        return await read_all(await post(self._pool, self._embeddings, payload))


class AzureOpenAIProvider(OpenAICompatibleProvider):
    """Azure OpenAI: the deployment is in the URL, the key in `api-key`, plus `api-version`."""

    calls = AZURE_CALLS

    def _urls(self, base: str, config: DeploymentConfig, model: str) -> tuple[str, str]:
        return self.url(base, "/chat/completions"), self.url(base, "/embeddings")

    def url(self, base: str, path: str) -> str:
        """Azure's form: the deployment in the path, the API version in the query."""
        query = f"?api-version={self._config.api_version}"
        return f"{base}/openai/deployments/{self._model}{path}{query}"

    def _headers(self, config: DeploymentConfig) -> dict[str, str]:
        headers = super()._headers(config)
        headers.pop("Authorization", None)
        if config.api_key:
            headers["api-key"] = config.api_key
        return headers


class OpenAIResponsesProvider(OpenAICompatibleProvider):
    """A deployment that speaks the native Responses API upstream (OpenAI's own: its other
    calls too)."""

    wire = "openai_responses"

    def _urls(self, base: str, config: DeploymentConfig, model: str) -> tuple[str, str]:
        return base + "/responses", base + "/embeddings"

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        payload = to_responses_request(body, self._model, stream=stream)
        return await post(self._pool, self._chat, payload)
