"""`python -m bench.run` (`make bench`): direct vs bare pass-through vs gateway, side by side.

One run starts the fake upstream on one core, the pass-through and the gateway on the other
(with wrk on that same core), and drives every cell (non-stream / 50-chunk stream at
concurrency 1, 16, 64) against the three targets back to back, so machine drift hits all
three alike. Prints a table and writes the same numbers to bench/results/bench-<UTC>.json.
Exit status 1 when any cell saw errors or a process misbehaved.
"""

from __future__ import annotations

import http.client
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench.procs import HOST, Child, free_port, http_get_status, port_open, spawn, wait_until
from bench.upstream import STREAM_CHUNKS
from bench.wrk import WrkResult, ensure_wrk, run_wrk, wrk_version

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TARGETS = ("direct", "passthrough", "gateway")
CONCURRENCY = (1, 16, 64)
WARMUP_S = 1
CHAT_PATH = "/v1/chat/completions"
MASTER_KEY = "bench-master-key-0123456789"


@dataclass(frozen=True)
class Cell:
    stream: bool
    concurrency: int

    @property
    def mode(self) -> str:
        return f"stream-{STREAM_CHUNKS}" if self.stream else "non-stream"

    @property
    def name(self) -> str:
        return f"{self.mode} c={self.concurrency}"


CELLS = [Cell(stream, c) for stream in (False, True) for c in CONCURRENCY]


def request_body(stream: bool) -> bytes:
    body: dict[str, Any] = {
        "model": "bench",
        "messages": [{"role": "user", "content": "Say hello."}],
        "stream": stream,
    }
    if stream:
        # Ask for usage ourselves so all three targets move the same bytes: the gateway would
        # otherwise add it and get one more (usage) chunk than direct and passthrough.
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name, "")
    try:
        return max(1, round(float(raw))) if raw else default
    except ValueError:
        sys.exit(f"{name} must be a number of seconds/rounds, got {raw!r}")


def pick_cores() -> tuple[int, int, str | None]:
    """(upstream core, target+wrk core, warning). Falls back to one core with a warning."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        return cores[0], cores[1], None
    return cores[0], cores[0], f"only one CPU available ({cores}); everything shares it"


def write_gateway_config(tmp: Path, upstream_port: int) -> Path:
    config = tmp / "gateway.yaml"
    # JSON is valid YAML; the store lives in the temp dir so each run starts empty.
    config.write_bytes(
        orjson.dumps(
            {
                "server": {"host": HOST, "port": 0},
                "store": {"url": f"sqlite:///{tmp / 'bench.db'}", "spool_path": str(tmp)},
                # Every feature on: requests carry a virtual key, checked against the store.
                "auth": {"master_key": MASTER_KEY},
                "models": [
                    {
                        "name": "bench",
                        "deployments": [
                            {
                                "provider": "openai",
                                "model": "fake-model",
                                "api_base": f"http://{HOST}:{upstream_port}/v1",
                                "api_key": "sk-bench",
                            }
                        ],
                    }
                ],
            },
            option=orjson.OPT_INDENT_2,
        )
    )
    return config


def create_virtual_key(gateway_bin: Path, config: Path) -> str:
    """A team and a key in the bench store, made with the CLI as an operator would."""
    def cli(*args: str) -> str:
        return subprocess.run(
            [str(gateway_bin), *args, "--config", str(config)],
            capture_output=True, text=True, check=True, cwd=REPO,
        ).stdout  # fmt: skip

    cli("teams", "create", "bench", "--id", "bench")
    out = cli("keys", "create", "--team", "bench", "--name", "bench")
    return out.split("secret (shown once, store it now): ", 1)[1].split()[0]


def smoke_check(port: int, stream: bool, api_key: str) -> str | None:
    """One request through a target before loading it: a 200 that is not a full answer (e.g.
    an error event inside the stream) would otherwise be counted as a success by wrk."""
    conn = http.client.HTTPConnection(HOST, port, timeout=10)
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
        conn.request("POST", CHAT_PATH, body=request_body(stream), headers=headers)
        response = conn.getresponse()
        data = response.read()
    except OSError as exc:
        return f"request failed: {exc!r}"
    finally:
        conn.close()
    if response.status != 200:
        return f"status {response.status}: {data[:300]!r}"
    if stream:
        words = data.count(b'"content":"word "')
        if words != STREAM_CHUNKS or not data.endswith(b"data: [DONE]\n\n"):
            return f"stream had {words} content chunks, tail {data[-120:]!r}"
        return None
    try:
        content = orjson.loads(data)["choices"][0]["message"]["content"]
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        return f"not a chat.completion: {data[:300]!r}"
    return None if content else "empty completion content"


def git_revision() -> str:
    def git(*args: str) -> str:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=False)
        return out.stdout.strip()

    rev = git("rev-parse", "--short", "HEAD") or "unknown"
    return rev + ("-dirty" if git("status", "--porcelain", "--", "gateway") else "")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


# wrk closes its connections when its time is up, with requests still in flight; the servers
# then fail to write to a closed socket. Expected once per open connection per wrk run.
DISCONNECT_ERRORS = ("ClientConnectionResetError", "ConnectionResetError", "BrokenPipeError")


@dataclass
class LogScan:
    disconnects: int  # tracebacks caused by a client that went away (see DISCONNECT_ERRORS)
    problems: list[str]  # anything else logged as a traceback, ERROR or CRITICAL


def scan_log(path: Path) -> LogScan:
    """Group a child's log into incidents (an ERROR line and/or its traceback) and sort them."""
    lines = path.read_text(errors="replace").splitlines() if path.exists() else []
    incidents: list[list[str]] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        is_error_line = " ERROR " in line or " CRITICAL " in line
        if line.startswith("Traceback") or is_error_line:
            incident = [line]
            i += 1
            if is_error_line and i < len(lines) and lines[i].startswith("Traceback"):
                incident.append(lines[i])
                i += 1
            if incident[-1].startswith("Traceback"):
                # A traceback ends at its first unindented line: the exception itself.
                while i < len(lines) and lines[i].startswith((" ", "\t")):
                    incident.append(lines[i])
                    i += 1
                if i < len(lines):
                    incident.append(lines[i])
                    i += 1
            incidents.append(incident)
            continue
        i += 1
    disconnects = [x for x in incidents if len(x) > 1 and x[-1].startswith(_disconnect_prefixes())]
    problems = ["\n".join(x) for x in incidents if x not in disconnects]
    return LogScan(len(disconnects), problems)


