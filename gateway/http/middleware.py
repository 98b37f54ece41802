"""Request ids, the access log, and the one place errors become HTTP responses (without secrets:
gateway.scrub).

Every request gets an id (the client's `X-Request-Id` when it is a safe one, else a new one):
answered in `X-Request-Id`, and set for the log (gateway.logs) so that every record made while
serving the request carries it. When the request is done, one access record: for a stream when
its response has finished, or when its client left (or the server stopped) before it did."""

from __future__ import annotations

import logging
import re
import time
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from gateway import logs, metrics, scrub
from gateway.context import ERROR_DIALECTS, GATEWAY, Gateway
from gateway.dialects.base import Dialect
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ServiceUnavailable,
    StoreUnreachable,
    openai_body,
)
from gateway.http.auth import PRINCIPAL
from gateway.ids import sortable_hex
from gateway.metering.auth import presented_key
from gateway.storage.db import StoreUnavailable

log = logging.getLogger(__name__)

REQUEST_ID = web.RequestKey("request_id", str)
# The response whose status line and headers went out (set when it is prepared): what a client
# that left mid-stream was sent.
_SENT = web.RequestKey("sent_response", web.StreamResponse)
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
# A virtual key's first characters, as the store keeps them to recognise it
# (gateway.metering.admin): the access log names a key by them, never by more.
KEY_PREFIX_LENGTH = 7
# A request that arrives once the gateway is stopping (on a connection kept alive): a 503.
_STOPPING = "The gateway is shutting down; send the request again (another replica answers it)."


def _dialect(request: web.Request) -> Dialect | None:
    dialects = request.app.get(ERROR_DIALECTS)
    return dialects.get(request.match_info.route) if dialects else None


def error_response(
    error: GatewayError, dialect: Dialect | None = None, *, tell_not_to_retry: bool = True
) -> web.Response:
    """The error in the shape of the route's `dialect` (ERROR_DIALECTS), else OpenAI's.
    `tell_not_to_retry` (`server.tell_clients_not_to_retry`): an error the gateway already
    retried as far as its retry policy goes says `x-should-retry: false`, which the OpenAI and
    Anthropic SDKs obey before their own retry rules (a `Retry-After` passed on stays)."""
    # No secret in any error answered: an upstream's message or body quoting its key, a key
    # a client sent echoed back in a message (gateway.scrub).
    body = scrub.scrub_json(dialect.error_body(error) if dialect else openai_body(error))
    headers = error.headers
    if tell_not_to_retry and error.retries_spent:
        headers = {**headers, "x-should-retry": "false"}
    return web.Response(
        status=error.status,
        body=orjson.dumps(body),
        content_type="application/json",
        headers=headers,
    )


def _from_http_exception(exc: web.HTTPException) -> GatewayError:
    if isinstance(exc, web.HTTPRequestEntityTooLarge):
        return PayloadTooLarge(f"The request body is too large: {exc.text or ''}".strip())
    if exc.status == 404:
        return NotFound("Unknown endpoint.")
    if exc.status == 405:
        not_allowed = InvalidRequest(f"Method not allowed: {exc.reason}.", code="not_allowed")
        not_allowed.status = 405
        if "Allow" in exc.headers:  # a 405 must say what is allowed (RFC 9110)
            not_allowed.headers["Allow"] = exc.headers["Allow"]
        return not_allowed
    error = GatewayError(exc.reason or "HTTP error", code=f"http_{exc.status}")
    error.status = exc.status
    error.type = "invalid_request_error" if exc.status < 500 else "server_error"
    return error


