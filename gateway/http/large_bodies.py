"""Request bodies of `server.large_body_kb` or more: parsed on a thread, and at most
`server.large_bodies_per_key` of one key's started at once.

Parsing and validating megabytes of JSON holds the interpreter for tens of milliseconds a
megabyte. On the event loop that is time no other request gets, whoever sent it; on a thread
the interpreter still hands the loop its turn every switch interval, so the loop keeps
answering. Threading's fingerprints, in the body's size too, are then made on a thread as well
(gateway.conversations.threading.LARGE_HISTORY). What else follows the parse (recording,
forwarding the body) still costs in the body's size, so a key's large requests take turns in
its own lane (gateway.lanes): a flood of them queues behind itself, and each key adds at most
its lane's width of them to the loop's work. The lane is taken before the body is read when
`Content-Length` tells the size, so the bodies that wait stay in their sockets, not in memory;
a body without one (chunked) is taken to be large. A request leaves the lane when it is
answered, or `server.large_body_hold_s` after it took it, whichever comes first: that covers
its start, and a team's agents, who share a key, still stream their long answers side by side.

Below the threshold a request pays one comparison of its declared length, and one of the
length read.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import TypeVar

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.threading import LARGE_HISTORY
from gateway.http.auth import PRINCIPAL

T = TypeVar("T")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def laned(handler: Handler) -> Handler:
    """`handler`, run in its key's lane when the request's body is large."""

    @functools.wraps(handler)
    async def run(request: web.Request) -> web.StreamResponse:
        length = request.content_length
        gateway = request.app[GATEWAY]
        server = gateway.config.server
        if length is not None and length < server.large_body_kb * 1024:
            return await handler(request)
        principal = request[PRINCIPAL]
        lane = principal.key_id or principal.team_id or principal.kind
        width, hold_s = server.large_bodies_per_key, server.large_body_hold_s
        async with gateway.body_lanes.hold(lane, width, hold_s=hold_s):
            return await handler(request)

    return run


async def read_parsed(request: web.Request, parse: Callable[[bytes], T]) -> T:
    """The request's body, read whole and given to `parse`: on a thread when it is large."""
    raw = await request.read()
    if len(raw) < request.app[GATEWAY].config.server.large_body_kb * 1024:
        return parse(raw)
    LARGE_HISTORY.set(True)  # its history's fingerprints are made on a thread too
    return await asyncio.to_thread(parse, raw)
