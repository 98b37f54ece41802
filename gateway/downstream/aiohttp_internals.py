"""Every private name of a dependency the gateway relies on, in one place: aiohttp's.

aiohttp has no public way to say three things the gateway needs, so this module says them,
and nothing else in `gateway` reads or overrides a dependency's private name
(tests/test_private_names.py holds the package to that):

- **A stream's byte count** (`payload_output_size`): how many bytes of a response have gone to
  the transport, status line and headers included; the delivery tracker maps them to the bytes
  the peer acknowledged (gateway.downstream.delivery). It is the payload writer's `output_size`, and
  the response's writer is private (`_payload_writer`).
- **Headers with the first frames** (`EventStreamResponse`): `prepare()` normally sends the
  status line and headers at once, in a send of their own; this response keeps them for its
  first write (the class attribute `_send_headers_immediately`, which aiohttp's own `Response`
  sets the same way).
- **The connection's protocol** (`connection_runner`, `awaiting_request`, `requests_received`):
  the slow-client guard (gateway.downstream.slow_clients) is a `web.RequestHandler` subclass,
  which an `AppRunner` does not let one choose (its private `_make_server`, and the server's
  `_loop` and `_kwargs` to make the handlers as aiohttp would); it times request heads by
  whether the connection is waiting for one (`_waiter`) and how many it has parsed
  (`_request_count`).

tests/downstream/test_aiohttp_internals.py checks each of these names on the installed aiohttp and
exercises them over a real loopback connection; pyproject.toml bounds aiohttp to what that test
has seen (>=3.14.5,<3.15). A new aiohttp minor: run that test first, then widen the bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from aiohttp import web

# How a connection's protocol is made: called as `factory(server, loop=loop, **handler_kwargs)`,
# the arguments aiohttp gives `web.RequestHandler` (handler_kwargs: the runner's keyword
# arguments such as `keepalive_timeout`, `access_log`).
HandlerFactory = Callable[..., web.RequestHandler]


# -- responses -----------------------------------------------------------------------------------


class EventStreamResponse(web.StreamResponse):
    """A StreamResponse whose status line and headers leave with its first write, in one send
    (not in a send of their own at `prepare()`): for a response started only when it has bytes
    to write at once. `payload_output_size` is 0 until that first write."""

    _send_headers_immediately = False


def payload_output_size(response: web.StreamResponse) -> int:
    """The bytes of `response` written to the transport so far (status line, headers and chunk
    framing included); 0 when it has no payload writer: before `prepare()`, and after
    `write_eof()`, which lets go of it (its total is then the public `response.body_length`)."""
    writer = response._payload_writer
    return writer.output_size if writer is not None else 0


# -- connections ---------------------------------------------------------------------------------


def awaiting_request(handler: web.RequestHandler) -> bool:
    """Whether the connection is idle between requests: its handler waits for a next request
    and no byte of one has been parsed into a message yet (a head partly received still
    counts as awaited). False while a request is being handled."""
    waiter: asyncio.Future[None] | None = handler._waiter
    return waiter is not None and not waiter.done()


def requests_received(handler: web.RequestHandler) -> int:
    """Request heads the connection has parsed whole so far, a head the parser refused
    included: it moves in `data_received` when a head is complete."""
    count: int = handler._request_count
    return count


class _ConnectionServer(web.Server):
    """aiohttp's low-level server (the protocol factory of the listening socket), its
    connections' protocols made by a factory."""

    def __init__(self, inner: web.Server, factory: HandlerFactory) -> None:
        super().__init__(
            inner.request_handler,
            request_factory=inner.request_factory,
            handler_cancellation=inner.handler_cancellation,
            loop=inner._loop,
            **inner._kwargs,
        )
        self.connection_factory = factory

    def __call__(self) -> web.RequestHandler:
        return self.connection_factory(self, loop=self._loop, **self._kwargs)


class _ConnectionRunner(web.AppRunner):
    def __init__(self, app: web.Application, factory: HandlerFactory, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self.connection_factory = factory

    async def _make_server(self) -> web.Server:
        return _ConnectionServer(await super()._make_server(), self.connection_factory)


def connection_runner(
    app: web.Application, factory: HandlerFactory, **kwargs: Any
) -> web.AppRunner:
    """A `web.AppRunner` (same keyword arguments) whose connections' protocols are made by
    `factory` (a `web.RequestHandler` subclass, or a partial of one), with the arguments
    aiohttp would give its own `RequestHandler`."""
    return _ConnectionRunner(app, factory, **kwargs)
