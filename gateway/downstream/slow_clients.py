"""Bounds on how long a client may take to send a request, and clear 4xx for malformed ones.

A slowloris client opens connections and sends a request head a byte at a time, holding a
connection (and its buffers) for as long as it likes; a slow-POST client does the same with a
body. aiohttp alone does not stop either: its keep-alive timer is an idle timeout (an hour by
default), and nothing times a body a handler is reading. So:

- **Head** (`server.header_timeout_s`): a new connection must deliver its first request head
  whole within the limit, and on a kept-alive connection a head must be whole within the limit
  of its first byte. Otherwise the connection is closed, after a `408` when part of a head came;
  that close lingers (RFC 9112 section 9.6): the gateway half-closes and drops what the client
  still sends for up to `LINGER_S`, since closing a socket with bytes unread resets it and the
  client's kernel may then throw the `408` away unread.
  Idle keep-alive connections (no byte of a next request) are left to aiohttp's keep-alive
  timeout, so a load balancer's pooled connections are not cut. This lives in a subclass of
  aiohttp's `web.RequestHandler` (the protocol of one connection), made by `guarded_runner`:
  used by `gateway serve` and by the tests that exercise it.
- **Body** (`server.body_timeout_s`): `request_limits` times the body from the moment the
  handler starts; a body still incomplete then fails the handler's read with `408`, and the
  connection is closed after that answer. A declared `Content-Length` over `server.max_body_mb`
  is refused with `413` before anything is read, and a NUL in the path or query with `400`.
- **Malformed heads** (aiohttp's parser limits: request line and header fields of at most 8190
  bytes, at most 128 headers): `414` for a request line that is too long, `431` for header
  fields too long or too many, `400` otherwise, each as an OpenAI error JSON (aiohttp's own
  answer is plain text, logged with a traceback).

- **Idle connections and their number** (`server.keepalive_timeout_s`,
  `server.max_connections`): a kept-alive connection idle for the keep-alive timeout is closed
  (aiohttp's default is an hour). A connection over the cap (`ConnectionCap`) is still read,
  within the head deadline: its request is answered `503` and the connection closed, except
  `/health/live`, answered as usual (a replica at its cap is alive, not dead). At most a small
  reserve of these are read at once, a newer one pushing the oldest out with a `503`, so a
  flood of silent connections holds no more than the cap and the reserve. A line is logged at
  most once a minute while connections are refused. The cap is lowered at start to what the
  process's file limit holds (`RLIMIT_NOFILE`, raised to its hard limit first), so that it is
  reached before `accept()` fails.

What the guard needs of aiohttp beyond its public API (whether a connection awaits a request,
how many heads it has parsed, and a runner that makes the guard its connections' protocol) it
asks gateway.downstream.aiohttp_internals; tests/security/test_limits_and_slow_clients.py pins the
behaviour.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import re
import resource
import time
from typing import Any, Protocol

import orjson
from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError, LineTooLong
from aiohttp.typedefs import Handler, Middleware

from gateway import metrics, scrub
from gateway.config import ServerConfig
from gateway.downstream.aiohttp_internals import (
    awaiting_request,
    connection_runner,
    requests_received,
)
from gateway.downstream.delivery import ConnectionSocket
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    ServiceUnavailable,
)

log = logging.getLogger(__name__)

LINGER_S = 2.0  # how long a connection cut off with a 408 is drained before it is closed
REFUSAL_LOG_S = 60.0  # at most one line this often about connections over the cap
FDS_PER_CONNECTION = 3  # its socket, its duplicate for delivery tracking, an upstream's
RESERVED_FDS = 128  # the store, spool, journal, listening sockets, Redis, logs
LIVE = "/health/live"  # answered on a connection over the cap too


# -- the body ------------------------------------------------------------------------------------


def request_limits(
    body_timeout_s: float, upload_max: int = 0, uploads: frozenset[str] = frozenset()
) -> Middleware:
    """Middleware: 400 for a NUL in the URL, 413 for a declared body over the limit (the
    `upload_max` of a multipart upload to one of the `uploads` paths), 408 for a body that
    comes too slowly."""

    def expire(request: web.Request) -> None:
        if not request.content.is_eof():  # not all of it received yet
            request.content.set_exception(
                RequestTimeout(f"The request body did not arrive within {body_timeout_s:g} s.")
            )

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        # A connection over the cap (SlowClientGuard.over_cap): one answer, then closed.
        if getattr(request.protocol, "over_cap", False) is True:
            request.protocol.close()  # after this answer
            if request.path != LIVE:
                busy = ServiceUnavailable(
                    "The gateway has too many open connections; try again shortly.",
                    code="too_many_connections",
                )
                busy.headers["Retry-After"] = "1"
                raise busy
        # No store holds NUL in an id or a filter (PostgreSQL text refuses it): one answer on
        # every backend rather than a 404 on one and a refusal on another.
        if "\x00" in request.path or any("\x00" in k + v for k, v in request.query.items()):
            raise InvalidRequest("The URL contains a NUL character (%00).")
        length = request.content_length
        limit = request.client_max_size
        if uploads and request.path in uploads and request.content_type == "multipart/form-data":
            limit = max(limit, upload_max)
        if length is not None and length > limit:
            raise PayloadTooLarge(
                f"The request body is too large: {length} bytes, the limit is {limit}."
            )
        if request.content.is_eof():  # no body, or all of it here already
            return await handler(request)
        timer = asyncio.get_running_loop().call_later(body_timeout_s, expire, request)
        try:
            return await handler(request)
        finally:
            timer.cancel()

    return middleware


# -- the head ------------------------------------------------------------------------------------


def _raw_error(status: int, reason: str, error: GatewayError) -> bytes:
    body = orjson.dumps(error.to_openai())
    head = (
        f"HTTP/1.1 {status} {reason}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class Refusable(Protocol):
    def refuse(self) -> None:
        """Answer 503 if nothing was answered yet, and close."""
        ...


class ConnectionCap:
    """The open client connections of one listening server, against `server.max_connections`.

    A connection is admitted while fewer than `limit` are; one over the cap is read for its
    request (answered 503, or `/health/live`), among at most `reserve` such at once: a new one
    past those pushes the oldest out (a 503 and a close), so that a flood of silent connections
    cannot keep a health probe from being read."""

    def __init__(self, limit: int, reserve: int | None = None) -> None:
        self.limit = limit
        self.reserve = reserve if reserve is not None else max(8, limit // 100)
        self.open = 0  # admitted connections open
        self.waiting: dict[Refusable, None] = {}  # over the cap, oldest first
        self.refused = 0  # since the last line logged
        self._logged_at: float | None = None

    def admit(self, connection: Refusable) -> bool:
        """True: admitted; False: over the cap."""
        if self.open < self.limit:
            self.open += 1
            return True
        self.refused += 1
        metrics.CONNECTIONS_REFUSED.inc()
        now = time.monotonic()
        if self._logged_at is None or now - self._logged_at >= REFUSAL_LOG_S:
            log.warning(
                "%d client connections open, the cap (server.max_connections): new ones are"
                " answered 503 (%d since the last such line)",
                self.open,
                self.refused,
            )
            self._logged_at, self.refused = now, 0
        if len(self.waiting) >= self.reserve:
            oldest = next(iter(self.waiting))
            del self.waiting[oldest]
            oldest.refuse()
        self.waiting[connection] = None
        return False

    def release(self, connection: Refusable, admitted: bool) -> None:
        if admitted:
            self.open -= 1
        else:
            self.waiting.pop(connection, None)


_BUSY = _raw_error(
    503,
    "Service Unavailable",
    ServiceUnavailable(
        "The gateway has too many open connections; try again shortly.",
        code="too_many_connections",
    ),
)


class SlowClientGuard(web.RequestHandler):
    """aiohttp's connection protocol, with a deadline on each request head, under a cap on
    open connections."""

    def __init__(
        self,
        manager: web.Server,
        *,
        header_timeout_s: float,
        cap: ConnectionCap | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(manager, **kwargs)
        self._header_timeout_s = header_timeout_s
        self._cap = cap
        self._counted = False  # by the cap, until the connection is lost
        self.over_cap = False  # answered 503 (gateway.downstream.slow_clients.request_limits)
        self._deadline: asyncio.TimerHandle | None = None
        self._partial = False  # part of a head has arrived
        self._lingering: asyncio.TimerHandle | None = None  # cut off: draining until closed
        # A duplicate of this connection's socket, for the delivery tracking of every stream
        # it carries (gateway.downstream.delivery); made by the first.
        self.delivery_socket: ConnectionSocket | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._arm()  # a new connection owes its first head within the limit
        if self._cap is not None:
            self.over_cap = not self._cap.admit(self)
            self._counted = True

    def refuse(self) -> None:
        """Pushed out by a newer connection over the cap: a 503 unless an answer has begun (a
        head was read), and closed."""
        if self.transport is not None and requests_received(self) == 0:
            self.transport.write(_BUSY)
        self.force_close()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._cap is not None and self._counted:
            self._cap.release(self, admitted=not self.over_cap)
            self._counted = False
        self._disarm()
        if self._lingering is not None:
            self._lingering.cancel()
            self._lingering = None
        if self.delivery_socket is not None:
            self.delivery_socket.connection_lost()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering is not None:
            return  # cut off with a 408: what still comes is read and dropped
        # Waiting for a next request: these bytes begin its head.
        waiting = awaiting_request(self)
        heads = requests_received(self)
        super().data_received(data)
        if requests_received(self) != heads:
            self._disarm()  # a head arrived whole (or was refused)
        elif data and (waiting or self._deadline is not None):
            if self._deadline is None:
                self._arm()
            self._partial = True

    def _arm(self) -> None:
        loop = asyncio.get_running_loop()  # called from the loop's callbacks only
        self._deadline = loop.call_later(self._header_timeout_s, self._expired)
        self._partial = False

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        self._deadline = None
        if self.transport is None:
            return
        if self._partial:  # else the connection sent nothing at all: just close it
            log.info("closing a connection whose request head was not whole in time")
            error = RequestTimeout(
                f"The request head did not arrive within {self._header_timeout_s:g} s."
            )
            self.transport.write(_raw_error(408, "Request Timeout", error))
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the 408 and then the end; bytes may still come in
                # (Kept set once fired: bytes are dropped until the connection is gone.)
                loop = asyncio.get_running_loop()
                self._lingering = loop.call_later(LINGER_S, self.force_close)
                return
        self.force_close()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        """A request aiohttp could not parse (or a failure outside the app's middleware), as an
        OpenAI error JSON with the most precise status."""
        if request.writer.output_size > 0:
            raise ConnectionError("the response has begun; no error answer can follow")
        error = _parse_error(status, exc, message)
        if error.status >= 500:
            self.log_exception("Error handling request", exc_info=exc)
        else:
            log.info("refused a malformed request (%d): %s", error.status, error.message)
        response = web.Response(
            status=error.status,
            body=orjson.dumps(error.to_openai()),
            content_type="application/json",
        )
        response.force_close()
        return response


# What aiohttp's parser quotes of the request in its messages: the bytes of a line or a header
# (`b'Authorization: Bearer sk-...\x01'`), never to be echoed or logged.
_QUOTED = re.compile(r"b?'(?:[^'\\\n]|\\.)*'" r'|b?"(?:[^"\\\n]|\\.)*"')


def _described(detail: str) -> str:
    """aiohttp's description of a malformed request, without any byte of the request: its first
    line, quoted parts dropped (then scrubbed, for what the quoting missed)."""
    first = detail.strip().split("\n", 1)[0]
    first = _QUOTED.sub("...", first)
    first = re.split("['\"]", first, maxsplit=1)[0]  # an unterminated quote: cut there
    return scrub.scrub(first.strip().rstrip(":").strip())


def _parse_error(status: int, exc: BaseException | None, message: str | None) -> GatewayError:
    if status >= 500:
        return GatewayError("The gateway failed to handle the request.")
    detail = _described(exc.message if isinstance(exc, HttpProcessingError) else (message or ""))
    if isinstance(exc, LineTooLong):
        line = exc.args[0] if exc.args else b""
        limit = exc.args[1] if len(exc.args) > 1 else "8190"
        if isinstance(line, bytes | bytearray | str) and line[:1] in (b"/", "/"):  # the target
            error = InvalidRequest(
                f"The request line is too long (over {limit} bytes).", code="uri_too_long"
            )
            error.status = 414
            return error
        error = InvalidRequest(
            f"A header field is too long (over {limit} bytes).", code="header_too_large"
        )
        error.status = 431
        return error
    if isinstance(exc, BadHttpMessage) and "Too many headers" in detail:
        error = InvalidRequest(f"{detail}.", code="header_too_large")
        error.status = 431
        return error
    error = InvalidRequest(f"The HTTP request is malformed: {detail}", code="bad_http_request")
    error.status = status if 400 <= status < 500 else 400
    return error


def guarded_runner(app: web.Application, server: ServerConfig, **kwargs: Any) -> web.AppRunner:
    """An AppRunner whose connections have the head deadline of `server.header_timeout_s`, the
    idle timeout of `server.keepalive_timeout_s` and the cap of `server.max_connections`."""
    kwargs.setdefault("keepalive_timeout", server.keepalive_timeout_s)
    guard = functools.partial(
        SlowClientGuard,
        header_timeout_s=server.header_timeout_s,
        cap=ConnectionCap(
            connection_cap(
                server.max_connections, chosen="max_connections" in server.model_fields_set
            )
        ),
    )
    return connection_runner(app, guard, **kwargs)


def connection_cap(configured: int, *, chosen: bool = True) -> int:
    """`server.max_connections`, or fewer: as many as the process's file limit holds, once
    raised to its hard limit where it is lower than the cap needs. Lowering a cap the operator
    `chosen` is a warning; lowering the default, a line of information."""
    needed = configured * FDS_PER_CONNECTION + RESERVED_FDS
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft != resource.RLIM_INFINITY and soft < needed:
            raised = needed if hard == resource.RLIM_INFINITY else min(hard, needed)
            if raised > soft:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
    except (OSError, ValueError):
        return configured
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return configured
    cap = max(1, (soft - RESERVED_FDS) // FDS_PER_CONNECTION)
    log.log(
        logging.WARNING if chosen else logging.INFO,
        "server.max_connections is %d, but the file limit (ulimit -n) of %d holds %d client"
        " connections: capped at %d (raise LimitNOFILE or ulimit -n for more)",
        configured,
        soft,
        cap,
        cap,
    )
    return cap
