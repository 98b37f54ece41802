"""The gateway's one error tree.

    GatewayError                      500 server_error
    ├── InvalidRequest                400 invalid_request_error (names the offending `param`)
    │   ├── UnsupportedParameter      400 unsupported_parameter: a deployment cannot carry it
    │   ├── ThreadUnsupported         400 thread_unsupported_request: Anthropic's `thread`
    │   └── PayloadTooLarge           413
    ├── Unauthorized                  401 no key, an unknown, revoked or expired key
    ├── Forbidden                     403 a team key on an admin endpoint
    ├── NotFound                      404 (unknown conversation, route, ...)
    │   └── ModelNotFound             404 model_not_found
    ├── Conflict                      409
    ├── TooManyFailedKeys             429 too_many_failed_keys: wrong keys from one address
    ├── LimitExceeded                 429 rate_limit_exceeded: a rate limit of a key or team
    │   └── BudgetExceeded            429 budget_exceeded (insufficient_quota)
    ├── ServiceUnavailable            503 (shutting down)
    │   └── StoreUnreachable          503 store_unavailable: what needs the store, retried soon
    └── UpstreamError                 502 a provider fault; `retryable` says if another try may help
        ├── UpstreamHTTPError         the provider's own status (429, 500, 400, ...)
        ├── UpstreamConnectError      502 connection refused, DNS, TLS
        ├── UpstreamTimeout           504
        ├── UpstreamStreamError       an in-band error event in an otherwise 200 stream
        └── UpstreamProtocolError     502 malformed SSE, invalid JSON, a reset mid-stream
            └── UpstreamIncompleteStream  a clean end without finish_reason

Each class knows its HTTP status, its OpenAI error `type` and `code`, whether a retry may help,
and a low-cardinality `label` for metrics. `to_openai()` is the only place the error body is
shaped; `gateway.http.middleware` is the only place it becomes an HTTP response. An error the
gateway answers after spending its own retry budget on it is marked `retries_spent`: the response
then tells the client's SDK not to retry it again (`x-should-retry: false`).
"""

from __future__ import annotations

import math
from typing import Any


class GatewayError(Exception):
    status: int = 500
    type: str = "server_error"
    code: str = "internal_error"
    retryable: bool = False
    # The gateway already retried this request as far as its retry policy allows (or it was
    # cancelled on purpose): a client retry would only repeat that (gateway.http.middleware).
    retries_spent: bool = False
    # Machine-readable detail an Anthropic error body carries as `error.details`: its
    # `error_code` is what Anthropic's SDKs branch on to recover by themselves.
    details: dict[str, Any] | None = None

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        # Response headers the error should still carry (X-Conversation-Id, ...).
        self.headers: dict[str, str] = {}

    @property
    def label(self) -> str:
        return self.code

    def to_openai(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": openai_type(self.type),
                "code": self.code,
                "param": self.param,
            }
        }


# Anthropic error types with no OpenAI counterpart -> the type an OpenAI client gets instead
# (the `code` keeps the detail: `overloaded`, `billing_error`, ...). The Anthropic dialect
# chooses its own types by status, so nothing is lost for Anthropic clients.
_OPENAI_TYPES = {
    "api_error": "server_error",
    "overloaded_error": "server_error",
    "timeout_error": "server_error",
    "billing_error": "insufficient_quota",
    "request_too_large": "invalid_request_error",
}


def openai_type(kind: str) -> str:
    """An error `type` from OpenAI's set (the gateway's own types are in it)."""
    return _OPENAI_TYPES.get(kind, kind)


def openai_body(error: GatewayError) -> dict[str, Any]:
    """The OpenAI error body an HTTP response carries: `to_openai()`, its type from OpenAI's set
    also when the body is the provider's own."""
    body = error.to_openai()
    inner = body.get("error")
    kind = inner.get("type") if isinstance(inner, dict) else None
    if isinstance(inner, dict) and isinstance(kind, str) and openai_type(kind) != kind:
        return {**body, "error": {**inner, "type": openai_type(kind)}}
    return body


