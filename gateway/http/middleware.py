"""Request ids, and the one place errors become HTTP responses (without secrets: gateway.scrub)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web
from aiohttp.typedefs import Handler

from gateway import metrics, scrub
from gateway.context import GATEWAY
from gateway.dialects.anthropic_messages import error_body as anthropic_error_body
from gateway.errors import GatewayError, InvalidRequest, NotFound, PayloadTooLarge, openai_body
from gateway.ids import random_hex
from gateway.storage.db import StoreUnavailable

log = logging.getLogger(__name__)

REQUEST_ID = web.RequestKey("request_id", str)
_SAFE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_STORE_RETRY_AFTER = "5"  # seconds: about how long the spool's replay takes to notice the store


# Routes whose clients speak another dialect get their errors in that dialect's shape.
_ERROR_SHAPES: dict[str, Callable[[GatewayError], dict[str, Any]]] = {
    "/v1/messages": anthropic_error_body,
}


def error_response(
    error: GatewayError, path: str = "", *, tell_not_to_retry: bool = True
) -> web.Response:
    """`tell_not_to_retry` (`server.tell_clients_not_to_retry`): an error the gateway already
    retried as far as its retry policy goes says `x-should-retry: false`, which the OpenAI and
    Anthropic SDKs obey before their own retry rules (a `Retry-After` passed on stays)."""
    shape = _ERROR_SHAPES.get(path)
    # No secret in any error answered: an upstream's message or body quoting its key, a key
    # a client sent echoed back in a message (gateway.scrub).
    body = scrub.scrub_json(shape(error) if shape is not None else openai_body(error))
    headers = error.headers
    if tell_not_to_retry and error.retries_spent:
        headers = {**headers, "x-should-retry": "false"}
    return web.Response(
        status=error.status,
        body=orjson.dumps(body),
        content_type="application/json",
        headers=headers,
    )


def store_unavailable() -> GatewayError:
    error = GatewayError(
        "The gateway's store is unavailable right now; retry shortly.", code="store_unavailable"
    )
    error.status = 503
    error.retryable = True
    error.headers["Retry-After"] = _STORE_RETRY_AFTER
    return error


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
    # The app's secrets are taken out of every error, record and log line from its first
    # request on (`gateway serve` has them learned before it starts; this covers an app served
    # any other way). Nothing to do after the first time.
    gateway = request.app.get(GATEWAY)
    if gateway is not None:
        scrub.learn(gateway.config)
    incoming = request.headers.get("X-Request-Id", "")
    request[REQUEST_ID] = incoming if _SAFE_ID.match(incoming) else random_hex(16)
    route = (
        request.match_info.route.resource.canonical
        if request.match_info.route.resource
        else "unmatched"
    )
    metrics.IN_FLIGHT.inc()
    try:
        response = await handler(request)
    except GatewayError as error:
        tell = gateway is None or gateway.config.server.tell_clients_not_to_retry
        response = error_response(error, request.path, tell_not_to_retry=tell)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        response = error_response(_from_http_exception(exc), request.path)
    except StoreUnavailable as exc:
        # What needed the store and could not do without it: worth retrying shortly (writes
        # alone never get here, they wait in the spool).
        log.warning("store unavailable on %s %s: %s", request.method, request.path, exc)
        response = error_response(store_unavailable(), request.path)
    except Exception:
        log.exception("unhandled error on %s %s", request.method, request.path)
        response = error_response(
            GatewayError("The gateway failed to handle the request."), request.path
        )
    finally:
        metrics.IN_FLIGHT.dec()
    metrics.REQUESTS.labels(route, str(response.status)).inc()
    return response


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: every response, streamed or not, carries X-Request-Id."""
    request_id = request.get(REQUEST_ID)
    if request_id:
        response.headers["X-Request-Id"] = request_id
