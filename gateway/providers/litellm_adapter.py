"""Adapter for the providers the gateway does not speak natively, through the `litellm` package.

Gemini, Vertex AI, Bedrock, Cohere and the rest each have their own wire format; rather than
translate every one of them here, this adapter hands the OpenAI body to `litellm.acompletion`
and turns what comes back into the OpenAI Chat Completions wire (`wire = "openai_chat"`): one
`data: <chunk>` SSE frame per litellm chunk and `data: [DONE]` for a stream, the
`chat.completion` JSON otherwise. The pipeline then relays it like any OpenAI-compatible answer.

It behaves like the native adapters in everything the pipeline relies on: litellm never retries
(the gateway's retry and fallback decide), only connecting is timed here (first-token, idle and
total timeouts are the pipeline's), and every litellm exception becomes the gateway's error tree
with an OpenAI-shaped body, whether it comes from `chat()` or, mid-stream, from `read()`.

litellm takes seconds to import (and its import has side effects on logging), so it is
imported only here and only once a litellm deployment is built; pyproject bans it elsewhere.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import re
import warnings
from collections.abc import Iterator
from functools import cache
from typing import Any

import orjson

from gateway.config import DeploymentConfig
from gateway.errors import (
    UpstreamConnectError,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamProtocolError,
    UpstreamStreamError,
    UpstreamTimeout,
)
from gateway.providers import cloud, extras
from gateway.providers.params import LITELLM_FORWARDED
from gateway.providers.wire import LITELLM_SIGNED
from gateway.upstream.seam import retry_after_seconds

# OpenAI chat parameters passed on to litellm, which maps them to each provider's own; the ones
# litellm says the model does not support were refused (or, under `drop_params`, dropped) before
# the request got here (gateway.providers.params). Anything else in the body is not forwarded.
FORWARDED_PARAMS = LITELLM_FORWARDED

_CHUNK_KEYS = ("id", "object", "created", "model", "system_fingerprint", "service_tier")
_ERROR_TEXT_LIMIT = 300
_MESSAGE_LIMIT = 2000
# "litellm.RateLimitError: litellm.RateLimitError: GeminiException - {...}" -> "{...}"
_LITELLM_PREFIX = re.compile(r"^(?:litellm\.\w+:\s*)+(?:\w+Exception(?: \w+Error)? - )?")
# Google's RetryInfo delay: "37s", "0.5s".
_GOOGLE_DELAY = re.compile(r"^\s*(\d+(?:\.\d+)?)s\s*$")

# close() cannot await; the tasks closing litellm streams are kept here until they finish.
_CLOSING: set[asyncio.Task[None]] = set()


# What litellm would otherwise fetch on its own, at import or on a request: its price map and
# Anthropic beta-header table (the copies in the wheel instead), and Hugging Face tokenizers for
# Llama, Cohere and other models it counts tokens for (tiktoken's files in the wheel instead). A
# gateway with no route out waited on those downloads' retries before a stream's first byte.
# Set before the import, which reads some of them; an operator's own value is kept.
OFFLINE_ENVIRONMENT = {
    "LITELLM_OFFLINE_MODE": "true",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "HF_HUB_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}


@cache
def load_litellm() -> Any:
    """Import and configure litellm once; seconds the first time. Safe to call at startup."""
    for name, value in OFFLINE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
    # Through importlib, not `import litellm`: mypy would otherwise analyse all of litellm
    # (a thousand modules, ~50 s on a cold cache) to type-check this boundary, which is `Any`.
    module: Any = importlib.import_module("litellm")
    module.suppress_debug_info = True  # no "Give Feedback / Get Help" banner on stdout per error
    module.telemetry = False  # older versions reported usage home unless told not to
    module.set_verbose = False
    # Its Pydantic deprecation warnings are litellm's to fix, not the operator's to read.
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"litellm(\.|$)")
    # No per-chunk success logging (a thread-pool job per chunk); the gateway records streams.
    module.disable_streaming_logging = True
    module.disable_hf_tokenizer_download = True  # counts with the bundled tiktoken files
    _quiet_loggers()
    return module


# litellm's loggers. It gives them a handler of its own, which writes every record at the root
# logger's level (INFO: a "LiteLLM completion() model=..." line per request) in its own format,
# and the record goes on to the gateway's handlers as well.
LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


def _quiet_loggers() -> None:
    """litellm's records through the gateway's handlers alone (its format, its scrubbing), from
    WARNING up, or from the level an operator gave `LITELLM_LOG`."""
    level = logging.getLevelName(os.environ.get("LITELLM_LOG", "WARNING").upper())
    for name in LITELLM_LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(level if isinstance(level, int) else logging.WARNING)
        for handler in list(logger.handlers):
            logger.removeHandler(handler)


class LiteLLMStreamResponse:
    """A litellm chunk stream read as OpenAI chat SSE bytes."""

    def __init__(self, stream: Any, usage_injected: bool, first: Any | None) -> None:
        self._stream = stream
        self.usage_injected = usage_injected
        self._first = first
        self._ended = first is None  # the stream ended (or failed) before its first chunk
        self._started = False
        self._closed = False

    async def read(self) -> bytes:
        while True:
            if self._closed:
                return b""
            if self._first is not None:
                chunk, self._first = self._first, None
            elif self._ended:
                self._closed = True
                return b"data: [DONE]\n\n"
            else:
                try:
                    chunk = await self._stream.__anext__()
                except StopAsyncIteration:
                    self._ended = True
                    continue
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    self.close()
                    raise upstream_error(exc, started=self._started) from None
            self._started = True
            data = chunk_frames(chunk, self._stream)
            if data:
                return data

    def close(self, *, keep_alive: bool = False) -> None:
        if self._closed and self._stream is None:
            return
        self._closed = True
        stream, self._stream = self._stream, None
        if stream is not None:
            _close_later(stream)


class LiteLLMBodyResponse:
    """A whole (non-streaming) litellm answer, read once as `chat.completion` JSON."""

    usage_injected = False

    def __init__(self, body: bytes) -> None:
        self._body = body

    async def read(self) -> bytes:
        body, self._body = self._body, b""
        return body

    def close(self, *, keep_alive: bool = False) -> None:
        self._body = b""


class LiteLLMCallBody:
    """A litellm API call's answer (gateway.pipeline.calls), as an upstream body read once."""

    status = 200
    usage_injected = False

    def __init__(self, body: bytes, content_type: str) -> None:
        self._body = body
        self.headers = {"content-type": content_type}

    async def read(self) -> bytes:
        body, self._body = self._body, b""
        return body

    def close(self, *, keep_alive: bool = False) -> None:
        self._body = b""


