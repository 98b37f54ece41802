"""litellm models the gateway reaches itself: Groq, Mistral and Cohere's chat.

An operator writes them as litellm does (`provider: litellm`, `model: groq/...`, `mistral/...`,
`cohere_chat/...` or `cohere/...`, which `import-litellm` keeps), and gets litellm's parameter
rules, defaults and key variables; but the request goes over the gateway's own upstream pool and
the answer is read by the gateway's parser of that provider's wire format, as for OpenAI and
Anthropic deployments. litellm's readers of these streams lose what a gateway must keep: Cohere's
v2 stream is not read at all, Groq's in-band error loses its message (its string `code` is read
as an HTTP status), and Mistral's error object sent mid-stream is skipped. Read here, each is a
failed attempt with the provider's message, like any other adapter's.

Built once, when the router is (at start); nothing here runs for other deployments.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gateway.config import DeploymentConfig
from gateway.providers import cohere_chat, mistral_chat
from gateway.providers.extras import provider_prefix
from gateway.providers.openai_compatible import ask_usage
from gateway.providers.params import LITELLM_FORWARDED, openai_form
from gateway.providers.wire import COHERE_V2, GROQ_CHAT, MISTRAL_CHAT
from gateway.upstream.pool import Endpoint
from gateway.upstream.seam import ErrorConverter, Transport, UpstreamBody, openai_error, post
from gateway.upstream.tls import deployment_context

# What the Cohere request carries (gateway.providers.cohere_chat): its parameter table.
COHERE_PARAMS = frozenset(
    {
        "temperature",
        "top_p",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "seed",
        "frequency_penalty",
        "presence_penalty",
        "tools",
        "tool_choice",
        "response_format",
        "reasoning_effort",
    }
)


# What an answer carries that Groq refuses in an earlier assistant message.
_ANSWER_ONLY = frozenset(
    {"reasoning_content", "thinking_blocks", "reasoning_items", "provider_specific_fields"}
)


def groq_request(body: dict[str, Any], model: str, *, stream: bool) -> dict[str, Any]:
    """Groq's request: OpenAI's, with the fields litellm would hand it, and earlier answers
    without what only answers carry or null fields (Groq refuses both)."""
    body = openai_form(body)
    out = {k: body[k] for k in LITELLM_FORWARDED if body.get(k) is not None}
    out.pop("thinking", None)  # the /v1/messages dialect's; its effort is beside it
    messages = [
        {k: v for k, v in m.items() if v is not None and k not in _ANSWER_ONLY}
        if isinstance(m, dict) and m.get("role") == "assistant"
        else m
        for m in body.get("messages") or ()
    ]
    return {**out, "model": model, "messages": messages, "stream": stream}


@dataclass(frozen=True)
class Route:
    """How the gateway speaks one litellm provider."""

    wire: str
    url: Callable[[str | None], str]  # the chat URL, from the deployment's api_base
    key_variables: tuple[str, ...]  # where litellm finds the key when the config gives none
    base_variable: str  # and the api_base
    request: Callable[..., dict[str, Any]]
    errors: ErrorConverter = openai_error
    ask_usage: bool = False  # the stream reports usage only when asked
    params: frozenset[str] | None = None  # else litellm's table for the model


def _openai_url(default: str) -> Callable[[str | None], str]:
    return lambda base: (base or default).rstrip("/") + "/chat/completions"


def _cohere_url(base: str | None) -> str:
    """litellm takes Cohere's api_base as the chat endpoint's whole URL; a bare root is taken
    too."""
    url = (base or cohere_chat.DEFAULT_URL).rstrip("/")
    return url if url.endswith("/chat") else url + "/v2/chat"


def _groq_errors(status: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """Groq's error JSON, which can lack OpenAI's `param` and `code`, with both."""
    error = body.get("error")
    if not isinstance(error, dict):
        return None
    return {**body, "error": {"param": None, "code": None, **error}}


def _mistral_errors(status: int, body: dict[str, Any]) -> dict[str, Any] | None:
    """Mistral's `{"object": "error", ...}` in the OpenAI shape."""
    if body.get("object") == "error" and "error" not in body:
        message = body.get("message")
        text = message if isinstance(message, str) else str(message)
        error = {"message": text, "type": body.get("type"), "param": None, "code": body.get("code")}
        return {"error": error}
    return openai_error(status, body)


