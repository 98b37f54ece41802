"""`python -m bench.instructions [REV] [CELL ...]`: instructions the gateway executes a request.

CPU time on this shared VM moves about 10% between two runs of the same code (an A/A run of
`bench.ab` reads that much either way), so a change worth 1-3% cannot be seen in it.
Instructions can: this runs the gateway under valgrind's callgrind, which counts what the
process executes whatever else the machine does, and prints each cell's instructions per
request, for the working tree and, given `REV`, for that revision too (its `gateway/` from
`git archive`, or a directory holding a `gateway/` package, first on `PYTHONPATH`).

Per target: the bench's upstream and config (a store of its own, a virtual key), the gateway
started under `valgrind --tool=callgrind --instr-atstart=no`; per cell, `WARMUP` requests
uncounted, then instrumentation on, `REQUESTS` requests at the cell's concurrency, and the
count taken once the store holds every one of their turns (the turns' SQLite writes, made
after their answers, are counted as well). Cells as bench.ab's (`non-stream:16`, `stream:16`,
`burst:16`, ...), default `non-stream:16 stream:16`; `IN_REQUESTS` (1000) and `IN_WARMUP`
(200) set the counts. Under valgrind the gateway runs ~50x slower, so a cell takes a minute
or two.

What it does not see: time in the kernel (a system call is one instruction), waits, cache
misses. And what depends on time can run differently under valgrind: the store's writer
gathers a few milliseconds of turns into one commit, so how many turns share a commit is not
what it is natively. A change to such a path, or one that trades instructions for system
calls, needs bench.ab as well.
"""

from __future__ import annotations

import asyncio
import os
import re
import sqlite3
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp

from bench.ab import checkout, parse_cell
from bench.procs import HOST, cpu_s, free_port, http_get_status, spawn, wait_until
from bench.run import (
    CHAT_PATH,
    RESULTS,
    Bench,
    Cell,
    create_virtual_key,
    env_int,
    request_body,
    write_gateway_config,
)


async def load(url: str, body: bytes, key: str, concurrency: int, count: int) -> None:
    """`count` requests over `concurrency` kept-alive connections, each read to its end."""
    left = count
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status != 200:
                        raise SystemExit(f"{url}: {response.status} {await response.text()}")

        await asyncio.gather(*(client() for _ in range(concurrency)))


def ended_turns(db: Path) -> int:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return int(
            conn.execute("SELECT count(*) FROM turns WHERE ended_at IS NOT NULL").fetchone()[0]
        )


def wait_for_turns(db: Path, expected: int, timeout_s: float = 300.0) -> None:
    """Until the store holds `expected` ended turns: the writes after the answers are done."""
    deadline = time.monotonic() + timeout_s
    while (done := ended_turns(db)) < expected:
        if time.monotonic() > deadline:
            raise SystemExit(f"the store holds {done} ended turns of {expected}")
        time.sleep(0.05)


def wait_quiet(pid: int, timeout_s: float = 300.0) -> None:
    """Until the process is idle for half a second: what it does once after its start (the
    tokenizer's load in a thread, ~0.4 s natively and half a minute under valgrind) must not
    fall into a counted window."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        before = cpu_s(pid) or 0.0
        time.sleep(0.5)
        if (cpu_s(pid) or 0.0) - before < 0.01:
            return
    raise SystemExit(f"the gateway (pid {pid}) never went quiet")


def callgrind(pid: int, *command: str) -> None:
    subprocess.run(["callgrind_control", *command, str(pid)], check=True, capture_output=True)


def measure(
    bench: Bench,
    name: str,
    env: dict[str, str],
    tmp: Path,
    cells: list[Cell],
    counts: tuple[int, int],
) -> dict[Cell, float]:
    """Instructions a request, per cell, for one gateway (`env` says which code it runs)."""
    requests, warmup = counts
    env = {**env, "PYTHONHASHSEED": "0"}  # the same dict layouts in every run
    store = tmp / name
    config = write_gateway_config(store, bench.ports["direct"])
    key = create_virtual_key(bench.gateway_bin, config, env)
    port = free_port()
    # Kept, a file a cell: `callgrind_annotate` reads where the instructions went.
    out = RESULTS / f"callgrind-{name}-{bench.stamp}.out"
    # Run from the store's directory: `-m` puts the working directory first on sys.path, where
    # the repository's own gateway/ would shadow REV's on PYTHONPATH.
    argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
            sys.executable, "-m", "gateway", "serve", "--config", str(config),
            "--host", HOST, "--port", str(port)]  # fmt: skip
    imported = subprocess.run(
        [sys.executable, "-c", "import gateway; print(gateway.__file__)"],
        cwd=store, env=env, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    print(f"{name}: {imported}", flush=True)
    child = spawn(name, argv, bench.target_core, bench.log_path(name), store, env)
    bench.children[name] = child
    try:
        wait_until(child, lambda: http_get_status(port, "/health/ready", timeout=5) == 200, 600)
        url = f"http://{HOST}:{port}{CHAT_PATH}"
        turns = 0
        result: dict[Cell, float] = {}
        for number, cell in enumerate(cells, 1):
            body = request_body(cell.stream, cell.burst)
            asyncio.run(load(url, body, key, cell.concurrency, warmup))
            turns += warmup
            wait_for_turns(store / "bench.db", turns)
            wait_quiet(child.proc.pid)
            callgrind(child.proc.pid, "--instr=on")
            asyncio.run(load(url, body, key, cell.concurrency, requests))
            turns += requests
            wait_for_turns(store / "bench.db", turns)
            callgrind(child.proc.pid, f"--dump={cell.name}")
            callgrind(child.proc.pid, "--instr=off")
            dump = Path(f"{out}.{number}")
            total = re.search(rb"^totals: (\d+)", dump.read_bytes(), re.M)
            if total is None:
                raise SystemExit(f"no totals in {dump}")
            result[cell] = int(total.group(1)) / requests
            print(f"{name:<10} {cell.name:<20} {result[cell] / 1e6:8.3f} M instructions a request",
                  flush=True)  # fmt: skip
        return result
    finally:
        child.stop()
        del bench.children[name]


def main() -> int:
    args = sys.argv[1:]
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    rev = args.pop(0) if args and ":" not in args[0] else None
    cells = [parse_cell(c) for c in args or ("non-stream:16", "stream:16")]
    counts = env_int("IN_REQUESTS", 1000), env_int("IN_WARMUP", 200)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    bench = Bench(1, 1, stamp)
    os.sched_setaffinity(0, {bench.upstream_core})  # the load is light: beside the upstream
    with tempfile.TemporaryDirectory(prefix="gateway-instructions-") as tmp_text:
        tmp = Path(tmp_text)
        try:
            bench.start_upstream()
            runs: dict[str, dict[Cell, float]] = {}
            if rev is not None:
                env = {**bench.env, "PYTHONPATH": str(checkout(rev, tmp / "base"))}
                runs[rev] = measure(bench, "in-base", env, tmp, cells, counts)
            runs["the tree"] = measure(bench, "in-tree", bench.env, tmp, cells, counts)
        finally:
            for child in bench.children.values():
                child.stop()
    print(f"\ninstructions a request ({counts[0]} requests a cell, after {counts[1]} uncounted)")
    for cell in cells:
        tree = runs["the tree"][cell]
        if rev is None:
            print(f"{cell.name:<20} {tree / 1e6:8.3f} M")
        else:
            base = runs[rev][cell]
            change = (tree - base) / base
            print(f"{cell.name:<20} {base / 1e6:8.3f} -> {tree / 1e6:8.3f} M  ({change:+.2%})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
