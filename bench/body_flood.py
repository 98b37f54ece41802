"""What a team's flood of large request bodies does to everyone else.

    .venv/bin/python -m bench.body_flood [--mb 12] [--flood 4] [--rounds 3] [--shape one|many]
                                         [--messages 2000] [--core 0] [--tree DIR]
                                         [--no-probes] [--late] [--profile stacks.txt]
                                         [--store postgresql://...]

A `gateway serve` process (SQLite store, or `--store URL`; master key, teams `a` and `b`) in
front of two fake upstreams (a process each: one for team a's model, one for team b's) that
read each body and answer a short stream. Team a sends `--flood` bodies of `--mb` megabytes at
once, `--rounds` times; meanwhile two probe processes ask again and again, each on a kept-alive
connection, one `GET /health/live` and one a small streamed chat completion of team b (its own
model). Prints each probe's median, 90th percentile and worst time, in milliseconds; the
gateway's CPU time a body (all of it, and its event loop's thread's: a
figure a busy machine moves less than the probes' times; `--no-probes` for it alone); and the
longest stretches of CPU its event loop ran at once during the flood (`watched_serve`), with
`--late` where it was when a timer on it ran 30 ms late.

`--shape one`: the body is one user message (the question is the size); `--shape many`: a
history of `--messages` messages, an agent's long run (threading and recording then work per
message). Everything runs on `--core` (a loaded machine), niced by the caller if wanted. The
probes are processes of their own, so their times are the gateway's, not the flood's client's.

`--tree DIR` runs the `gateway/` package in DIR (another revision's: `git archive REV gateway |
tar -x -C DIR`) against this one's bench.

With `--profile FILE`, py-spy samples the gateway for the flood and writes the event loop's
thread's stacks (collapsed, one per line with its count) to FILE, and prints the functions
that thread spent the most samples in (inclusive).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from bench.procs import HOST, cpu_s, free_port

REPO = Path(__file__).resolve().parent.parent
MASTER = "bench-master-key-0123456789"

# A probe: one kind of request, again and again on one kept-alive connection, until FILE
# is removed; then its times (seconds) as JSON on stdout, and each one's time to its headers.
_PROBE = r"""
import http.client, json, os, sys, time
port, kind, key, flag = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
body = json.dumps({"model": "other", "stream": True,
                   "messages": [{"role": "user", "content": "hi"}]})
headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
times = []
firsts = []
def once():
    began = time.perf_counter()
    if kind == "live":
        conn.request("GET", "/health/live")
    else:
        conn.request("POST", "/v1/chat/completions", body, headers)
    response = conn.getresponse()
    firsts.append(time.perf_counter() - began)
    response.read()
    assert response.status == 200, response.status
    return time.perf_counter() - began
once()
print("ready", flush=True)
while os.path.exists(flag):
    times.append(once())
    time.sleep(0.005)