@web.middleware
async def errors_and_ids(request: web.Request, handler: Handler) -> web.StreamResponse:
    started = time.monotonic()
    # The app's secrets are taken out of every error, record and log line from its first
    # request on (`gateway serve` has them learned before it starts; this covers an app served
    # any other way). Nothing to do after the first time.
    gateway = request.app.get(GATEWAY)
    if gateway is not None:
        scrub.learn(gateway.config)
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if _SAFE_ID.match(incoming) else sortable_hex()
    request[REQUEST_ID] = request_id
    notes = logs.begin_request(request_id)
    route = (
        request.match_info.route.resource.canonical
        if request.match_info.route.resource
        else "unmatched"
    )
    metrics.IN_FLIGHT.inc()
    error_code: str | None = None
    try:
        if gateway is not None and gateway.state["shutting_down"]:
            # A request on a connection kept alive past SIGTERM: answered, not reset.
            raise ServiceUnavailable(_STOPPING, code="shutdown")
        response = await handler(request)
    except GatewayError as error:
        tell = gateway is None or gateway.config.server.tell_clients_not_to_retry
        response = error_response(error, _dialect(request), tell_not_to_retry=tell)
        error_code = error.code
        # Answered. A frame that raised it may hold it (`error = ...; raise error`), and its
        # traceback holds that frame: without this, every frame of the request down to the
        # raise would be left to the cyclic collector.
        error.__traceback__ = None
        if error_code == "shutdown":
            response.force_close()  # `Connection: close`: the next request goes elsewhere
    except web.HTTPException as exc:
        if exc.status < 400:
            _access(request, gateway, notes, started, exc, None)  # a redirect
            raise
        gateway_error = _from_http_exception(exc)
        response = error_response(gateway_error, _dialect(request))
        error_code = gateway_error.code
        exc.__traceback__ = None  # (aiohttp's router keeps its 404 in the request's match info)
    except StoreUnavailable as exc:
        # What needed the store and could not do without it: worth retrying shortly (writes
        # alone never get here, they wait in the spool).
        log.warning("store unavailable on %s %s: %s", request.method, request.path, exc)
        unavailable = StoreUnreachable()
        response = error_response(unavailable, _dialect(request))
        error_code = unavailable.code
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        failed = GatewayError("The gateway failed to handle the request.")
        response = error_response(failed, _dialect(request))
        error_code = failed.code
    except BaseException:
        # Cancelled: the client left (or the server stopped) before the response was done.
        _access(request, gateway, notes, started, request.get(_SENT), None, interrupted=True)
        raise
    finally:
        metrics.IN_FLIGHT.dec()
        # A response holds its request until its body's end, which a stream whose client left
        # never reaches: kept here, the two would hold each other.
        request.pop(_SENT, None)
    metrics.REQUESTS.labels(route, str(response.status)).inc()
    _access(request, gateway, notes, started, response, error_code, route=route)
    return response


def _access(
    request: web.Request,
    gateway: Gateway | None,
    notes: dict[str, Any],
    started: float,
    response: web.StreamResponse | None,
    error_code: str | None,
    *,
    interrupted: bool = False,
    route: str | None = None,
) -> None:
    """The request's access record (gateway.logs), when `logging.access_log` is on."""
    if gateway is not None and not gateway.config.logging.access_log:
        return
    level = logs.access_level(request.path)
    if not logs.ACCESS.isEnabledFor(level):
        return
    if not interrupted:
        # The handler cut the answer itself (at shutdown, on a cancel), or a write found the
        # client gone and the handler answered all the same.
        transport = request.transport
        interrupted = bool(notes.get("interrupted")) or transport is None or transport.is_closing()
    headers = response.headers if response is not None else {}
    principal = request.get(PRINCIPAL)
    key_prefix = team_id = None
    if principal is not None and principal.kind == "key":
        team_id = principal.team_id
        presented = presented_key(request.headers)
        key_prefix = presented[:KEY_PREFIX_LENGTH] if presented else None
    logs.log_access(
        level,
        {
            "method": request.method,
            "path": request.path,
            # What the client was sent; 499 when it left before anything was.
            "status": response.status if response is not None else 499,
            "duration_ms": round((time.monotonic() - started) * 1000.0, 1),
            "alias": notes.get("alias"),
            "deployment": headers.get("X-Gateway-Deployment") or notes.get("deployment"),
            "key_prefix": key_prefix,
            "team_id": team_id,
            "prompt_tokens": notes.get("prompt_tokens"),
            "completion_tokens": notes.get("completion_tokens"),
            "conversation_id": headers.get("X-Conversation-Id") or notes.get("conversation_id"),
            "turn_id": headers.get("X-Gateway-Turn-Id") or notes.get("turn_id"),
            "interrupted": interrupted,
            "error": error_code or notes.get("error"),
        },
        # A path that is its route's own (no parameter in it) is the code's, not the client's.
        path_is_route=route == request.path,
    )


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every response, streamed or not, carries X-Request-Id."""
    request[_SENT] = response
    request_id = request.get(REQUEST_ID)
    if request_id:
        response.headers["X-Request-Id"] = request_id
