"""gateway.downstream.aiohttp_internals against the installed aiohttp: every private name it reads
or overrides still exists and still means what the module takes it to mean.

A failure here means aiohttp changed one of them: fix gateway/downstream/aiohttp_internals.py
(nothing else in the gateway touches aiohttp's private names) and only then widen aiohttp's bound in
pyproject.toml. The names are checked twice: as attributes with their types and defaults, and in
use, over a real loopback connection.
"""

from __future__ import annotations

import asyncio
import inspect
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from packaging.requirements import Requirement
from packaging.version import Version

from gateway.downstream import aiohttp_internals as internals

BOUND_S = 5.0
PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _slots(cls: type) -> set[str]:
    return {name for klass in cls.__mro__ for name in getattr(klass, "__slots__", ())}


@asynccontextmanager
async def serving(runner: web.AppRunner) -> AsyncIterator[int]:
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site.port
    finally:
        await runner.cleanup()


async def until(condition: Any) -> None:
    async with asyncio.timeout(BOUND_S):
        while not condition():
            await asyncio.sleep(0.001)


# -- the version range ---------------------------------------------------------------------------


def test_the_installed_aiohttp_is_within_the_bound_this_test_has_seen() -> None:
    dependencies = tomllib.loads(PYPROJECT.read_text())["project"]["dependencies"]
    (aiohttp_req,) = [Requirement(d) for d in dependencies if Requirement(d).name == "aiohttp"]
    installed = Version(aiohttp.__version__)
    assert installed in aiohttp_req.specifier, (installed, aiohttp_req)
    # Bounded above by the next minor: private names may change in any of them.
    uppers = [Version(s.version) for s in aiohttp_req.specifier if s.operator == "<"]
    assert uppers and max(uppers) <= Version(f"{installed.major}.{installed.minor + 1}")


# -- the names, as attributes --------------------------------------------------------------------


def test_stream_responses_have_the_private_names_with_their_defaults() -> None:
    # prepare() sends the head at once unless this class attribute is False, as aiohttp's own
    # Response (which sends its head with its body) sets it.
    assert vars(web.StreamResponse)["_send_headers_immediately"] is True
    assert web.Response._send_headers_immediately is False
    assert vars(internals.EventStreamResponse)["_send_headers_immediately"] is False
    assert issubclass(internals.EventStreamResponse, web.StreamResponse)
    # A response's payload writer: None until prepare(), its output_size an int counter.
    response = web.StreamResponse()
    assert "_payload_writer" in vars(web.StreamResponse)
    assert response._payload_writer is None
    assert internals.payload_output_size(response) == 0
    assert isinstance(aiohttp.abc.AbstractStreamWriter.output_size, int)