print(json.dumps([times, firsts[1:]]), flush=True)
"""


def _frames(count: int) -> bytes:
    frame = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    parts = [
        {**frame, "choices": [{"index": 0, "delta": {"content": "ok "}, "finish_reason": None}]}
        for _ in range(count)
    ]
    parts.append({**frame, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return b"".join(b"data: " + orjson.dumps(p) + b"\n\n" for p in parts) + b"data: [DONE]\n\n"


_ANSWER = _frames(5)


def serve_upstream() -> None:
    """The fake upstream, on the port its command line names, until terminated."""

    async def serve() -> None:
        await _upstream(int(sys.argv[1]))
        print("ready", flush=True)
        await asyncio.Event().wait()

    asyncio.run(serve())


async def _upstream(port: int) -> web.AppRunner:
    async def answer(request: web.Request) -> web.StreamResponse:
        await request.read()  # read, not parsed: the upstream's own time is not measured
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(_ANSWER)
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/v1/chat/completions", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, HOST, port).start()
    return runner


def body(mb: int, shape: str, messages: int) -> bytes:
    size = mb * 1_000_000
    if shape == "one":
        words = " ".join(f"word{i % 5000}" for i in range(size // 9))
        history = [{"role": "user", "content": words}]
    else:
        each = size // messages
        history = [
            {"role": "user" if i % 2 == 0 else "assistant", "content": f"{i} " + "x" * each}
            for i in range(messages - 1)
        ]
        history.append({"role": "user", "content": "and now?"})
    return orjson.dumps({"model": "m", "stream": True, "messages": history})


async def _teams(session: aiohttp.ClientSession, url: str) -> dict[str, str]:
    admin = {"Authorization": f"Bearer {MASTER}"}
    keys = {}
    for team in ("a", "b"):
        async with session.post(
            url + "/v1/gateway/teams", json={"name": team, "id": team}, headers=admin
        ) as response:
            assert response.status == 201, await response.text()
        async with session.post(
            url + "/v1/gateway/keys", json={"team_id": team}, headers=admin
        ) as response:
            keys[team] = (await response.json())["key"]
    return keys


def _summary(name: str, times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))]
    return (
        f"{name:>6}: n={len(ordered):4d}  median {statistics.median(ordered) * 1000:7.1f} ms"
        f"  p90 {p90 * 1000:7.1f} ms  worst {ordered[-1] * 1000:7.1f} ms"
    )


def watched_serve() -> None:
    """`gateway serve` (its arguments from the command line) with a task on its event loop that
    wakes every 2 ms and notes the loop's thread's CPU time since its last wake: the longest of
    those is the longest the loop ran other work while a timer (or a request) waited, in CPU
    time, so a busy machine's preemption does not count. A thread notes where the loop's thread
    is whenever that timer is 30 ms late (`--late`). At shutdown both are written, as JSON, to
    `$BODY_FLOOD_BLOCKS`."""
    import gateway.app
    from gateway.cli import main as gateway_main

    stretches: list[tuple[float, float]] = []  # (when, CPU since the look before)
    beat = [time.monotonic()]
    late: collections.Counter[str] = collections.Counter()  # where the loop was, when late
    loop_thread = threading.get_ident()

    def sample() -> None:
        while True:
            time.sleep(0.005)
            if time.monotonic() - beat[0] > 0.03:
                frame = sys._current_frames().get(loop_thread)
                where = traceback.extract_stack(frame)[-6:] if frame else []
                late[
                    " <- ".join(
                        f"{f.name} ({f.filename.rsplit('/', 2)[-1]}:{f.lineno})"
                        for f in reversed(where)
                    )
                ] += 1

    async def watch(_: web.Application) -> None:
        async def look() -> None:
            last = time.thread_time()
            while True:
                await asyncio.sleep(0.002)
                now = time.thread_time()
                beat[0] = time.monotonic()
                stretches.append((beat[0], now - last))
                last = now

        watching.append(asyncio.ensure_future(look()))
        threading.Thread(target=sample, daemon=True).start()

    async def report(_: web.Application) -> None:
        with open(os.environ["BODY_FLOOD_BLOCKS"], "w") as out:  # noqa: ASYNC230 (at exit)
            json.dump({"stretches": stretches, "late": late.most_common(12)}, out)

    watching: list[asyncio.Future[None]] = []
    create_app = gateway.app.create_app

    def create_watched_app(*args: Any, **kwargs: Any) -> web.Application:
        app = create_app(*args, **kwargs)
        app.on_startup.append(watch)
        app.on_shutdown.append(report)
        return app

    gateway.app.create_app = create_watched_app
    sys.argv = ["gateway", *sys.argv[1:]]
    sys.exit(gateway_main())


def _loop_cpu_s(pid: int) -> float:
    """CPU time of the process's main thread, its event loop's, so far."""
    return int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[0]) / 1e9


def _profile_report(raw: Path, out: Path) -> None:
    """The event loop's thread's stacks from py-spy's raw output, and its top functions."""
    loop_stacks: collections.Counter[str] = collections.Counter()
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if "MainThread" in stack.split(";", 1)[0]:
            loop_stacks[stack] += int(count)
    out.write_text("".join(f"{s} {n}\n" for s, n in loop_stacks.most_common()))
    inclusive: collections.Counter[str] = collections.Counter()
    itself: collections.Counter[str] = collections.Counter()
    total = sum(loop_stacks.values())
    for stack, samples in loop_stacks.items():
        frames = stack.split(";")
        itself[frames[-1]] += samples
        for frame in set(frames):
            inclusive[frame] += samples
    for title, counter in (("inclusive", inclusive), ("in itself", itself)):
        print(f"event loop's thread, {total} samples; the top functions ({title}):")
        for frame, samples in counter.most_common(25):
            print(f"  {100 * samples / max(total, 1):5.1f}%  {frame}")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=12)
    parser.add_argument("--flood", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", choices=["one", "many"], default="one")
    parser.add_argument("--messages", type=int, default=2000)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument("--profile", type=Path)
    parser.add_argument("--late", action="store_true", help="where the loop was when late")
    parser.add_argument("--store", help="the store's URL (a PostgreSQL one); SQLite by default")
    parser.add_argument(
        "--no-probes", dest="probes", action="store_false", help="the CPU figures alone"
    )
    parser.add_argument(
        "--tree", type=Path, default=REPO, help="a directory holding the gateway/ to run"
    )
    args = parser.parse_args()
    os.sched_setaffinity(0, {args.core})
    payload = body(args.mb, args.shape, args.messages)
    port = free_port()
    # Two upstreams, each a process of its own: the flood's and the other team's model's, so
    # that the flood's bodies, read by its upstream, delay neither the flood's client nor the
    # other team's answers (a provider's time is not the gateway's).
    upstreams, ports = [], {}
    for model in ("m", "other"):
        ports[model] = free_port()
        upstreams.append(
            await asyncio.create_subprocess_exec(
                *[sys.executable, "-c", "import bench.body_flood as b; b.serve_upstream()"],
                str(ports[model]),
                cwd=REPO,
                stdout=asyncio.subprocess.PIPE,
            )
        )
    for upstream in upstreams:
        assert upstream.stdout is not None
        assert await upstream.stdout.readline() == b"ready\n"
    try:
        with tempfile.TemporaryDirectory() as tmp:
            config = Path(tmp) / "gw.yaml"
            models = [
                {
                    "name": model,
                    "deployments": [
                        {
                            "provider": "openai",
                            "model": "m",
                            "api_base": f"http://{HOST}:{upstream_port}/v1",
                            "api_key": "sk-up",
                        }
                    ],
                }
                for model, upstream_port in ports.items()
            ]
            config.write_bytes(
                orjson.dumps(
                    {
                        "auth": {"master_key": MASTER},
                        "store": {"url": args.store or f"sqlite:///{tmp}/gw.db", "spool_path": tmp},
                        "models": models,
                    }
                )
            )
            blocks_file = Path(tmp) / "blocks.json"
            gateway = await asyncio.create_subprocess_exec(
                *[sys.executable, "-c", "import bench.body_flood as b; b.watched_serve()"],
                *["serve", "--config", str(config), "--port", str(port)],
                cwd=args.tree,
                env={**os.environ, "PYTHONPATH": str(REPO), "BODY_FLOOD_BLOCKS": str(blocks_file)},
                stderr=asyncio.subprocess.PIPE,
            )
            assert gateway.stderr is not None
            said = []
            while b"listening on" not in (line := await gateway.stderr.readline()):
                said.append(line.decode())
                assert line, "the gateway exited before listening:\n" + "".join(said[-20:])
            drain = asyncio.ensure_future(gateway.stderr.read())
            url = f"http://{HOST}:{port}"
            try:
                async with aiohttp.ClientSession() as session:
                    keys = await _teams(session, url)
                    # Steady state: the tokenizer an estimate needs loads on a thread after the
                    # start (an estimate before that loads it on the event loop, once).
                    await asyncio.sleep(3)
                    flag = Path(tmp) / "flooding"
                    flag.touch()
                    probes = {}
                    for kind in ("live", "other") if args.probes else ():
                        probes[kind] = await asyncio.create_subprocess_exec(
                            *[sys.executable, "-c", _PROBE, str(port), kind, keys["b"], str(flag)],
                            stdout=asyncio.subprocess.PIPE,
                        )
                    for probe in probes.values():
                        assert probe.stdout is not None
                        assert await probe.stdout.readline() == b"ready\n"
                    spy = None
                    if args.profile:
                        raw = args.profile.with_suffix(".raw")
                        py_spy = str(Path(sys.executable).parent / "py-spy")
                        spy = await asyncio.create_subprocess_exec(
                            *[py_spy, "record", "--pid", str(gateway.pid), "--rate", "250"],
                            *["--format", "raw", "--output", str(raw), "--threads"],
                            stdout=asyncio.subprocess.DEVNULL,
                            stderr=asyncio.subprocess.DEVNULL,
                        )
                        await asyncio.sleep(1)

                    async def large() -> int:
                        async with session.post(
                            url + "/v1/chat/completions",
                            data=payload,
                            headers={
                                "Authorization": f"Bearer {keys['a']}",
                                "Content-Type": "application/json",
                            },
                        ) as response:
                            await response.read()
                            return response.status

                    loop_began, all_began = _loop_cpu_s(gateway.pid), cpu_s(gateway.pid) or 0.0
                    began, flood_from = time.perf_counter(), time.monotonic()
                    for _ in range(args.rounds):
                        statuses = await asyncio.gather(*(large() for _ in range(args.flood)))
                        assert statuses == [200] * args.flood, statuses
                    took, flood_to = time.perf_counter() - began, time.monotonic()
                    loop_cpu = _loop_cpu_s(gateway.pid) - loop_began
                    all_cpu = (cpu_s(gateway.pid) or 0.0) - all_began
                    flag.unlink()
                    times, headers_at = {}, {}
                    for kind, probe in probes.items():
                        out, _ = await probe.communicate()
                        times[kind], headers_at[kind] = json.loads(out.decode().splitlines()[-1])
                    if spy is not None:
                        spy.send_signal(signal.SIGINT)
                        await asyncio.wait_for(spy.wait(), 30)
            finally:
                gateway.terminate()
                await gateway.wait()
                await drain
            watched = json.loads(blocks_file.read_text())
            blocks = watched["stretches"]
        print(
            f"{args.rounds} rounds of {args.flood} bodies of {len(payload) / 1e6:.1f} MB"
            f" ({args.shape}{f', {args.messages} messages' if args.shape == 'many' else ''}):"
            f" {took:.1f} s"
        )
    finally:
        for upstream in upstreams:
            upstream.terminate()
            await upstream.wait()
    bodies = args.rounds * args.flood
    print(
        f"gateway CPU a body: {all_cpu / bodies * 1000:.1f} ms, of it on the event loop's thread"
        f" {loop_cpu / bodies * 1000:.1f} ms{' (and the probes)' if args.probes else ''}"
    )
    ordered = sorted((cpu for when, cpu in blocks if flood_from <= when <= flood_to), reverse=True)
    print(
        "event loop's longest stretches of CPU between two looks of a 2 ms timer: "
        + ", ".join(f"{b * 1000:.1f}" for b in ordered[:8])
        + " ms"
    )
    for kind, seen in times.items():
        print(_summary(kind, seen))
        worst = max(range(len(seen)), key=seen.__getitem__)
        print(f"{'':8}(its worst had its headers after {headers_at[kind][worst] * 1000:.1f} ms)")
    if args.late:
        print(
            "where the event loop's thread was, sampled every 5 ms while the timer was 30 ms late:"
        )
        for where, samples in watched["late"]:
            print(f"  {samples:4d}  {where}")
    if args.profile:
        _profile_report(args.profile.with_suffix(".raw"), args.profile)


if __name__ == "__main__":
    asyncio.run(main())