def _disconnect_prefixes() -> tuple[str, ...]:
    return tuple(
        f"{module}{name}"
        for name in DISCONNECT_ERRORS
        for module in ("", "aiohttp.client_exceptions.")
    )


def median_of(results: list[WrkResult]) -> dict[str, Any]:
    return {
        "rps": round(statistics.median(r.rps for r in results), 1),
        "p50_ms": round(statistics.median(r.p50_ms for r in results), 3),
        "p99_ms": round(statistics.median(r.p99_ms for r in results), 3),
        "requests": sum(r.requests for r in results),
        "errors": {k: sum(r.errors[k] for r in results) for k in results[0].errors},
    }


class Bench:
    def __init__(self, duration_s: int, rounds: int, stamp: str) -> None:
        self.duration_s = duration_s
        self.rounds = rounds
        self.stamp = stamp
        self.wrk = ensure_wrk()
        self.upstream_core, self.target_core, self.core_warning = pick_cores()
        self.children: dict[str, Child] = {}
        self.api_key = "sk-bench"
        self.ports: dict[str, int] = {}
        self.results: dict[tuple[Cell, str], list[WrkResult]] = {}
        self.warmup_errors: dict[str, int] = {}
        self.failures: list[str] = []
        self.cold_start_s: float | None = None
        self.peak_rss_kib: dict[str, int | None] = {}
        self.gateway_db_mib: float | None = None
        # Taken now, not at the end: the gateway imports its code at spawn, and the tree may move.
        self.git = git_revision()

    def log_path(self, name: str) -> Path:
        return RESULTS / f"{name}-{self.stamp}.log"

    def start(self, tmp: Path) -> None:
        py = sys.executable
        up_port = free_port()
        self.ports["direct"] = up_port
        upstream = spawn(
            "upstream",
            [py, "-m", "bench.upstream", "--port", str(up_port)],
            self.upstream_core,
            self.log_path("upstream"),
            REPO,
        )
        self.children["upstream"] = upstream
        wait_until(upstream, lambda: port_open(up_port))

        pt_port = free_port()
        self.ports["passthrough"] = pt_port
        args = ["--port", str(pt_port), "--upstream", f"http://{HOST}:{up_port}"]
        passthrough = spawn(
            "passthrough",
            [py, "-m", "bench.passthrough", *args],
            self.target_core,
            self.log_path("passthrough"),
            REPO,
        )
        self.children["passthrough"] = passthrough
        wait_until(passthrough, lambda: port_open(pt_port))

        gw_port = free_port()
        self.ports["gateway"] = gw_port
        gateway_bin = Path(py).parent / "gateway"
        config = write_gateway_config(tmp, up_port)
        self.api_key = create_virtual_key(gateway_bin, config)
        gateway = spawn(
            "gateway",
            [str(gateway_bin), "serve", "--config", str(config), "--host", HOST,
             "--port", str(gw_port)],
            self.target_core,
            self.log_path("gateway"),
            REPO,
        )  # fmt: skip
        self.children["gateway"] = gateway
        # Cold start: spawn to the first 200 from /health/ready (imports, config, store open).
        self.cold_start_s = wait_until(
            gateway, lambda: http_get_status(gw_port, "/health/ready", timeout=0.5) == 200
        )

    def smoke(self) -> None:
        for target in TARGETS:
            for stream in (False, True):
                problem = smoke_check(self.ports[target], stream, self.api_key)
                if problem:
                    mode = "stream" if stream else "non-stream"
                    self.failures.append(f"smoke check {target} {mode}: {problem}")

    def dead_targets(self) -> list[str]:
        return [name for name, child in self.children.items() if not child.alive()]

    def measure(self) -> None:
        for round_no in range(self.rounds):
            for cell in CELLS:
                body = request_body(cell.stream)
                for target in TARGETS:
                    url = f"http://{HOST}:{self.ports[target]}{CHAT_PATH}"
                    label = f"round {round_no + 1}/{self.rounds} {cell.name:<18} {target:<12}"
                    print(label, end="", flush=True)
                    run = (self.wrk, url, body, cell.concurrency)
                    warm = run_wrk(*run, WARMUP_S, self.target_core, self.api_key)
                    if warm.error_total:
                        self.warmup_errors[f"{cell.name} {target}"] = warm.error_total
                    result = run_wrk(*run, self.duration_s, self.target_core, self.api_key)
                    self.results.setdefault((cell, target), []).append(result)
                    flag = f"  !!! ERRORS {result.errors}" if result.error_total else ""
                    print(f"{result.rps:9.0f} req/s  p50 {result.p50_ms:7.2f} ms{flag}", flush=True)
                    dead = self.dead_targets()
                    if dead:
                        self.failures.append(
                            f"process(es) {dead} died during {cell.name} {target}; see logs"
                        )
                        return

    def stop(self) -> None:
        for name, child in self.children.items():
            self.peak_rss_kib[name] = child.peak_rss_kib()  # before stopping: /proc goes away
        for child in reversed(list(self.children.values())):
            child.stop()

    def report(self) -> dict[str, Any]:
        cells: list[dict[str, Any]] = []
        for cell in CELLS:
            row: dict[str, Any] = {
                "mode": cell.mode,
                "concurrency": cell.concurrency,
                "targets": {},
            }
            for target in TARGETS:
                runs = self.results.get((cell, target))
                if runs:
                    row["targets"][target] = {
                        **median_of(runs),
                        "rounds": [r.as_dict() for r in runs],
                    }
            measured = row["targets"]
            if "gateway" in measured and "passthrough" in measured:
                pt_rps = measured["passthrough"]["rps"]
                row["gateway_over_passthrough_rps"] = (
                    round(measured["gateway"]["rps"] / pt_rps, 3) if pt_rps else None
                )
            row["error_total"] = sum(sum(t["errors"].values()) for t in measured.values())
            cells.append(row)

        added: dict[str, dict[str, float]] = {}
        for row in cells:
            targets = row["targets"]
            if row["concurrency"] == 1 and "direct" in targets:
                base = targets["direct"]["p50_ms"]
                added[row["mode"]] = {
                    t: round(targets[t]["p50_ms"] - base, 3)
                    for t in ("passthrough", "gateway")
                    if t in targets
                }
        scans = {name: scan_log(self.log_path(name)) for name in self.children}
        return {
            "timestamp_utc": self.stamp,
            "settings": {
                "duration_s": self.duration_s,
                "warmup_s": WARMUP_S,
                "rounds": self.rounds,
                "stream_chunks": STREAM_CHUNKS,
                "wrk_threads": 1,
                "upstream_core": self.upstream_core,
                "target_and_wrk_core": self.target_core,
                "core_warning": self.core_warning,
            },
            "machine": {
                "cpu": cpu_model(),
                "cpus": os.cpu_count(),
                "kernel": platform.release(),
                "python": platform.python_version(),
                "wrk": wrk_version(self.wrk),
                "git": self.git,
            },
            "cells": cells,
            "added_p50_ms_over_direct_c1": added,
            "peak_rss_mib": {
                name: round(kib / 1024, 1) if kib is not None else None
                for name, kib in self.peak_rss_kib.items()
                if name in ("passthrough", "gateway")
            },
            "gateway_cold_start_s": round(self.cold_start_s, 3) if self.cold_start_s else None,
            "gateway_db_mib": self.gateway_db_mib,
            "warmup_errors": self.warmup_errors,
            "failures": self.failures,
            "log_problems": {name: scan.problems for name, scan in scans.items() if scan.problems},
            # Informational: tracebacks from wrk dropping its connections at the end of each run.
            "log_client_disconnects": {name: scan.disconnects for name, scan in scans.items()},
            "logs": {name: str(self.log_path(name).relative_to(REPO)) for name in self.children},
        }


