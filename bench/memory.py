"""`python -m bench.memory`: the gateway's memory, idle, under one very long stream, and with
1,000 streams open at once.

Starts a small fake upstream (model `long`: one stream of `--chunks` content chunks; model
`idle`: one chunk, then nothing until the client leaves) and `gateway serve` (SQLite store, a
virtual key, every feature on), then reads the gateway's RSS from /proc:
- idle, after warming up (one request, then a 1,000-chunk stream through the long stream's own
  path, so that what loads on first use, such as the tokenizer for the estimate a stream without
  usage needs, is not counted as the long stream's) and once RSS has stopped moving;
- the peak (VmHWM) while one `--chunks`-chunk stream goes through (`--frames openai`: each
  chunk as big as OpenAI's, ~330 bytes with the fields it sends), minus the RSS before it,
  next to the size of the text that stream records;
- with `--idle-streams` streams open and waiting at once.
Prints the figures and writes them to bench/results/memory-<UTC>.json.

`--trace` runs the gateway under tracemalloc (minutes slower, its RSS figures not comparable)
and prints what Python holds at the end of the long stream, by allocating line: where the
memory of one long stream goes. tracemalloc does not see SQLite's own allocations (its copy
of a row, its page cache) nor the allocator's pages that were freed but not returned.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.procs import free_port
from bench.run import MASTER_KEY, RESULTS, create_virtual_key

WORD = "word "


def _chunk(content: str | None, finish: str | None = None, shape: str = "short") -> bytes:
    delta = {"content": content} if content is not None else {}
    if shape == "openai":  # the fields and sizes of the captured OpenAI stream: ~330 bytes
        body: dict[str, Any] = {
            "id": "chatcmpl-Dx0Xq5Xx9rHB2ehcHZCRDsnuymUXc",
            "object": "chat.completion.chunk",
            "created": 1782955818,
            "model": "gpt-4o-mini-2024-07-18",
            "service_tier": "default",
            "system_fingerprint": "fp_d0469e1700",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
            "usage": None,
            "obfuscation": "auU6fTns",
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"
    body = {
        "id": "chatcmpl-mem",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(body).encode() + b"\n\n"


async def upstream(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    if body["model"] == "idle":
        await response.write(_chunk("hello"))
        await asyncio.Event().wait()  # until the gateway closes the connection
    chunks = 1000 if body["model"] == "warm" else int(request.app["chunks"])
    piece = _chunk(WORD, shape=request.app["shape"])
    batch = piece * 1000
    for _ in range(chunks // 1000):
        await response.write(batch)
    await response.write(_chunk(None, "stop") + b"data: [DONE]\n\n")
    return response


def serve_upstream(port: int, chunks: int, shape: str = "short") -> None:
    app = web.Application()
    app["chunks"] = chunks
    app["shape"] = shape
    app.router.add_post("/v1/chat/completions", upstream)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


def traced_serve(config: str, report: str) -> None:
    """`gateway serve` under tracemalloc. Between SIGUSR1 and SIGUSR2, snapshots at three
    moments of a turn's end: when the answer is complete (everything the stream accumulated is
    held), when its events are queued for the store, and when the store's thread has written a
    long answer's payload (a DeferredPayload) to its blob; SIGUSR2 writes to `report` what
    each holds that was not there at SIGUSR1."""
    import tracemalloc

    import gateway.storage.sqlite as sqlite_backend
    from gateway.cli import main as gateway_main
    from gateway.conversations.recorder import TurnRecorder

    tracemalloc.start(8)
    state: dict[str, Any] = {"on": False, "snapshots": []}

    def look(moment: str) -> None:
        if state["on"]:
            state["snapshots"].append((moment, tracemalloc.take_snapshot()))

    completed = TurnRecorder.completed

    def completed_and_look(turn: TurnRecorder, *args: Any) -> None:
        look("the answer complete, before the turn's end is recorded")
        completed(turn, *args)
        look("the turn's end queued for the store")

    write_long = sqlite_backend._write_long_payload

    def write_long_and_look(*args: Any) -> int:
        rowid = write_long(*args)
        look("the store's thread wrote the long answer's payload, piece by piece, to its blob")
        return rowid

    TurnRecorder.completed = completed_and_look  # type: ignore[method-assign,assignment]
    sqlite_backend._write_long_payload = write_long_and_look  # type: ignore[assignment]

    def start(*_: Any) -> None:
        state["base"] = tracemalloc.take_snapshot()
        state["on"] = True

    def stop(*_: Any) -> None:
        state["on"] = False
        lines: list[str] = []
        for moment, snapshot in state["snapshots"]:
            lines.append(moment + ":")
            _report(lines, snapshot, state["base"])
        Path(report).write_text("\n".join(lines) + "\n")

    def _report(lines: list[str], snapshot: Any, base: Any) -> None:
        mib = 1024 * 1024
        # Not the snapshots themselves.
        snapshot = snapshot.filter_traces(
            [tracemalloc.Filter(False, tracemalloc.__file__, all_frames=True)]
        )
        total = sum(stat.size_diff for stat in snapshot.compare_to(base, "filename"))
        lines.append(f" allocated since SIGUSR1 and still held: {total / mib:.2f} MiB")
        for stat in snapshot.compare_to(base, "traceback")[:14]:
            if stat.size_diff < 32 * 1024:
                break
            where = [f for f in reversed(stat.traceback) if "/asyncio/" not in f.filename]
            frames = [f"{f.filename.split('/site-packages/')[-1]}:{f.lineno}" for f in where[:4]]
            lines.append(
                f"  {stat.size_diff / mib:6.2f} MiB {stat.count_diff:7d} blocks  "
                + " <- ".join(frames)
            )

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    gateway_main(["serve", "--config", config])


async def _steady_rss(pid: int, within_s: float = 30) -> int:
    """RSS once it has moved less than 64 KiB in a second (background loads done)."""
    deadline = time.monotonic() + within_s
    last = rss_kib(pid)
    while time.monotonic() < deadline:
        await asyncio.sleep(1)
        now = rss_kib(pid)
        if abs(now - last) < 64:
            return now
        last = now
    return last


def _read_when_written(path: Path, within_s: float = 900) -> str:
    deadline = time.monotonic() + within_s
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(0.5)  # written whole
    return path.read_text()


def rss_kib(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(field)


def reset_peak(pid: int) -> None:
    # Writing 5 to clear_refs resets VmHWM to the current RSS (Linux >= 4.0).
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def drive(
    gw: str, key: str, pid: int, idle_streams: int, trace: Path | None = None
) -> dict[str, float]:
    headers = {"Authorization": f"Bearer {key}"}
    out: dict[str, float] = {}
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(headers=headers, connector=connector) as session:
        hi = [{"role": "user", "content": "hi"}]
        body: dict[str, Any] = {"model": "idle-demo", "messages": hi}
        async with session.post(gw + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()
        body = {"model": "warm", "messages": [{"role": "user", "content": "go"}], "stream": True}
        async with session.post(gw + "/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            await r.read()
        out["idle_rss_mib"] = await _steady_rss(pid) / 1024

        before = rss_kib(pid)
        reset_peak(pid)
        if trace is not None:
            os.kill(pid, signal.SIGUSR1)
            await asyncio.sleep(1)
        body = {"model": "long", "messages": [{"role": "user", "content": "go"}], "stream": True}
        received = 0
        async with session.post(gw + "/v1/chat/completions", json=body) as r:
            async for line in r.content:
                received += len(line)
        if trace is not None:
            await asyncio.sleep(1)  # the turn's writes
            os.kill(pid, signal.SIGUSR2)
            print(await asyncio.to_thread(_read_when_written, trace))
        peak = rss_kib(pid, "VmHWM")
        out["long_stream_bytes_received"] = received
        out["long_stream_peak_added_mib"] = (peak - before) / 1024
        out["long_stream_after_mib"] = rss_kib(pid) / 1024

        opened = asyncio.Event()
        count = 0

        async def one() -> None:
            nonlocal count
            body = {"model": "idle", "messages": [{"role": "user", "content": "wait"}],
                    "stream": True}  # fmt: skip
            async with session.post(gw + "/v1/chat/completions", json=body) as r:
                await r.content.readuntil(b"\n\n")
                count += 1
                if count == idle_streams:
                    opened.set()
                await asyncio.Event().wait()

        before = rss_kib(pid)
        tasks = [asyncio.create_task(one()) for _ in range(idle_streams)]
        await asyncio.wait_for(opened.wait(), 120)
        out["idle_streams"] = idle_streams
        out["idle_streams_rss_mib"] = rss_kib(pid) / 1024
        out["idle_streams_added_mib"] = (rss_kib(pid) - before) / 1024
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--chunks", type=int, default=100_000)
    parser.add_argument("--idle-streams", type=int, default=1000)
    parser.add_argument("--trace", action="store_true", help="where the long stream's memory goes")
    parser.add_argument(
        "--frames",
        choices=("short", "openai"),
        default="short",
        help="the long stream's chunks: short (~150 bytes) or OpenAI's fields (~330 bytes)",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="gw-mem-"))
    up_port, gw_port = free_port(), free_port()
    up = subprocess.Popen(
        [sys.executable, "-c", f"from bench.memory import serve_upstream; "
         f"serve_upstream({up_port}, {args.chunks}, {args.frames!r})"],
    )  # fmt: skip
    config = tmp / "gw.yaml"
    deployment = {
        "provider": "openai",
        "api_base": f"http://127.0.0.1:{up_port}/v1",
        "api_key": "sk-mem",
        "timeouts": {"idle_s": 600, "first_token_s": 600},
    }
    config.write_text(json.dumps({
        "server": {"host": "127.0.0.1", "port": gw_port},
        "store": {"url": f"sqlite:///{tmp / 'gw.db'}", "spool_path": str(tmp)},
        "auth": {"master_key": MASTER_KEY},
        "models": [
            {"name": "long", "deployments": [{**deployment, "model": "long"}]},
            {"name": "warm", "deployments": [{**deployment, "model": "warm"}]},
            {"name": "idle", "deployments": [{**deployment, "model": "idle"}]},
            {"name": "idle-demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]},
        ],
    }))  # fmt: skip
    gateway_bin = Path(sys.executable).parent / "gateway"
    key = create_virtual_key(gateway_bin, config)
    trace = tmp / "trace.txt" if args.trace else None
    command = [str(gateway_bin), "serve", "--config", str(config)]
    if trace is not None:
        command = [sys.executable, "-c", "from bench.memory import traced_serve; "
                   f"traced_serve({str(config)!r}, {str(trace)!r})"]  # fmt: skip
    errors = (tmp / "gateway.err").open("wb") if trace is not None else subprocess.DEVNULL
    gw = subprocess.Popen(command, stderr=errors)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                import http.client

                conn = http.client.HTTPConnection("127.0.0.1", gw_port, timeout=1)
                conn.request("GET", "/health/ready")
                if conn.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("the gateway did not start")
            time.sleep(0.05)
        figures = asyncio.run(
            drive(f"http://127.0.0.1:{gw_port}", key, gw.pid, args.idle_streams, trace)
        )
    finally:
        gw.terminate()
        up.terminate()
        gw.wait()
        up.wait()
    figures["recorded_text_mib"] = args.chunks * len(WORD) / 1024 / 1024
    for name, value in figures.items():
        print(f"{name:32} {value:10.2f}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    name = "memory" if args.frames == "short" else f"memory-{args.frames}-frames"
    (RESULTS / f"{name}-{stamp}.json").write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    os.environ.pop("GATEWAY_MASTER_KEY", None)
    main()
