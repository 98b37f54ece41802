"""How fast the gateway notices a client that left, and closes the upstream request.

    .venv/bin/python -m bench.disconnect_latency [runs]

For each waiting state (the gateway awaiting the upstream's headers, awaiting its next chunk,
or blocked writing to a client that stopped reading), a raw client resets its connection and
we time (a) until the gateway has recorded the turn's end, which it does right after closing
the upstream connection, and (b) until the fake upstream's handler sees its client (the
gateway) go away. Prints the median and worst of `runs` tries per state, in milliseconds.
The fake upstream shares the event loop, so (b) includes its own reaction time. Loopback only.
"""

from __future__ import annotations

import asyncio
import json
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import parse_config
from gateway.context import GATEWAY
from gateway.storage.records import NewEvent

CHUNK = (
    b'data: {"choices":[{"index":0,"delta":{"content":"'
    + b"x" * 200
    + b'"},"finish_reason":null}]}\n\n'
)


class Upstream:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.gone = asyncio.Event()
        self.waiting = asyncio.Event()
        self.gone_at = 0.0

    async def handle(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        try:
            if self.mode == "headers":
                self.waiting.set()
                await asyncio.Event().wait()
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            if self.mode == "chunk":
                await response.write(CHUNK)
                self.waiting.set()
                await asyncio.Event().wait()
            for i in range(100_000):  # "write": flood until the gateway blocks on its client
                await response.write(CHUNK)
                if i == 2000:
                    self.waiting.set()
            await asyncio.Event().wait()
        except (asyncio.CancelledError, ConnectionResetError):
            self.gone_at = time.perf_counter()
            self.gone.set()
            raise
        return response


async def one(mode: str, db: Path) -> tuple[float, float]:
    upstream = Upstream(mode)
    up_app = web.Application()
    up_app.router.add_post("/v1/chat/completions", upstream.handle)
    async with TestServer(up_app) as up:
        config = parse_config(
            {
                "store": {"url": f"sqlite:///{db}"},
                "models": [
                    {
                        "name": "m",
                        "deployments": [
                            {"provider": "openai", "api_base": str(up.make_url("/v1"))}
                        ],
                    }
                ],
            }
        ).config
        app = create_app(config)
        recorded = asyncio.Event()
        recorded_at = 0.0

        async with TestServer(app) as gw:
            store = app[GATEWAY].store
            append = store.append

            def timed_append(event: NewEvent) -> None:
                nonlocal recorded_at
                if event.type == "turn/end":
                    recorded_at = time.perf_counter()
                    recorded.set()
                append(event)

            store.append = timed_append  # type: ignore[method-assign]
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            sock.setblocking(False)
            await loop.sock_connect(sock, ("127.0.0.1", gw.port))
            body = json.dumps(
                {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}
            )
            await loop.sock_sendall(
                sock,
                "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\n\r\n{body}".encode(),
            )
            await upstream.waiting.wait()
            if mode == "write":
                await asyncio.sleep(1.5)  # let every buffer on the path fill up
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            started = time.perf_counter()
            sock.close()
            await asyncio.wait_for(upstream.gone.wait(), 10)
            await asyncio.wait_for(recorded.wait(), 10)
            return (recorded_at - started) * 1000, (upstream.gone_at - started) * 1000


async def main(runs: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("headers", "chunk", "write"):
            pairs = [await one(mode, Path(tmp) / f"{mode}{i}.db") for i in range(runs)]
            gateway, upstream = [p[0] for p in pairs], [p[1] for p in pairs]
            print(
                f"{mode:8s} waiting: gateway recorded the cut after median"
                f" {statistics.median(gateway):6.2f} ms (worst {max(gateway):6.2f});"
                f" upstream saw the close after median {statistics.median(upstream):6.2f} ms"
                f" (worst {max(upstream):6.2f}), {runs} runs"
            )


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 20))