def print_report(report: dict[str, Any]) -> None:
    s = report["settings"]
    print()
    print(
        f"bench {report['timestamp_utc']}  git {report['machine']['git']}  "
        f"{s['duration_s']} s x {s['rounds']} round(s)  upstream on CPU {s['upstream_core']}, "
        f"targets + wrk on CPU {s['target_and_wrk_core']}"
    )
    if s["core_warning"]:
        print(f"WARNING: {s['core_warning']}")
    header = f"{'cell':<18} {'target':<12} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
    print(header)
    print("-" * len(header) + "  gw/pt")
    for row in report["cells"]:
        cell = f"{row['mode']} c={row['concurrency']}"
        for target, m in row["targets"].items():
            errors = sum(m["errors"].values())
            ratio = ""
            if target == "gateway" and row.get("gateway_over_passthrough_rps") is not None:
                ratio = f"  {row['gateway_over_passthrough_rps']:.2f}"
            loud = "  <-- !!! ERRORS " + str(m["errors"]) if errors else ""
            print(
                f"{cell:<18} {target:<12} {m['rps']:9.0f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} "
                f"{errors:7d}{ratio}{loud}"
            )
            cell = ""
    print()
    for mode, added in report["added_p50_ms_over_direct_c1"].items():
        parts = ", ".join(f"{t} +{v:.3f} ms" for t, v in added.items())
        print(f"added p50 over direct at c=1, {mode}: {parts}")
    rss = ", ".join(f"{k} {v} MiB" for k, v in report["peak_rss_mib"].items())
    print(f"peak RSS (VmHWM): {rss}")
    print(f"gateway cold start (spawn -> first 200 on /health/ready): "
          f"{report['gateway_cold_start_s']} s")  # fmt: skip
    disconnects = ", ".join(f"{k} {v}" for k, v in report["log_client_disconnects"].items())
    print(f"client-disconnect tracebacks in logs (wrk stops mid-request; expected): {disconnects}")
    print(f"gateway SQLite store at the end (db + wal): {report['gateway_db_mib']} MiB")
    if report["warmup_errors"]:
        print(f"!!! errors during warm-up: {report['warmup_errors']}")
    for name, found in report["log_problems"].items():
        print(f"!!! {len(found)} problem(s) in the {name} log ({report['logs'][name]}); first:")
        print("    " + found[0].replace("\n", "\n    "))
    for failure in report["failures"]:
        print(f"!!! FAILURE: {failure}")
    total = sum(row["error_total"] for row in report["cells"])
    if total:
        print(f"!!! {total} failed requests (connect/read/write/timeout/non-2xx) across cells")