_COHERE = Route(
    COHERE_V2,
    _cohere_url,
    ("COHERE_API_KEY", "CO_API_KEY"),
    "COHERE_API_BASE",
    cohere_chat.cohere_request,
    cohere_chat.openai_error_body,
    params=COHERE_PARAMS,
)
ROUTES: dict[str, Route] = {
    "groq": Route(
        GROQ_CHAT,
        _openai_url("https://api.groq.com/openai/v1"),
        ("GROQ_API_KEY",),
        "GROQ_API_BASE",
        groq_request,
        _groq_errors,
        ask_usage=True,
    ),
    "mistral": Route(
        MISTRAL_CHAT,
        _openai_url(mistral_chat.DEFAULT_API_BASE),
        ("MISTRAL_API_KEY",),
        "MISTRAL_API_BASE",
        mistral_chat.mistral_request,
        _mistral_errors,
    ),
    "cohere_chat": _COHERE,
    "cohere": _COHERE,
}


def native_provider(config: DeploymentConfig, pool: Transport, model: str) -> NativeChat | None:
    """The gateway's own adapter for a litellm `model`, when it speaks that provider."""
    prefix = provider_prefix(model)
    route = ROUTES.get(prefix)
    if route is None or (route is _COHERE and "v1/" in model):
        return None  # (`cohere_chat/v1/...`: Cohere's v1 chat, another format, litellm's)
    return NativeChat(config, pool, model, route)


def _litellm_provider(config: DeploymentConfig, model: str) -> Any:
    """litellm's adapter of the same deployment, for what litellm knows of it (its parameter
    table) and does for it (the API calls besides chat); None when litellm is not installed."""
    try:
        from gateway.providers.litellm_adapter import LiteLLMProvider

        return LiteLLMProvider(config, model)
    except ImportError:
        return None


class NativeChat:
    """A litellm provider's chat, spoken by the gateway (`ROUTES`)."""

    def __init__(self, config: DeploymentConfig, pool: Transport, model: str, route: Route) -> None:
        self.wire = route.wire
        self._pool = pool
        own = model.split("/", 1)[1]  # the provider's own name for it
        # (litellm's `cohere_chat/v2/...` names Cohere's v2 route, the one spoken here.)
        self._model = own.removeprefix("v2/") if route is _COHERE else own
        self._route = route
        # Transcriptions, speech, rerank and the like stay litellm's, as does the parameter
        # table of Groq's and Mistral's models (read by gateway.providers.params, as the
        # litellm adapter's is).
        self._litellm = _litellm_provider(config, model)
        litellm_params = getattr(self._litellm, "supported", None)
        self.supported = route.params if route.params is not None else litellm_params
        key = config.api_key or next(
            (v for name in route.key_variables if (v := os.environ.get(name))), None
        )
        headers = {"Content-Type": "application/json", **config.extra_headers}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        # First-token, idle and total timeouts are the pipeline's; only connecting is timed here.
        self._endpoint = Endpoint(
            route.url(config.api_base or os.environ.get(route.base_variable)),
            headers,
            config.timeouts.connect_s,
            proxy=config.proxy,
            ssl_context=deployment_context(config.tls.ca_bundle, config.tls.verify),
        )

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamBody:
        route = self._route
        payload = route.request(body, self._model, stream=stream)
        usage_injected = stream and route.ask_usage and ask_usage(payload)
        response = await post(self._pool, self._endpoint, payload, route.errors)
        response.usage_injected = usage_injected
        return response

    def serves(self, call: str) -> bool:
        return self._litellm is not None and bool(self._litellm.serves(call))

    async def call(self, call: str, path: str, **arguments: Any) -> Any:
        """An API call besides chat (gateway.pipeline.calls), through litellm."""
        return await self._litellm.call(call, path, **arguments)