class InvalidRequest(GatewayError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class UnsupportedParameter(InvalidRequest):
    """A request parameter a deployment of the plan cannot carry (gateway.providers.params)."""

    code = "unsupported_parameter"


class ThreadUnsupported(InvalidRequest):
    """Anthropic's message threads (`thread`), which the gateway does not hold: it records each
    conversation itself and may send any turn to any deployment, so a client sends its whole
    history. On this code Anthropic's SDKs (`toolRunner()`, message threads) send the turn
    again without `thread`, and every later one with the full history."""

    code = "thread_unsupported_request"

    def __init__(self, message: str, *, param: str) -> None:
        super().__init__(message, param=param)
        self.details = {"error_code": self.code, "unsupported": []}


class ConversationLocked(InvalidRequest):
    """A Responses request on a conversation in which a turn is running: as OpenAI answers it,
    so clients written against OpenAI handle it as they already do. Two responses built on
    one conversation at once would each leave the other's turn out of its history, and the
    conversation would hold two questions, then two answers."""

    code = "conversation_locked"

    def __init__(self, param: str) -> None:
        super().__init__(
            "Another process is currently operating on this conversation."
            " Please retry in a few seconds.",
            param=param,
        )


class RequestTimeout(InvalidRequest, TimeoutError):
    """408: the request did not arrive in time (gateway.downstream.slow_clients).

    Also a TimeoutError so that aiohttp, draining the rest of the abandoned body after the
    answer, takes it as the timeout it is and closes the connection quietly.
    """

    status = 408
    code = "request_timeout"


class PayloadTooLarge(InvalidRequest):
    status = 413
    code = "payload_too_large"


class Unauthorized(GatewayError):
    status = 401
    type = "invalid_request_error"  # what OpenAI answers, so SDKs raise AuthenticationError
    code = "invalid_api_key"


class Forbidden(GatewayError):
    status = 403
    type = "permission_error"
    code = "forbidden"


class PriceUnknown(Forbidden):
    """A deployment the request may reach has no price, under a hard budget that could not
    count its cost (gateway.metering.prices.require_price)."""

    code = "price_unknown"


class NotFound(GatewayError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class Conflict(GatewayError):
    status = 409
    type = "invalid_request_error"
    code = "conflict"


class TooManyFailedKeys(GatewayError):
    """Past `auth.max_failures` wrong keys from one address (gateway.http.auth_failures)."""

    status = 429
    type = "rate_limit_error"
    code = "too_many_failed_keys"

    def __init__(self, retry_after_s: float) -> None:
        seconds = max(1, math.ceil(retry_after_s))
        super().__init__(f"Too many wrong API keys from this address: try again in {seconds} s.")
        self.headers["Retry-After"] = str(seconds)


class LimitExceeded(GatewayError):
    """A rate limit of the key, team or end user (gateway.metering.limits)."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"


class BudgetExceeded(LimitExceeded):
    type = "insufficient_quota"
    code = "budget_exceeded"


class ServiceUnavailable(GatewayError):
    status = 503
    type = "server_error"
    code = "service_unavailable"


class StoreUnreachable(ServiceUnavailable):
    """What needed the store and could not do without it (a read, a key's first lookup): worth
    retrying shortly. Writes alone never get here: they wait in the spool."""

    code = "store_unavailable"
    retryable = True
    # About how long the spool's replay takes to notice the store is back.
    RETRY_AFTER_S = 5

    def __init__(self) -> None:
        super().__init__("The gateway's store is unavailable right now; retry shortly.")
        self.headers["Retry-After"] = str(self.RETRY_AFTER_S)


class UpstreamError(GatewayError):
    """A provider fault. Recorded as an attempt; never a crash."""

    status = 502
    type = "upstream_error"
    code = "upstream_error"
    retryable = True


_RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504, 529})


class UpstreamHTTPError(UpstreamError):
    """The provider answered with an HTTP error before streaming began."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.retryable = status in _RETRYABLE_STATUSES
        self.retry_after = retry_after
        if retry_after is not None:
            self.headers["Retry-After"] = f"{retry_after:g}"
        # The provider's own error object, passed through to the client when it has one.
        self.body = body
        error = (body or {}).get("error")
        if isinstance(error, dict):
            self.type = str(error.get("type") or _type_for(status))
            code = error.get("code")
            self.code = str(code) if code is not None else _code_for(status)
            self.param = error.get("param") if isinstance(error.get("param"), str) else None
        else:
            self.type = _type_for(status)
            self.code = _code_for(status)

    @property
    def label(self) -> str:
        return f"http_{self.status}"

    def to_openai(self) -> dict[str, Any]:
        if self.body is not None and isinstance(self.body.get("error"), dict):
            return self.body  # the provider's own (an HTTP response maps its type: openai_body)
        return super().to_openai()


class UpstreamConnectError(UpstreamError):
    code = "upstream_connect_error"


class UpstreamTimeout(UpstreamError):
    status = 504
    code = "upstream_timeout"

    def __init__(self, message: str, *, phase: str):
        super().__init__(message)
        # connect | first_token | idle | total: each is a distinct recorded error.
        self.phase = phase
        self.code = f"upstream_timeout_{phase}"


class UpstreamStreamError(UpstreamError):
    """An error event inside a 200 stream (OpenRouter's error chunk, Groq's `event: error`)."""

    code = "upstream_stream_error"

    def __init__(self, message: str, *, upstream: dict[str, Any] | None = None):
        super().__init__(message)
        upstream = upstream or {}
        code = upstream.get("code")
        if code is not None:
            self.code = str(code)
        status = upstream.get("status_code")
        if isinstance(code, int) and 400 <= code < 600:
            status = code
        self.upstream_status = status if isinstance(status, int) else None
        self.retryable = self.upstream_status is None or self.upstream_status in _RETRYABLE_STATUSES
        if isinstance(upstream.get("type"), str):
            self.type = upstream["type"]


class UpstreamProtocolError(UpstreamError):
    code = "upstream_protocol_error"


class UpstreamIncompleteStream(UpstreamProtocolError):
    """The stream ended cleanly but without its terminal event (no finish_reason)."""

    code = "upstream_incomplete_stream"


def _type_for(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 403:
        return "permission_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if 400 <= status < 500:
        return "invalid_request_error"
    return "upstream_error"


def _code_for(status: int) -> str:
    return {
        400: "bad_request",
        401: "invalid_api_key",
        403: "permission_denied",
        404: "not_found",
        408: "request_timeout",
        422: "unprocessable_entity",
        429: "rate_limit_exceeded",
        529: "overloaded",
    }.get(status, "upstream_error")