def main() -> int:
    duration_s = env_int("BENCH_DURATION", 5)
    rounds = env_int("BENCH_ROUNDS", 1)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    bench = Bench(duration_s, rounds, stamp)
    # The harness only waits on children; keep its polling off the core under test.
    os.sched_setaffinity(0, {bench.upstream_core})
    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    started = time.perf_counter()
    try:
        bench.start(tmp)
        bench.smoke()
        if not bench.failures:
            bench.measure()
    except Exception as exc:  # still report what was measured, and stop every child
        bench.failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        bench.stop()
        # How much the gateway recorded: the SQLite file plus its write-ahead log.
        db_bytes = sum(f.stat().st_size for f in tmp.glob("bench.db*"))
        bench.gateway_db_mib = round(db_bytes / 2**20, 1)
        shutil.rmtree(tmp, ignore_errors=True)
    report = bench.report()
    report["wall_s"] = round(time.perf_counter() - started, 1)
    out = RESULTS / f"bench-{stamp}.json"
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print_report(report)
    print(f"\nwrote {out.relative_to(REPO)}")
    bad = report["failures"] or report["log_problems"] or report["warmup_errors"]
    return 1 if bad or any(row["error_total"] for row in report["cells"]) else 0


if __name__ == "__main__":
    sys.exit(main())
