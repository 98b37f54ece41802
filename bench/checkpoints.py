"""What delivery checkpoints cost (gateway.pipeline.checkpoints), and how stale one can be.

    .venv/bin/python -m bench.checkpoints [--apart] [streams ...]     # default: 16 128 512

For each count, that many streams run at once through an in-process gateway (SQLite store) from
a fake upstream sending a 40-byte chunk every 20 ms for 6 s, read by as many clients. Every
checkpoint tick is timed in its two parts: taking the checkpoints (synchronous work on the event
loop: each moved stream's delivered blocks assembled and serialised) and saving them (one
transaction). Prints, per count: the ticks that saved something and the streams each took
(median), the median and worst take and save (a save from the loop's call to its answer; and
`save_sql_median_ms`, its transaction alone, on the store's thread), the take per stream, the
kilobytes a save wrote (median), the event loop's share spent taking checkpoints, the CPU the
process used over the streams' time (`process_cpu_pct`, every thread: past 100 the store's
thread ran beside the loop; with `--apart`, the gateway's alone), and two ages:

- `worst_age_ms`, measured: the longest a stream's delivered text went unsaved, from a look at
  a stream (Relay.checkpoint) to the commit, on the store's thread, of the save that held what
  the next look found (a look that found nothing new counts as saved at once: the store holds
  it already). What a crash at the worst moment would have lost, in time; it includes a late
  tick on a busy loop. `age_p99_ms`: the 99th percentile of the same ages, one per look.
  `worst_age_all_open_ms`: the worst of those that began and ended while every stream was open
  (not in the bursts of turns that start and end together, whose writes the saves queue
  behind on the store's thread).
- `bound_ms`: the interval each stream is looked at, plus the worst take and the worst save.

And how late the event loop runs a timer (`loop_late_p99_ms`, `loop_late_worst_ms`: a task
that sleeps 10 ms over and over, late by that much): no tick can be earlier than that.

The tokenizer a gateway loads in a thread soon after it starts is loaded first, so that the
streams do not begin in the middle of the gateway's start. The upstream and the clients share
the process, so only the timed parts are the checkpoints' own; at 512 streams the process is
saturated (the streams take twice their 6 s and more), and a late tick or a late answer from a
save shows in the measured age. With `--apart` they run in a process of their own (each
process on a core of its own where there are two), and the gateway's event loop carries only
the gateway (`load_cpu_pct`: what the other process used). Both run on uvloop, as `gateway
serve` does, and the load is written against the sockets rather than through aiohttp, so that
it keeps its pace.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import orjson
import uvloop
from aiohttp import web

from gateway import cli
from gateway.app import create_app
from gateway.config import parse_config
from gateway.metering import tokens
from gateway.pipeline import checkpoints
from gateway.pipeline.relay import Relay
from gateway.storage.sqlite import SQLiteBackend
from gateway.storage.store import Store

CHUNK_S = 0.02
STREAM_S = 6.0
CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"word " * 8 + b'"}}]}\n\n'
DONE = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


# The load is written against the sockets, not through aiohttp, so that at 512 streams the
# process making it keeps the pace (a chunk every 20 ms a stream) and the gateway is what is
# measured.
_CHUNKED = b"%x\r\n%s\r\n" % (len(CHUNK), CHUNK)
_CHUNKED_DONE = b"%x\r\n%s\r\n0\r\n\r\n" % (len(DONE), DONE)
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_SLOTS = 4  # the streams are written a quarter at a time, CHUNK_S / _SLOTS apart


class _Streams:
    """Every stream the upstream is sending: each one's next chunk written on its slot's tick,
    with no timer a stream."""

    def __init__(self) -> None:
        self.slots: list[dict[asyncio.Transport, int]] = [{} for _ in range(_SLOTS)]
        self.started = 0

    def add(self, transport: asyncio.Transport) -> None:
        transport.write(_HEAD)
        self.slots[self.started % _SLOTS][transport] = int(STREAM_S / CHUNK_S)
        self.started += 1

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        at, tick = loop.time(), 0
        while True:
            at += CHUNK_S / _SLOTS
            await asyncio.sleep(max(0.0, at - loop.time()))
            slot = self.slots[tick % _SLOTS]
            tick += 1
            for transport, left in list(slot.items()):
                if transport.is_closing():
                    del slot[transport]
                elif left:
                    transport.write(_CHUNKED)
                    slot[transport] = left - 1
                else:
                    transport.write(_CHUNKED_DONE)
                    del slot[transport]


class _Upstream(asyncio.Protocol):
    """A connection to the fake upstream: each request on it answered with a stream."""

    def __init__(self, streams: _Streams) -> None:
        self.streams = streams
        self.buffer = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        head, found, rest = self.buffer.partition(b"\r\n\r\n")
        if not found:
            return
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        if len(rest) >= length:
            self.buffer = rest[length:]
            self.streams.add(self.transport)


@contextlib.asynccontextmanager
async def served(app: web.Application) -> AsyncIterator[str]:
    """The gateway, listening as `gateway serve` does (its backlog, its garbage collector's
    settings: gateway.cli): its URL."""
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    try:
        await web.TCPSite(runner, "127.0.0.1", 0, backlog=cli._BACKLOG).start()
        cli.settle_collector()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def upstream() -> AsyncIterator[str]:
    """The fake upstream, serving: its API base."""
    streams = _Streams()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Upstream(streams), "127.0.0.1", 0, backlog=1024)
    ticker = asyncio.create_task(streams.run())
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    finally:
        ticker.cancel()
        server.close()


class _Client(asyncio.Protocol):
    """One streaming request to the gateway, its answer read and dropped until it ends."""

    def __init__(self, request: bytes, done: asyncio.Future[None]) -> None:
        self.request, self.done, self.tail = request, done, b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.tail = (self.tail + data[-7:])[-7:]
        if self.tail == b"\r\n0\r\n\r\n":  # the chunked answer's end
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def clients(url: str, streams: int) -> float:
    """Run the streams; how long they took."""
    parsed = urllib.parse.urlsplit(url)
    body = orjson.dumps(
        {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    )
    request = (
        b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s"
    ) % (parsed.path.encode(), parsed.netloc.encode(), len(body), body)
    loop = asyncio.get_running_loop()
    started = time.perf_counter()
    done: list[asyncio.Future[None]] = []
    for _ in range(streams):
        done.append(loop.create_future())
        await loop.create_connection(
            lambda: _Client(request, done[-1]), parsed.hostname, parsed.port
        )
    await asyncio.gather(*done)
    return time.perf_counter() - started


class Apart:
    """The upstream and the clients in a process of their own (`--apart`)."""

    cpu = 0.0  # the share of a core that process used while the streams ran

    async def __aenter__(self) -> str:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.checkpoints", "--load",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.process.stdout is not None
        return (await self.process.stdout.readline()).decode().strip()  # the upstream's URL

    async def run(self, url: str, streams: int) -> float:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{url} {streams}\n".encode())
        await self.process.stdin.drain()
        elapsed, self.cpu = map(float, (await self.process.stdout.readline()).split())
        return elapsed

    async def __aexit__(self, *exc: object) -> None:
        if self.process.returncode is None:
            self.process.kill()
        await self.process.wait()


async def load() -> None:
    """The `--load` process: serve the upstream, say its URL, run the streams the gateway
    named on stdin through it, say how long they took."""
    pin(0)
    async with upstream() as api_base:
        print(api_base, flush=True)
        line = await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        url, streams = line.split()
        cpu = time.process_time()
        elapsed = await clients(url, int(streams))
        print(elapsed, (time.process_time() - cpu) / elapsed, flush=True)


def pin(core: int) -> None:
    if len(os.sched_getaffinity(0)) >= 2:
        os.sched_setaffinity(0, {core})


def _written(args: tuple[Any, ...]) -> int:
    """The bytes of the checkpoint bodies a save was given (each row's last item)."""
    return sum(
        len(row[-1])
        for arg in args
        if isinstance(arg, list)
        for row in arg
        if isinstance(row, tuple) and isinstance(row[-1], str)
    )


async def lateness(late: list[float]) -> None:
    """How late the event loop wakes a 10 ms sleep, again and again (until cancelled)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + 0.01
        await asyncio.sleep(0.01)
        late.append(loop.time() - due)


class Ages:
    """How long each stream's delivered text goes unsaved (see the module's docstring)."""

    def __init__(self) -> None:
        self.saved_as_of: dict[int, float] = {}  # per relay: the look the store holds
        self.unsaved: list[tuple[int, float]] = []  # looks that found more, until saved
        self.ages: list[float] = []
        self.spans: list[tuple[float, float]] = []  # each age's start and end

    def looked(self, relay: int, moved: bool) -> None:
        now = time.perf_counter()
        if moved:
            self.unsaved.append((relay, now))
        else:
            self._saved(relay, now, now)

    def committed(self, now: float) -> None:
        for relay, at in self.unsaved:
            self._saved(relay, at, now)
        self.unsaved.clear()

    def failed(self) -> None:
        self.unsaved.clear()

    def _saved(self, relay: int, look: float, now: float) -> None:
        before = self.saved_as_of.get(relay)
        if before is not None:
            self.ages.append(now - before)
            self.spans.append((before, now))
        self.saved_as_of[relay] = look

    def within(self, start: float, stop: float) -> list[float]:
        """The ages that began and ended between `start` and `stop`."""
        return [b - a for a, b in self.spans if start <= a and b <= stop]


async def one(streams: int, db: Path, apart: bool = False) -> dict[str, Any]:
    await asyncio.to_thread(tokens.warm, 0)
    takes: list[float] = []
    looked: list[int] = []
    saves: list[float] = []
    written: list[int] = []
    ages = Ages()
    late: list[float] = []
    take, save, look = checkpoints.Checkpoints.take, Store.save_checkpoints, Relay.checkpoint
    submit = SQLiteBackend._submit
    commits: list[list[float]] = []  # where the save being submitted says when it committed
    transactions: list[float] = []  # each save's, on the store's thread
    all_open = [0.0, 0.0]  # when the first tick and the last found every stream open

    def timed_look(self: Relay) -> Any:
        out = look(self)
        ages.looked(id(self), out is not None)
        return out

    def timed_take(self: checkpoints.Checkpoints) -> Any:
        moved = len(ages.unsaved)
        started = time.perf_counter()
        out = take(self)
        takes.append(time.perf_counter() - started)
        looked.append(len(ages.unsaved) - moved)
        if len(self.streams) == streams:  # all of them open: from the first time to the last
            all_open[0] = all_open[0] or started
            all_open[1] = time.perf_counter()
        return out

    async def timed_save(self: Store, *args: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        committed: list[float] = []
        commits.append(committed)
        try:
            await save(self, *args, **kwargs)
        except BaseException:
            ages.failed()
            raise
        finally:
            commits.clear()
        saves.append(time.perf_counter() - started)
        written.append(_written((*args, *kwargs.values())))
        ages.committed(committed[0] if committed else time.perf_counter())

    def timed_submit(self: SQLiteBackend, job: Callable[[Any], Any]) -> Any:
        """A save's transaction, noting when it committed (on the store's thread): it is
        submitted before the save's first wait, so the save's is the one asked for."""
        if not commits:
            return submit(self, job)
        committed = commits.pop()

        def timed(db: Any) -> Any:
            started = time.perf_counter()
            value = job(db)
            committed.append(time.perf_counter())
            transactions.append(committed[-1] - started)
            return value

        return submit(self, timed)

    Relay.checkpoint = timed_look  # type: ignore[method-assign]
    checkpoints.Checkpoints.take = timed_take  # type: ignore[method-assign]
    Store.save_checkpoints = timed_save  # type: ignore[method-assign]
    SQLiteBackend._submit = timed_submit  # type: ignore[method-assign]
    try:
        async with contextlib.AsyncExitStack() as stack:
            helper = Apart()
            if apart:
                api_base = await stack.enter_async_context(helper)
            else:
                api_base = await stack.enter_async_context(upstream())
            config = parse_config(
                {
                    "store": {"url": f"sqlite:///{db}", "spool_path": str(db.parent / "spool")},
                    "models": [
                        {
                            "name": "m",
                            "deployments": [
                                {
                                    "provider": "openai",
                                    "api_base": api_base,
                                    "price": "free",
                                }
                            ],
                        }
                    ],
                }
            ).config
            async with served(create_app(config)) as base:
                url = f"{base}/v1/chat/completions"
                probe = asyncio.create_task(lateness(late))
                cpu = time.process_time()
                elapsed = await (helper.run(url, streams) if apart else clients(url, streams))
                cpu = time.process_time() - cpu
                probe.cancel()
    finally:
        Relay.checkpoint = look  # type: ignore[method-assign]
        checkpoints.Checkpoints.take = take  # type: ignore[method-assign]
        Store.save_checkpoints = save  # type: ignore[method-assign]
        SQLiteBackend._submit = submit  # type: ignore[method-assign]
    busy = [t for t, n in zip(takes, looked, strict=True) if n]
    moved = [n for n in looked if n]

    def ms(values: list[float], pick: Any) -> float:
        return round(pick(values) * 1000, 3) if values else 0

    return {
        "streams": streams,
        "seconds": round(elapsed, 2),
        "ticks_saved": len(saves),
        "taken_per_tick": statistics.median(moved) if moved else 0,
        "take_median_ms": ms(busy, statistics.median),
        "take_worst_ms": ms(busy, max),
        "take_per_stream_us": round(sum(busy) / max(1, sum(moved)) * 1e6, 1),
        "save_median_ms": ms(saves, statistics.median),
        "save_worst_ms": ms(saves, max),
        "save_sql_median_ms": ms(transactions, statistics.median),
        "save_kb_median": round(statistics.median(written) / 1024, 1) if written else 0,
        "loop_share_pct": round(sum(takes) / elapsed * 100, 2),
        "process_cpu_pct": round(cpu / elapsed * 100, 1),
        "load_cpu_pct": round(helper.cpu * 100, 1) if apart else None,
        "age_p99_ms": round(statistics.quantiles(ages.ages, n=100)[-1] * 1000, 1),
        "worst_age_ms": round(max(ages.ages) * 1000, 1),
        "worst_age_all_open_ms": round(max(ages.within(*all_open), default=0) * 1000, 1),
        "bound_ms": round(
            (checkpoints.INTERVAL_S + max(busy, default=0) + max(saves, default=0)) * 1000, 1
        ),
        "loop_late_p99_ms": round(statistics.quantiles(late, n=100)[-1] * 1000, 1),
        "loop_late_worst_ms": round(max(late) * 1000, 1),
    }


async def main(args: list[str]) -> None:
    if args == ["--load"]:
        await load()
        return
    apart = "--apart" in args
    if apart:
        pin(1)
    counts = [int(a) for a in args if a != "--apart"] or [16, 128, 512]
    with tempfile.TemporaryDirectory() as tmp:
        for streams in counts:
            print(json.dumps(await one(streams, Path(tmp) / f"c{streams}.db", apart)))


if __name__ == "__main__":
    # The gateway's side on the event loop `gateway serve` runs on (gateway.cli).
    uvloop.run(main(sys.argv[1:]))
