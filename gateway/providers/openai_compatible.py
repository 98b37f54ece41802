"""Adapter for any OpenAI-compatible `/chat/completions` endpoint, over the shared session."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson

from gateway.config import DeploymentConfig
from gateway.errors import (
    UpstreamConnectError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamTimeout,
)

_ERROR_BODY_LIMIT = 1 << 20


class OpenAICompatibleResponse:
    def __init__(self, response: aiohttp.ClientResponse, usage_injected: bool) -> None:
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

    async def chat(self, body: dict[str, Any], *, stream: bool) -> OpenAICompatibleResponse:
        payload = dict(body)
        payload["model"] = self._model
        usage_injected = False
        if stream:
            options = payload.get("stream_options")
            if not isinstance(options, dict) or "include_usage" not in options:
                payload["stream_options"] = {**(options or {}), "include_usage": True}
                usage_injected = True
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
        return OpenAICompatibleResponse(response, usage_injected)

    async def embeddings(self, body: dict[str, Any]) -> bytes:
        """The upstream's embeddings JSON, unchanged."""
        payload = {**body, "model": self._model}
        try:
            async with self._session.post(
                self._embeddings_url,
                data=orjson.dumps(payload),
                headers=self._headers,
                timeout=self._timeout,
            ) as response:
                if response.status >= 400:
                    raise await _http_error(response)
                return await response.read()
        except aiohttp.ConnectionTimeoutError:
            raise UpstreamTimeout("connecting to the upstream timed out", phase="connect") from None
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError) as exc:
            raise UpstreamConnectError(f"cannot reach the upstream: {exc}") from None


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


async def _http_error(response: aiohttp.ClientResponse) -> UpstreamHTTPError:
    try:
        raw = await response.content.read(_ERROR_BODY_LIMIT)
    except (aiohttp.ClientError, TimeoutError):
        raw = b""
    finally:
        response.release()
    retry_after = _retry_after(response.headers.get("Retry-After"))
    body: Any = None
    try:
        body = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        message = str(body["error"].get("message") or f"upstream returned HTTP {response.status}")
        return UpstreamHTTPError(response.status, message, body=body, retry_after=retry_after)
    text = raw[:300].decode("utf-8", "replace").strip()
    message = f"upstream returned HTTP {response.status}" + (f": {text}" if text else "")
    return UpstreamHTTPError(response.status, message, retry_after=retry_after)


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
