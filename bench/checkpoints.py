"""What delivery checkpoints cost (gateway.pipeline.checkpoints), and how stale one can be.

    .venv/bin/python -m bench.checkpoints [streams ...]     # default: 16 128 512

For each count, that many streams run at once through an in-process gateway (SQLite store) from
a fake upstream sending a 40-byte chunk every 20 ms for 6 s, read by as many clients. Every
checkpoint tick is timed in its two parts: taking the checkpoints (synchronous work on the event
loop: each moved stream's delivered blocks assembled and serialised) and saving them (one
transaction). Prints, per count: ticks, the median and worst take and save, the event loop's
share spent taking checkpoints, and the worst age a checkpoint can have when the process dies
(the tick interval, plus a take and a save). The upstream and the clients share the process, so
only the timed parts are the checkpoints' own.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.app import create_app
from gateway.config import parse_config
from gateway.pipeline import checkpoints
from gateway.storage.store import Store

CHUNK_S = 0.02
STREAM_S = 6.0
CHUNK = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"word " * 8 + b'"}}]}\n\n'
DONE = b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


async def upstream(request: web.Request) -> web.StreamResponse:
    await request.read()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for _ in range(int(STREAM_S / CHUNK_S)):
        await response.write(CHUNK)
        await asyncio.sleep(CHUNK_S)
    await response.write(DONE)
    return response


async def client(session: aiohttp.ClientSession, url: str) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    async with session.post(url, json=body) as response:
        async for _ in response.content.iter_any():
            pass


async def one(streams: int, db: Path) -> dict[str, Any]:
    takes: list[float] = []
    saves: list[float] = []
    rows: list[int] = []
    take, save = checkpoints.Checkpoints.take, Store.save_checkpoints

    def timed_take(self: checkpoints.Checkpoints) -> Any:
        started = time.perf_counter()
        out = take(self)
        takes.append(time.perf_counter() - started)
        rows.append(len(out[1]))
        return out

    async def timed_save(self: Store, *args: Any) -> None:
        started = time.perf_counter()
        await save(self, *args)
        saves.append(time.perf_counter() - started)

    checkpoints.Checkpoints.take = timed_take  # type: ignore[method-assign]
    Store.save_checkpoints = timed_save  # type: ignore[method-assign]
    up_app = web.Application()
    up_app.router.add_post("/v1/chat/completions", upstream)
    try:
        async with TestServer(up_app) as up:
            config = parse_config(
                {
                    "store": {"url": f"sqlite:///{db}", "spool_path": str(db.parent / "spool")},
                    "models": [
                        {
                            "name": "m",
                            "deployments": [
                                {
                                    "provider": "openai",
                                    "api_base": str(up.make_url("/v1")),
                                    "price": "free",
                                }
                            ],
                        }
                    ],
                }
            ).config
            async with TestServer(create_app(config)) as gw:
                url = str(gw.make_url("/v1/chat/completions"))
                connector = aiohttp.TCPConnector(limit=0)
                async with aiohttp.ClientSession(connector=connector) as session:
                    started = time.perf_counter()
                    await asyncio.gather(*(client(session, url) for _ in range(streams)))
                    elapsed = time.perf_counter() - started
    finally:
        checkpoints.Checkpoints.take = take  # type: ignore[method-assign]
        Store.save_checkpoints = save  # type: ignore[method-assign]
    busy = [t for t, n in zip(takes, rows, strict=True) if n]
    return {
        "streams": streams,
        "seconds": round(elapsed, 2),
        "ticks_saved": len(saves),
        "take_median_ms": round(statistics.median(busy) * 1000, 3) if busy else 0,
        "take_worst_ms": round(max(busy) * 1000, 3) if busy else 0,
        "take_per_stream_us": round(sum(busy) / max(1, sum(rows)) * 1e6, 1),
        "save_median_ms": round(statistics.median(saves) * 1000, 3) if saves else 0,
        "save_worst_ms": round(max(saves) * 1000, 3) if saves else 0,
        "loop_share_pct": round(sum(takes) / elapsed * 100, 2),
        "worst_age_ms": round(
            (checkpoints.INTERVAL_S + max(takes, default=0) + max(saves, default=0)) * 1000, 1
        ),
    }


async def main(counts: list[int]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        for streams in counts:
            print(json.dumps(await one(streams, Path(tmp) / f"c{streams}.db")))


if __name__ == "__main__":
    asyncio.run(main([int(a) for a in sys.argv[1:]] or [16, 128, 512]))