# The API calls litellm drives for its providers, and the function of each.
LITELLM_CALLS = {
    "images.generations": "aimage_generation",
    "audio.transcriptions": "atranscription",
    "audio.speech": "aspeech",
    "rerank": "arerank",
}
_IMAGE_FIELDS = ("n", "quality", "response_format", "size", "style", "user", "background")
_TRANSCRIPTION_FIELDS = ("language", "prompt", "response_format", "temperature")
_SPEECH_FIELDS = ("voice", "response_format", "speed", "instructions")
_RERANK_FIELDS = ("top_n", "rank_fields", "return_documents", "max_chunks_per_doc")
_AUDIO_TYPES = {
    "mp3": "audio/mpeg",
    "opus": "audio/ogg",
    "aac": "audio/aac",
    "flac": "audio/flac",
    "wav": "audio/wav",
    "pcm": "audio/pcm",
}


class LiteLLMProvider:
    wire = "openai_chat"

    def __init__(self, config: DeploymentConfig, model: str) -> None:
        # Paid here, when the router is built at startup, rather than on a request's path where
        # it would hold the event loop for seconds.
        self._litellm = load_litellm()
        try:
            resolved = self._litellm.get_llm_provider(model=model, api_base=config.api_base)
        except Exception as exc:  # a config mistake: fail at startup, not on every request
            raise ValueError(
                f"litellm cannot tell which provider serves model {model!r}; write it as"
                f" provider/model, e.g. gemini/gemini-2.0-flash ({_message_of(exc)[:200]})"
            ) from None
        # The OpenAI parameters litellm can map for this model (gateway.providers.params refuses
        # the others before a request gets here); None when litellm cannot say.
        # The provider as litellm resolved it (a bare model name included): its packages must
        # be here now, not found missing by the first request.
        extras.check(resolved[1])
        self.supported = supported_params(self._litellm, resolved[0], resolved[1])
        if "claude" in model.lower():
            # Its thinking comes signed; read so, its answers are rendered for the client rather
            # than relayed as written, which only these deployments pay for.
            self.wire = LITELLM_SIGNED
        self._model = model
        self._api_base = config.api_base
        self._api_key = config.api_key
        self._extra_headers = dict(config.extra_headers)
        self._cloud = cloud.arguments(config.__dict__)
        timeouts = config.timeouts
        # The pipeline times first token, idle gaps and the total. litellm gets the connect
        # timeout and, as a backstop only, the total for reads. (Providers litellm drives with
        # a single float timeout, Gemini among them, get the backstop for connecting too.)
        import httpx

        self._timeout = httpx.Timeout(timeouts.total_s, connect=timeouts.connect_s)

    async def chat(
        self, body: dict[str, Any], *, stream: bool
    ) -> LiteLLMStreamResponse | LiteLLMBodyResponse:
        kwargs: dict[str, Any] = {
            key: body[key] for key in FORWARDED_PARAMS if body.get(key) is not None
        }
        usage_injected = False
        if stream:
            options = body.get("stream_options")
            options = dict(options) if isinstance(options, dict) else {}
            if options.get("include_usage") is not True:  # metering needs it, whatever was asked
                options["include_usage"] = True
                usage_injected = True
            kwargs["stream_options"] = options
        if self._extra_headers:
            kwargs["extra_headers"] = self._extra_headers
        if self._cloud:
            kwargs.update(self._cloud)
        try:
            result = await self._litellm.acompletion(
                model=self._model,
                messages=body.get("messages") or [],
                stream=stream,
                api_base=self._api_base,
                api_key=self._api_key,
                timeout=self._timeout,
                num_retries=0,
                max_retries=0,
                drop_params=True,
                **kwargs,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise upstream_error(exc, started=False) from None
        if not stream:
            return LiteLLMBodyResponse(completion_json(result))
        # litellm sends the request on the first read: take the first chunk now, so that an
        # HTTP error or a refused connection is raised here, before anything is relayed.
        try:
            first = await result.__anext__()
        except StopAsyncIteration:
            first = None
        except asyncio.CancelledError:
            _close_later(result)
            raise
        except Exception as exc:
            _close_later(result)
            raise upstream_error(exc, started=False) from None
        return LiteLLMStreamResponse(result, usage_injected, first)

    def serves(self, call: str) -> bool:
        return call in LITELLM_CALLS

    async def call(
        self,
        call: str,
        path: str,
        *,
        json: dict[str, Any] | None = None,
        form: Any = None,
        model: str | None = None,
        method: str = "POST",
    ) -> LiteLLMCallBody:
        """An images, transcription, speech or rerank call through litellm's function for it;
        the answer as OpenAI's (or, rerank, Cohere's) JSON, or speech's audio bytes."""
        body = json or {}
        kwargs: dict[str, Any] = {
            "model": self._model,
            "api_base": self._api_base,
            "api_key": self._api_key,
            "timeout": self._timeout,
            "max_retries": 0,  # the gateway's retries and fallbacks decide
        }
        if self._extra_headers:
            kwargs["extra_headers"] = self._extra_headers
        kwargs.update(self._cloud)
        content_type = "application/json"
        try:
            if call == "images.generations":
                kwargs.update({k: body[k] for k in _IMAGE_FIELDS if body.get(k) is not None})
                result = await self._litellm.aimage_generation(prompt=body["prompt"], **kwargs)
            elif call == "audio.transcriptions":
                audio = form.file("file")
                fields = form.fields()
                kwargs.update({k: fields[k] for k in _TRANSCRIPTION_FIELDS if k in fields})
                result = await self._litellm.atranscription(
                    file=(audio.filename, audio.data), **kwargs
                )
                if fields.get("response_format") in ("text", "srt", "vtt"):
                    text = getattr(result, "text", None) or _dump(result).get("text") or ""
                    return LiteLLMCallBody(str(text).encode(), "text/plain; charset=utf-8")
            elif call == "audio.speech":
                kwargs.update({k: body[k] for k in _SPEECH_FIELDS if body.get(k) is not None})
                result = await self._litellm.aspeech(input=body["input"], **kwargs)
                fmt = str(body.get("response_format") or "mp3")
                return LiteLLMCallBody(
                    result.content, _AUDIO_TYPES.get(fmt, "application/octet-stream")
                )
            else:
                kwargs.update({k: body[k] for k in _RERANK_FIELDS if body.get(k) is not None})
                result = await self._litellm.arerank(
                    query=body["query"], documents=body["documents"], **kwargs
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise upstream_error(exc, started=False) from None
        return LiteLLMCallBody(orjson.dumps(_dump(result)), content_type)


def supported_params(litellm: Any, model: str, provider: str) -> frozenset[str] | None:
    """What litellm says `model` of `provider` supports of the OpenAI chat parameters."""
    try:
        names = litellm.get_supported_openai_params(model=model, custom_llm_provider=provider)
    except Exception:  # an unusual provider: let litellm decide on the request
        return None
    return frozenset(names) if isinstance(names, list) else None


# -- shaping litellm objects as the OpenAI wire ------------------------------------------------


def _dump(obj: Any) -> dict[str, Any]:
    if isinstance(obj, dict):
        return obj
    dumped: dict[str, Any] = obj.model_dump(exclude_none=True, warnings=False)
    return dumped


def _clean(mapping: dict[str, Any]) -> dict[str, Any]:
    """Without litellm's own additions: `provider_specific_fields` and empty extras."""
    return {
        k: v
        for k, v in mapping.items()
        if k != "provider_specific_fields" and v is not None and v != []
    }


def _tool_calls(calls: Any) -> list[dict[str, Any]]:
    out = []
    for position, call in enumerate(calls if isinstance(calls, list) else ()):
        if isinstance(call, dict):
            call = _clean(call)
            call.setdefault("index", position)
            out.append(call)
    return out


# Marks usage litellm counted itself (with tiktoken) because the provider sent none: the
# record keeps it apart from a provider's own count, and so can the client.
USAGE_SOURCE = "usage_source"
LITELLM_COUNTED = "litellm"


def counted_by_litellm(stream: Any) -> bool:
    """Whether the usage at the end of this litellm stream is litellm's own count.

    litellm keeps every chunk the provider sent that carried usage in `chunks`; when none did,
    it makes up the final usage from the text (as its `_reported_total_usage` tells them apart).
    """
    chunks = getattr(stream, "chunks", None)
    if not isinstance(chunks, list):
        return False
    return not any(getattr(chunk, "usage", None) is not None for chunk in chunks)


def chunk_frames(chunk: Any, stream: Any = None) -> bytes:
    """One litellm stream chunk as OpenAI `chat.completion.chunk` SSE frames (b"" if empty).

    A chunk carrying both choices and usage is split in two, as OpenAI sends it: the usage in
    a chunk of its own with `choices: []`, which the pipeline can hold back from a client that
    did not ask for usage. Usage that litellm counted itself (`stream` tells) is marked so.
    """
    obj = _dump(chunk)
    head: dict[str, Any] = {k: obj[k] for k in _CHUNK_KEYS if obj.get(k) is not None}
    head["object"] = "chat.completion.chunk"
    choices = []
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        delta = _clean(choice.get("delta") or {})
        if delta.get("content") == "" and ("reasoning_content" in delta or "tool_calls" in delta):
            # litellm adds an empty text to Bedrock's reasoning and tool deltas; relayed, it
            # would read as a text block starting between two pieces of the same reasoning.
            del delta["content"]
        if "tool_calls" in delta:
            delta["tool_calls"] = _tool_calls(delta["tool_calls"])
        out: dict[str, Any] = {
            "index": choice.get("index", 0),
            "delta": delta,
            "finish_reason": choice.get("finish_reason"),
        }
        if choice.get("logprobs") is not None:
            out["logprobs"] = choice["logprobs"]
        choices.append(out)
    frames = b""
    if choices:
        frames += b"data: " + orjson.dumps({**head, "choices": choices}) + b"\n\n"
    usage = obj.get("usage")
    if isinstance(usage, dict) and usage:
        if counted_by_litellm(stream):
            usage[USAGE_SOURCE] = LITELLM_COUNTED
        frames += b"data: " + orjson.dumps({**head, "choices": [], "usage": usage}) + b"\n\n"
    return frames


def completion_json(response: Any) -> bytes:
    """A litellm `ModelResponse` as an OpenAI `chat.completion` object."""
    obj = _dump(response)
    out: dict[str, Any] = {k: obj[k] for k in _CHUNK_KEYS if obj.get(k) is not None}
    out["object"] = "chat.completion"
    choices = []
    for choice in obj.get("choices") or ():
        if not isinstance(choice, dict):
            continue
        message = _clean(choice.get("message") or {})
        message.setdefault("role", "assistant")
        message.setdefault("content", None)
        if "tool_calls" in message:
            message["tool_calls"] = [
                {k: v for k, v in call.items() if k != "index"}
                for call in _tool_calls(message["tool_calls"])
            ]
        entry: dict[str, Any] = {
            "index": choice.get("index", 0),
            "message": message,
            "finish_reason": choice.get("finish_reason"),
        }
        if choice.get("logprobs") is not None:
            entry["logprobs"] = choice["logprobs"]
        choices.append(entry)
    out["choices"] = choices
    if isinstance(obj.get("usage"), dict):
        out["usage"] = obj["usage"]
    return orjson.dumps(out)


def _close_later(stream: Any) -> None:
    """Close litellm's stream (and so its HTTP response) without waiting for it."""
    aclose = getattr(stream, "aclose", None)
    if aclose is None:
        return
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        return
    task = loop.create_task(_aclose(aclose))
    _CLOSING.add(task)
    task.add_done_callback(_CLOSING.discard)


async def _aclose(aclose: Any) -> None:
    try:
        await aclose()
    except Exception:  # best effort: the stream is abandoned either way
        pass


# -- errors --------------------------------------------------------------------------------------


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and what it wraps: litellm's `original_exception`, causes, contexts."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen and len(seen) < 16:
        seen.add(id(current))
        yield current
        original = getattr(current, "original_exception", None)
        if isinstance(original, BaseException):
            current = original
        else:
            current = current.__cause__ or current.__context__


def upstream_error(exc: BaseException, *, started: bool) -> UpstreamError:
    """A litellm exception as the gateway's error. `started`: a stream chunk was already read."""
    if isinstance(exc, UpstreamError):
        return exc
    import httpx

    litellm = load_litellm()
    chain = list(_chain(exc))
    summary = _message_of(exc)
    code = _openai_code(litellm, chain)

    # The provider's HTTP answer, when it gave one: its own status, body and headers.
    for error in chain:
        if isinstance(error, httpx.HTTPStatusError):
            response = error.response
            try:
                text = response.text
            except httpx.ResponseNotRead:
                text = ""
            return _http_error(
                response.status_code, text, response.headers.get("retry-after"), summary, code=code
            )

    if any(isinstance(e, (litellm.Timeout, httpx.TimeoutException)) for e in chain):
        if any(isinstance(e, httpx.ConnectTimeout) for e in chain):
            phase = "connect"
        else:
            phase = "idle" if started else "first_token"
        return UpstreamTimeout(f"the upstream timed out: {summary}", phase=phase)

    # A provider error litellm raised itself, e.g. from an error event inside a 200 stream.
    base = _provider_exception_class()
    for error in chain:
        status = getattr(error, "status_code", None)
        if (
            base is not None
            and isinstance(error, base)
            and isinstance(status, int)
            and status >= 400
            and not getattr(error, "status_code_is_synthesized", False)
        ):
            message = _message_of(error)
            if started:
                return UpstreamStreamError(message, upstream={"code": status, "message": message})
            return _http_error(status, "", _header(exc, "retry-after"), message, code=code)

    if any(_is_connect_failure(e) for e in chain):
        return UpstreamConnectError(f"cannot reach the upstream: {summary}")
    if any(_is_broken_read(e) for e in chain):
        where = " mid-stream" if started else ""
        return UpstreamProtocolError(f"the upstream connection broke{where}: {summary}")
    if isinstance(exc, litellm.APIConnectionError):
        # litellm's catch-all (its status 500 is made up): a missing key, an answer it could
        # not parse, a bug of its own. Another deployment may well do better.
        if started:
            return UpstreamProtocolError(f"the upstream stream failed: {summary}")
        return UpstreamError(f"the litellm call failed: {summary}")

    # litellm's own verdict (a parameter the provider rejects, a missing key, ...).
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and 400 <= status < 600:
        if started:
            return UpstreamStreamError(summary, upstream={"code": status, "message": summary})
        return _http_error(status, "", _header(exc, "retry-after"), summary, code=code)
    return UpstreamError(f"the litellm call failed: {type(exc).__name__}: {summary}")


def _openai_code(litellm: Any, chain: list[BaseException]) -> str | None:
    """OpenAI's error code for the failures litellm recognises across providers."""
    for error in chain:
        if isinstance(error, litellm.ContextWindowExceededError):
            return "context_length_exceeded"
        if isinstance(error, litellm.ContentPolicyViolationError):
            return "content_policy_violation"
    return None


@cache
def _provider_exception_class() -> type[BaseException] | None:
    """litellm's base class for the errors its provider integrations raise."""
    try:
        module = importlib.import_module("litellm.llms.base_llm.chat.transformation")
    except ImportError:  # pragma: no cover - litellm moved it
        return None
    cls = getattr(module, "BaseLLMException", None)
    return cls if isinstance(cls, type) and issubclass(cls, BaseException) else None


def _is_connect_failure(error: BaseException) -> bool:
    import httpx

    if isinstance(error, (httpx.ConnectError, ConnectionRefusedError)):
        return True
    try:
        import aiohttp
    except ImportError:  # pragma: no cover
        return False
    return isinstance(error, aiohttp.ClientConnectorError)


def _is_broken_read(error: BaseException) -> bool:
    import httpx

    return isinstance(error, (httpx.ReadError, httpx.RemoteProtocolError, ConnectionResetError))


def _message_of(exc: BaseException) -> str:
    message = getattr(exc, "message", None)
    text = message if isinstance(message, str) and message else str(exc)
    text = text.split("Traceback (most recent call last)", 1)[0]  # some embed one
    text = _LITELLM_PREFIX.sub("", text).strip()
    if text.startswith(("b'", 'b"')) and text.endswith(("'", '"')):
        text = text[2:-1]  # a bytes repr of the provider's body
    if len(text) > _MESSAGE_LIMIT:
        text = text[:_MESSAGE_LIMIT] + "..."
    return text or type(exc).__name__


def _header(exc: BaseException, name: str) -> str | None:
    headers = getattr(exc, "litellm_response_headers", None) or getattr(exc, "headers", None)
    if headers is None:
        return None
    try:
        value = headers.get(name)
    except AttributeError:
        return None
    return value if isinstance(value, str) else None


def _http_error(
    status: int,
    text: str,
    retry_after_header: str | None,
    fallback: str,
    *,
    code: str | None = None,
) -> UpstreamHTTPError:
    """The provider's HTTP error as the gateway's, with an OpenAI-shaped error body.

    `text` is the provider's response body when litellm kept it; `fallback` is litellm's own
    message (which usually quotes that body).
    """
    payload: Any = None
    for candidate in (text, fallback):
        try:
            payload = orjson.loads(candidate)
            break
        except orjson.JSONDecodeError:
            continue
    if isinstance(payload, list) and payload and isinstance(payload[0], dict):
        payload = payload[0]  # Vertex AI wraps some errors in an array
    error = payload.get("error") if isinstance(payload, dict) else None
    message: str | None = None
    retry_after = retry_after_seconds(retry_after_header)
    if isinstance(error, dict):  # Google, OpenAI, Anthropic: {"error": {"message": ...}}
        if isinstance(error.get("message"), str):
            message = error["message"]
        if retry_after is None:
            retry_after = _google_retry_delay(error.get("details"))
    elif isinstance(error, str):
        message = error
    elif isinstance(payload, dict) and isinstance(payload.get("message"), str):
        message = payload["message"]  # Bedrock, Cohere
    if not message:
        if text.strip():  # not JSON: a proxy's HTML page, say
            message = f"upstream returned HTTP {status}: {text.strip()[:_ERROR_TEXT_LIMIT]}"
        else:
            message = fallback or f"upstream returned HTTP {status}"
    # Type and code follow the status, as for the native adapters, unless litellm knew better.
    shape = UpstreamHTTPError(status, message)
    body = {
        "error": {
            "message": message,
            "type": shape.type,
            "code": code or shape.code,
            "param": None,
        }
    }
    return UpstreamHTTPError(status, message, body=body, retry_after=retry_after)


def _google_retry_delay(details: Any) -> float | None:
    for detail in details if isinstance(details, list) else ():
        if isinstance(detail, dict) and str(detail.get("@type", "")).endswith("RetryInfo"):
            match = _GOOGLE_DELAY.match(str(detail.get("retryDelay", "")))
            if match:
                return float(match.group(1))
    return None
