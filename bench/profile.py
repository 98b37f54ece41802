"""`python -m bench.profile [stream|burst|history-N] [CONCURRENCY] [SECONDS]`: where the
gateway's CPU goes (`history-N`: a question after N exchanges of a recorded conversation).

Starts the same upstream and gateway as `make bench` (same cores, same config, a real virtual
key), loads the gateway with wrk for one cell, and meanwhile:
- samples it with py-spy (`--gil`: only the thread holding the GIL, so idle waits drop out),
  writing bench/results/profile-<cell>-<UTC>.txt (collapsed stacks, for flamegraph tools) and
  printing the functions with the most samples, self and inclusive;
- reads the process's CPU time from /proc before and after, and prints CPU microseconds per
  request, the figure each optimisation is judged by (less noisy than req/s on a shared core).
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from datetime import UTC, datetime
from pathlib import Path

from bench.run import CHAT_PATH, RESULTS, Bench, Cell, prepare_history, request_body
from bench.wrk import run_wrk


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds per thread: the event loop's (the main thread) and each other by its id
    (Python threads do not name themselves to the kernel)."""
    out: dict[str, float] = collections.defaultdict(float)
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = "loop" if task.name == str(pid) else f"thread {task.name}"
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tick = os.sysconf("SC_CLK_TCK")
        out[name] += (int(fields[11]) + int(fields[12])) / tick
        out[f"{name} (sys)"] += int(fields[12]) / tick
    return out


def summarise(collapsed: Path, top: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        count = int(count_text)
        total += count
        frames = stack.split(";")
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    if not total:
        return "no samples"
    out = [f"{total} samples", "", "self:"]
    out += [f"{100 * n / total:5.1f}%  {f}" for f, n in own.most_common(top)]
    out += ["", "inclusive:"]
    out += [f"{100 * n / total:5.1f}%  {f}" for f, n in inclusive.most_common(top)]
    return "\n".join(out)


def main() -> None:
    args = sys.argv[1:]
    burst = bool(args and args[0] == "burst")
    stream = burst or bool(args and args[0] == "stream")
    history = (
        int(args[0].removeprefix("history-")) if args and args[0].startswith("history-") else 0
    )
    if stream or history:
        args = args[1:]
    concurrency = int(args[0]) if args else 16
    seconds = int(args[1]) if len(args) > 1 else 8
    cell = Cell(stream, concurrency, burst, history)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    bench = Bench(seconds, 1, stamp)
    py_spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or "py-spy"
    RESULTS.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gw-profile-") as tmp:
        try:
            bench.start(Path(tmp))
            gateway = bench.children["gateway"]
            url = f"http://127.0.0.1:{bench.ports['gateway']}{CHAT_PATH}"
            body = request_body(stream, burst, history)
            if history:
                prepare_history(url, bench.api_key, history)
            run_wrk(bench.wrk, url, body, concurrency, 1, bench.target_core, bench.api_key)
            # The pass-through's CPU per request in the same run, for scale...
            passthrough = bench.children["passthrough"]
            pt_url = f"http://127.0.0.1:{bench.ports['passthrough']}{CHAT_PATH}"
            before = cpu_seconds(passthrough.pid)
            pt = run_wrk(bench.wrk, pt_url, body, concurrency, seconds, bench.target_core)
            pt_us = (cpu_seconds(passthrough.pid) - before) * 1e6 / max(1, pt.requests)
            # ...the gateway's without the profiler attached, per thread...
            before = cpu_seconds(gateway.pid)
            threads_before = thread_cpu(gateway.pid)
            plain = run_wrk(
                bench.wrk, url, body, concurrency, seconds, bench.target_core, bench.api_key
            )
            cpu_us = (cpu_seconds(gateway.pid) - before) * 1e6 / max(1, plain.requests)
            per_thread = {
                name: (spent - threads_before.get(name, 0.0)) * 1e6 / max(1, plain.requests)
                for name, spent in thread_cpu(gateway.pid).items()
            }
            # ...then with it, for the stacks.
            out = RESULTS / f"profile-{cell.mode}-c{concurrency}-{stamp}.txt"
            spy = subprocess.Popen(
                [py_spy, "record", "--gil", "-f", "raw", "-r", "200", "-d", str(seconds + 1),
                 "-o", str(out), "-p", str(gateway.pid)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            load = threading.Thread(
                target=run_wrk,
                args=(bench.wrk, url, body, concurrency, seconds, bench.target_core, bench.api_key),
            )
            load.start()
            load.join()
            spy.wait(timeout=seconds + 30)
            print(summarise(out))
            print(f"\n{cell.name}: {plain.rps:.0f} req/s, p50 {plain.p50_ms:.2f} ms, "
                  f"gateway CPU {cpu_us:.0f} us/request; stacks in {out}")  # fmt: skip
            print("  by thread: " + ", ".join(
                f"{name} {us:.0f}" for name, us in sorted(per_thread.items(), key=lambda kv: -kv[1])
                if us >= 1))  # fmt: skip
            print(f"passthrough: {pt.rps:.0f} req/s, p50 {pt.p50_ms:.2f} ms, "
                  f"CPU {pt_us:.0f} us/request")  # fmt: skip
        finally:
            for child in bench.children.values():
                child.stop()


if __name__ == "__main__":
    main()