def test_request_handlers_have_the_private_names_the_guard_reads() -> None:
    slots = _slots(web.RequestHandler)
    assert {"_waiter", "_request_count"} <= slots
    # How aiohttp makes its connections' protocols: RequestHandler(manager, *, loop, **kwargs).
    parameters = inspect.signature(web.RequestHandler.__init__).parameters
    assert list(parameters)[:2] == ["self", "manager"]
    assert parameters["loop"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "keepalive_timeout" in parameters
    # A runner makes its server in the private _make_server coroutine method.
    assert inspect.iscoroutinefunction(vars(web.AppRunner)["_make_server"])
    assert getattr(web.BaseRunner._make_server, "__isabstractmethod__", False)


async def test_servers_keep_their_loop_and_handler_arguments() -> None:
    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        return web.Response()

    loop = asyncio.get_running_loop()
    server = web.Server(handler, loop=loop, keepalive_timeout=7.0, access_log=None)
    assert server._loop is loop
    assert server._kwargs == {"keepalive_timeout": 7.0, "access_log": None}
    protocol = server()  # aiohttp's own factory: the arguments given to each RequestHandler
    assert isinstance(protocol, web.RequestHandler)
    assert internals.requests_received(protocol) == 0
    assert internals.awaiting_request(protocol) is False  # not connected: waits for nothing


# -- the names, in use ---------------------------------------------------------------------------


class _Recorder(web.RequestHandler):
    """A connection's protocol that notes what aiohttp_internals says around each read."""

    made: list[_Recorder] = []

    def __init__(self, manager: web.Server, *, note: str, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self.note = note
        self.kwargs = kwargs
        self.reads: list[tuple[bytes, tuple[bool, int], tuple[bool, int]]] = []
        _Recorder.made.append(self)

    def state(self) -> tuple[bool, int]:
        return internals.awaiting_request(self), internals.requests_received(self)

    def data_received(self, data: bytes) -> None:
        before = self.state()
        super().data_received(data)
        self.reads.append((data, before, self.state()))


async def test_connection_runner_makes_the_protocol_and_its_state_reads_true() -> None:
    during: list[tuple[bool, int]] = []

    async def hello(request: web.Request) -> web.Response:
        protocol = request.protocol
        assert isinstance(protocol, _Recorder)
        during.append(protocol.state())
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", hello)
    _Recorder.made.clear()
    runner = internals.connection_runner(
        app, lambda *a, **kw: _Recorder(*a, note="made", **kw), keepalive_timeout=7.0
    )
    async with serving(runner) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            await until(lambda: _Recorder.made and _Recorder.made[0].state() == (True, 0))
            (protocol,) = _Recorder.made
            assert protocol.note == "made"
            # The arguments aiohttp gives its own RequestHandler, the runner's included.
            assert protocol.kwargs["loop"] is asyncio.get_running_loop()
            assert protocol.kwargs["keepalive_timeout"] == 7.0
            assert "access_log_class" in protocol.kwargs

            writer.write(b"GET / HTTP/1.1\r\nHost: x")  # part of a head: still awaited
            await until(lambda: len(protocol.reads) == 1)
            assert protocol.reads[0][1:] == ((True, 0), (True, 0))

            writer.write(b"\r\n\r\n")  # the head whole: one request, no longer awaited
            async with asyncio.timeout(BOUND_S):
                head = await reader.readuntil(b"\r\n\r\n")
                assert head.startswith(b"HTTP/1.1 200")
                assert await reader.readexactly(2) == b"ok"
            assert protocol.reads[1][1:] == ((True, 0), (False, 1))
            assert during == [(False, 1)]  # while handled: not awaiting
            await until(lambda: protocol.state() == (True, 1))  # kept alive, awaiting the next

            writer.write(b"NOT HTTP\r\n\r\n")  # a head the parser refuses counts too
            async with asyncio.timeout(BOUND_S):
                answer = await reader.read()  # to the close
            assert answer.split(b"\r\n", 1)[0].endswith(b" 400 Bad Request")
            assert protocol.reads[-1][2][1] == 2
        finally:
            writer.close()


async def _stream_over_loopback(cls: type[web.StreamResponse]) -> tuple[dict[str, int], bytes]:
    """A response of `cls` written in two frames; the byte counts aiohttp_internals read along
    the way, and every byte the client received."""
    seen: dict[str, int] = {}

    async def events(request: web.Request) -> web.StreamResponse:
        response = cls(headers={"Content-Type": "text/event-stream"})
        seen["new"] = internals.payload_output_size(response)
        await response.prepare(request)
        seen["prepared"] = internals.payload_output_size(response)
        await response.write(b"data: 1\n\n")
        seen["first"] = internals.payload_output_size(response)
        await response.write(b"data: 2\n\n")
        seen["second"] = internals.payload_output_size(response)
        await response.write_eof()
        seen["ended"] = internals.payload_output_size(response)
        seen["body_length"] = response.body_length
        return response

    app = web.Application()
    app.router.add_get("/events", events)
    async with serving(web.AppRunner(app)) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(b"GET /events HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            async with asyncio.timeout(BOUND_S):
                received = await reader.read()
        finally:
            writer.close()
    return seen, received


@pytest.mark.parametrize("cls", [internals.EventStreamResponse, web.StreamResponse])
async def test_payload_output_size_counts_the_bytes_that_reach_the_wire(
    cls: type[web.StreamResponse],
) -> None:
    seen, received = await _stream_over_loopback(cls)
    head_end = received.index(b"\r\n\r\n") + 4
    first = b"9\r\ndata: 1\n\n\r\n"  # the chunked framing is counted too
    assert received[head_end:].startswith(first)
    assert seen["new"] == 0 and seen["ended"] == 0  # no writer yet, and none after write_eof
    assert seen["first"] == head_end + len(first)
    assert seen["second"] == seen["first"] + len(first)
    assert seen["body_length"] == len(received)  # the writer's total, kept by write_eof
    if cls is internals.EventStreamResponse:
        assert seen["prepared"] == 0  # the head waits for the first frame, leaving with it
    else:
        assert seen["prepared"] == head_end  # aiohttp's default: the head alone, at prepare()
