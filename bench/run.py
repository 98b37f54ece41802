"""`python -m bench.run` (`make bench`): direct vs bare pass-through vs gateway, side by side.

One run starts the fake upstream on one core, the pass-through and the gateway (one worker and
`--workers 2`) on the other (with wrk on that same core), and drives every cell (non-stream /
50-chunk stream sent a chunk per write / the same stream in one write, at concurrency 1, 16,
64) against the targets back to back, so machine drift
hits them alike. Then the scaling pairs: the gateway with 1 and with 2 workers, both allowed
every core. Before any load, the gateway's cold start: fresh processes timed from spawn to
/health/ready and to their first answered chat completion. Prints tables and writes the same
numbers to bench/results/bench-<UTC>.json. Exit status 1 when any cell saw errors or a process
misbehaved.

`python -m bench.run cold-start [N]` times only N cold starts (default 5), for judging startup
work without a full run.
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
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench.procs import (
    HOST,
    Child,
    cpu_s,
    free_port,
    http_get,
    http_get_status,
    peak_rss_kib,
    port_open,
    set_affinity,
    spawn,
    wait_until,
)
from bench.upstream import ANSWER, BURST, STREAM_CHUNKS
from bench.wrk import WrkResult, ensure_wrk, run_wrk, wrk_version

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
TARGETS = ("direct", "passthrough", "gateway")
W2 = "gateway-w2"
CONCURRENCY = (1, 16, 64)
WARMUP_S = 1
CHAT_PATH = "/v1/chat/completions"
MASTER_KEY = "bench-master-key-0123456789"


@dataclass(frozen=True)
class Cell:
    stream: bool
    concurrency: int
    burst: bool = False  # the stream arrives in one write, not a chunk per write
    # Earlier exchanges the request carries, of a conversation the gateway recorded (threading
    # finds it by them): `prepare_history` makes it before the cell is loaded.
    history: int = 0

    @property
    def mode(self) -> str:
        if not self.stream:
            return f"non-stream-history-{self.history}" if self.history else "non-stream"
        return f"stream-{STREAM_CHUNKS}" + ("-burst" if self.burst else "")

    @property
    def name(self) -> str:
        return f"{self.mode} c={self.concurrency}"


CELLS = [
    Cell(stream, c, burst)
    for stream, burst in ((False, False), (True, False), (True, True))
    for c in CONCURRENCY
]
# Where a second worker can help at all: wrk -c1 keeps one connection, and a connection stays
# with the worker the kernel gave it, so at c=1 one worker does all the work by construction.
SCALING_CELLS = [cell for cell in CELLS if cell.concurrency > 1 and not cell.burst]


def history_messages(exchanges: int) -> list[dict[str, str]]:
    """`exchanges` questions, each with the answer the bench's upstream gives, as a client that
    keeps its history sends them (each length its own questions: no two cells' conversations
    share a first exchange)."""
    messages = []
    for number in range(exchanges):
        question = f"Question {number + 1} of {exchanges}: say hello."
        messages.append({"role": "user", "content": question})
        messages.append({"role": "assistant", "content": ANSWER})
    return messages


def request_body(stream: bool, burst: bool = False, history: int = 0) -> bytes:
    body: dict[str, Any] = {
        "model": "bench",
        "messages": [*history_messages(history), {"role": "user", "content": "Say hello."}],
        "stream": stream,
    }
    if burst:
        body["user"] = BURST
    if stream:
        # Ask for usage ourselves so all three targets move the same bytes: the gateway would
        # otherwise add it and get one more (usage) chunk than direct and passthrough.
        body["stream_options"] = {"include_usage": True}
    return orjson.dumps(body)


def prepare_history(url: str, key: str, exchanges: int) -> None:
    """The conversation a `history` cell's requests continue: its `exchanges` turns, one
    request each, as the client made them."""
    for made in range(exchanges):
        messages = history_messages(exchanges)[: 2 * made + 1]  # the next question, unanswered
        body = orjson.dumps({"model": "bench", "messages": messages})
        request = urllib.request.Request(url, data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        request.add_header("Authorization", f"Bearer {key}")
        with urllib.request.urlopen(request, timeout=30) as response:
            if response.status != 200:
                raise SystemExit(f"preparing the history: {response.status}")


def env_int(name: str, default: int, minimum: int = 1) -> int:
    raw = os.environ.get(name, "")
    try:
        return max(minimum, round(float(raw))) if raw else default
    except ValueError:
        sys.exit(f"{name} must be a number, got {raw!r}")


def pick_cores() -> tuple[int, int, str | None]:
    """(upstream core, target+wrk core, warning). Falls back to one core with a warning."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) >= 2:
        return cores[0], cores[1], None
    return cores[0], cores[0], f"only one CPU available ({cores}); everything shares it"


def write_gateway_config(
    tmp: Path, upstream_port: int, overrides: dict[str, Any] | None = None
) -> Path:
    """The bench's gateway config; `overrides` maps dotted paths (`logging.access_log`) to
    values, said only when given (an older revision may know no such key)."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = tmp / "gateway.yaml"
    # JSON is valid YAML; the store lives in the temp dir so each run starts empty.
    raw: dict[str, Any] = {
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
    }
    for path, value in (overrides or {}).items():
        *parents, leaf = path.split(".")
        node = raw
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    config.write_bytes(orjson.dumps(raw, option=orjson.OPT_INDENT_2))
    return config


def create_virtual_key(gateway_bin: Path, config: Path, env: dict[str, str] | None = None) -> str:
    """A team and a key in the bench store, made with the CLI as an operator would."""

    def cli(*args: str) -> str:
        return subprocess.run(
            [str(gateway_bin), *args, "--config", str(config)],
            capture_output=True, text=True, check=True, cwd=REPO, env=env,
        ).stdout  # fmt: skip

    cli("teams", "create", "bench", "--id", "bench")
    out = cli("keys", "create", "--team", "bench", "--name", "bench")
    return out.split("secret (shown once, store it now): ", 1)[1].split()[0]


def smoke_check(
    port: int, stream: bool, api_key: str, timeout: float = 10, burst: bool = False
) -> str | None:
    """One request through a target before loading it: a 200 that is not a full answer (e.g.
    an error event inside the stream) would otherwise be counted as a success by wrk."""
    conn = http.client.HTTPConnection(HOST, port, timeout=timeout)
    try:
        headers = {"Content-Type": "application/json", "Authorization": f"Bearer {api_key}"}
        conn.request("POST", CHAT_PATH, body=request_body(stream, burst), headers=headers)
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


def child_env(pycache: Path | None) -> dict[str, str]:
    """The environment of every process the bench starts. With `pycache`, bytecode is cached
    there (and nowhere else): a source checkout run under PYTHONDONTWRITEBYTECODE=1 (as in some
    containers) would otherwise compile the gateway's own modules on every start, ~0.2 s that
    no installed gateway pays (pip compiles at install; a checkout writes __pycache__ once)."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def bytecode_note(pycache: Path | None) -> str:
    if pycache is not None:
        return "cached (PYTHONPYCACHEPREFIX in the run's temp dir, primed by one discarded start)"
    if os.environ.get("PYTHONDONTWRITEBYTECODE"):
        return "as the environment has it: PYTHONDONTWRITEBYTECODE=1, uncached modules compile"
    return "as the environment has it"


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


def ratio(numerator: float, denominator: float) -> float | None:
    return round(numerator / denominator, 3) if denominator else None


def median_of(results: list[WrkResult]) -> dict[str, Any]:
    return {
        "rps": round(statistics.median(r.rps for r in results), 1),
        "p50_ms": round(statistics.median(r.p50_ms for r in results), 3),
        "p99_ms": round(statistics.median(r.p99_ms for r in results), 3),
        "requests": sum(r.requests for r in results),
        "errors": {k: sum(r.errors[k] for r in results) for k in results[0].errors},
    }


class Bench:
    def __init__(
        self,
        duration_s: int,
        rounds: int,
        stamp: str,
        *,
        workers2: bool = False,
        cold_starts: int = 0,
        pycache: Path | None = None,
    ) -> None:
        self.duration_s = duration_s
        self.rounds = rounds
        self.stamp = stamp
        self.workers2 = workers2
        self.cold_start_count = cold_starts
        self.pycache = pycache
        self.env = child_env(pycache)
        self.bytecode = bytecode_note(pycache)
        self.wrk = ensure_wrk()
        # Read before main() pins the harness to one core.
        self.cores = sorted(os.sched_getaffinity(0))
        self.upstream_core, self.target_core, self.core_warning = pick_cores()
        self.targets = TARGETS + ((W2,) if workers2 else ())
        self.children: dict[str, Child] = {}
        self.api_key = "sk-bench"  # the gateway's; the other targets ignore it
        self.keys: dict[str, str] = {}
        self.ports: dict[str, int] = {}
        self.configs: dict[str, Path] = {}
        self.gateway_bin = Path(sys.executable).parent / "gateway"
        self.results: dict[tuple[Cell, str], list[WrkResult]] = {}
        # CPU microseconds a request of each measured run (every process of the target).
        self.cpu_us: dict[tuple[Cell, str], list[float]] = {}
        self.scaling: dict[tuple[Cell, str], list[WrkResult]] = {}
        self.warmup_errors: dict[str, int] = {}
        self.failures: list[str] = []
        self.cold_ready_s: list[float] = []
        self.cold_answered_s: list[float] = []
        # The gateway's own CPU to its first answer: what it does, whatever else the machine runs.
        self.cold_cpu_s: list[float] = []
        self.peak_rss_kib: dict[str, int | None] = {}
        self.w2_rss_kib: dict[str, int | None] = {}
        self.db_mib: dict[str, float] = {}
        # Taken now, not at the end: the gateway imports its code at spawn, and the tree may move.
        self.git = git_revision()

    def log_path(self, name: str) -> Path:
        return RESULTS / f"{name}-{self.stamp}.log"

    def key_for(self, target: str) -> str:
        return self.keys.get(target, self.api_key)

    def start(self, tmp: Path) -> None:
        """Upstream, pass-through and a one-worker gateway (what bench.profile needs)."""
        self.start_upstream()
        self.start_passthrough()
        self.prepare_gateway(tmp)
        self.start_gateway()

    def start_upstream(self) -> None:
        up_port = free_port()
        self.ports["direct"] = up_port
        upstream = spawn(
            "upstream",
            [sys.executable, "-m", "bench.upstream", "--port", str(up_port)],
            self.upstream_core,
            self.log_path("upstream"),
            REPO,
            self.env,
        )
        self.children["upstream"] = upstream
        wait_until(upstream, lambda: port_open(up_port))

    def start_passthrough(self) -> None:
        pt_port = free_port()
        self.ports["passthrough"] = pt_port
        args = ["--port", str(pt_port), "--upstream", f"http://{HOST}:{self.ports['direct']}"]
        passthrough = spawn(
            "passthrough",
            [sys.executable, "-m", "bench.passthrough", *args],
            self.target_core,
            self.log_path("passthrough"),
            REPO,
            self.env,
        )
        self.children["passthrough"] = passthrough
        wait_until(passthrough, lambda: port_open(pt_port))

    def prepare_gateway(self, tmp: Path) -> None:
        """The gateway's config, store and virtual key, before any gateway process serves."""
        config = write_gateway_config(tmp, self.ports["direct"])
        self.configs["gateway"] = config
        self.api_key = self.keys["gateway"] = create_virtual_key(self.gateway_bin, config, self.env)

    def serve_argv(self, target: str, port: int, *extra: str) -> list[str]:
        return [str(self.gateway_bin), "serve", "--config", str(self.configs[target]),
                "--host", HOST, "--port", str(port), *extra]  # fmt: skip

    def start_gateway(self, target: str = "gateway", env: dict[str, str] | None = None) -> None:
        """`gateway serve` on `self.configs[target]`, on the targets' core, until it is ready
        (`env`: instead of the bench's, as bench.ab serves another revision's code)."""
        gw_port = free_port()
        self.ports[target] = gw_port
        gateway = spawn(
            target,
            self.serve_argv(target, gw_port),
            self.target_core,
            self.log_path(target),
            REPO,
            self.env if env is None else env,
        )
        self.children[target] = gateway
        wait_until(gateway, lambda: http_get_status(gw_port, "/health/ready", timeout=0.5) == 200)

    def cold_starts(self) -> None:
        """Fresh `gateway serve` processes on the gateway's config and store, one at a time,
        on the gateway's core: spawn -> first 200 on /health/ready, and spawn -> first answered
        chat completion, sent the moment ready answers (as a load balancer would)."""
        # With a fresh bytecode cache, a first start fills it (down to what the first request
        # imports) and is not counted.
        priming = [False] if self.cold_start_count and self.pycache else []
        for record in priming + [True] * self.cold_start_count:
            if not self.cold_start(record):
                return

    def cold_start(self, record: bool = True) -> bool:
        port = free_port()
        child = spawn(
            "gateway-cold",
            self.serve_argv("gateway", port),
            self.target_core,
            self.log_path("gateway-cold"),
            REPO,
            self.env,
        )
        try:
            ready_s = wait_until(
                child, lambda: http_get_status(port, "/health/ready", timeout=0.5) == 200
            )
            problem = smoke_check(port, False, self.key_for("gateway"), timeout=30)
            answered_s = time.perf_counter() - child.started_at
            cpu = cpu_s(child.pid)
        finally:
            child.stop()
        if problem:
            self.failures.append(f"cold start: first chat completion: {problem}")
            return False
        if record:
            self.cold_ready_s.append(ready_s)
            self.cold_answered_s.append(answered_s)
            if cpu is not None:
                self.cold_cpu_s.append(cpu)
        return True

    def start_w2(self, tmp: Path) -> None:
        """`gateway serve --workers 2`: its own config and fresh SQLite file (both workers
        share it, as a user's would), pinned like the one-worker gateway."""
        config = write_gateway_config(tmp / "w2", self.ports["direct"])
        self.configs[W2] = config
        self.keys[W2] = create_virtual_key(self.gateway_bin, config, self.env)
        port = free_port()
        self.ports[W2] = port
        child = spawn(
            W2, self.serve_argv(W2, port, "--workers", "2"), self.target_core,
            self.log_path(W2), REPO, self.env,
        )  # fmt: skip
        self.children[W2] = child
        # Up means both workers answer: until the second binds, the first gets every connection.
        pids: set[int] = set()

        def both_up() -> bool:
            answer = http_get(port, "/health/live", timeout=0.5)
            if answer and answer[0] == 200:
                pids.add(orjson.loads(answer[1])["pid"])
            return len(pids) >= 2 and http_get_status(port, "/health/ready", timeout=0.5) == 200

        wait_until(child, both_up)

    def smoke(self) -> None:
        for target in self.targets:
            for cell in CELLS[:: len(CONCURRENCY)]:  # one cell of each mode
                problem = smoke_check(
                    self.ports[target], cell.stream, self.key_for(target), burst=cell.burst
                )
                if problem:
                    self.failures.append(f"smoke check {target} {cell.mode}: {problem}")

    def dead_targets(self) -> list[str]:
        return [name for name, child in self.children.items() if not child.alive()]

    def load(self, cell: Cell, target: str, label: str) -> WrkResult | None:
        """Warm-up, then the measured run; None (and a failure) if a process died."""
        url = f"http://{HOST}:{self.ports[target]}{CHAT_PATH}"
        print(f"{label} {cell.name:<18} {target:<12}", end="", flush=True)
        run = (self.wrk, url, request_body(cell.stream, cell.burst), cell.concurrency)
        warm = run_wrk(*run, WARMUP_S, self.target_core, self.key_for(target))
        if warm.error_total:
            self.warmup_errors[f"{label} {cell.name} {target}"] = warm.error_total
        child = self.children["upstream" if target == "direct" else target]
        pids = [child.pid, *child.descendants()]
        before = sum(cpu_s(pid) or 0.0 for pid in pids)
        result = run_wrk(*run, self.duration_s, self.target_core, self.key_for(target))
        used = sum(cpu_s(pid) or 0.0 for pid in pids) - before
        cpu = ""
        if result.requests:
            us = used * 1e6 / result.requests
            self.cpu_us.setdefault((cell, target), []).append(us)
            cpu = f"  {us:6.0f} us CPU/req"
        flag = f"  !!! ERRORS {result.errors}" if result.error_total else ""
        print(f"{result.rps:9.0f} req/s  p50 {result.p50_ms:7.2f} ms{cpu}{flag}", flush=True)
        dead = self.dead_targets()
        if dead:
            self.failures.append(f"process(es) {dead} died during {cell.name} {target}; see logs")
            return None
        return result

    def measure(self) -> None:
        for round_no in range(self.rounds):
            for cell in CELLS:
                for target in self.targets:
                    result = self.load(cell, target, f"round {round_no + 1}/{self.rounds}")
                    if result is None:
                        return
                    self.results.setdefault((cell, target), []).append(result)

    def can_scale(self) -> bool:
        return self.workers2 and len(self.cores) >= 2

    def scaling_skipped(self) -> str | None:
        if not self.workers2:
            return f"{W2} not run (BENCH_W2=0)"
        return None if self.can_scale() else "only one CPU: nothing to scale onto"

    def measure_scaling(self) -> None:
        """1 worker vs 2 on the same footing: both gateways may use every core (the upstream
        and wrk stay pinned), so a second worker has a second core to use. Pinned to the one
        target core, as in the main cells, two workers can only share it."""
        if not self.can_scale():
            return
        every_core = set(self.cores)
        for target in ("gateway", W2):
            child = self.children[target]
            set_affinity([child.pid, *child.descendants()], every_core)
        for round_no in range(self.rounds):
            for cell in SCALING_CELLS:
                for target in ("gateway", W2):
                    result = self.load(cell, target, f"scaling {round_no + 1}/{self.rounds}")
                    if result is None:
                        return
                    self.scaling.setdefault((cell, target), []).append(result)

    def stop(self) -> None:
        for name, child in self.children.items():
            self.peak_rss_kib[name] = child.peak_rss_kib()  # before stopping: /proc goes away
            if name == W2:
                self.w2_rss_kib = {"supervisor": self.peak_rss_kib[name]}
                for i, pid in enumerate(child.descendants()):
                    self.w2_rss_kib[f"worker {i}"] = peak_rss_kib(pid)
                # Each process's own peak, added up: an upper bound of what they held at once.
                known = [kib for kib in self.w2_rss_kib.values() if kib is not None]
                self.peak_rss_kib[name] = sum(known) if known else None
        for child in reversed(list(self.children.values())):
            child.stop()

    def measure_db(self) -> None:
        """How much each gateway recorded: the SQLite file plus its write-ahead log."""
        for target, config in self.configs.items():
            db_bytes = sum(f.stat().st_size for f in config.parent.glob("bench.db*"))
            self.db_mib[target] = round(db_bytes / 2**20, 1)

    def cold_start_report(self) -> dict[str, Any]:
        def median(values: list[float]) -> float | None:
            return round(statistics.median(values), 3) if values else None

        return {
            "starts": len(self.cold_answered_s),
            "core": self.target_core,
            "bytecode": self.bytecode,
            "ready_median_s": median(self.cold_ready_s),
            "first_completion_median_s": median(self.cold_answered_s),
            "ready_s": [round(v, 3) for v in self.cold_ready_s],
            "first_completion_s": [round(v, 3) for v in self.cold_answered_s],
            "cpu_to_first_completion_median_s": median(self.cold_cpu_s),
            "cpu_to_first_completion_s": [round(v, 3) for v in self.cold_cpu_s],
        }

    def report(self) -> dict[str, Any]:
        cells: list[dict[str, Any]] = []
        for cell in CELLS:
            row: dict[str, Any] = {
                "mode": cell.mode,
                "concurrency": cell.concurrency,
                "targets": {},
            }
            for target in self.targets:
                runs = self.results.get((cell, target))
                if runs:
                    row["targets"][target] = {
                        **median_of(runs),
                        "rounds": [r.as_dict() for r in runs],
                    }
            measured = row["targets"]
            rps = {t: m["rps"] for t, m in measured.items()}
            if "gateway" in rps and "passthrough" in rps:
                row["gateway_over_passthrough_rps"] = ratio(rps["gateway"], rps["passthrough"])
                # Each round's own ratio: how much of the median's distance from 0.6 is noise.
                gw, pt = self.results[(cell, "gateway")], self.results[(cell, "passthrough")]
                pairs = zip(gw, pt, strict=False)  # a run cut short by a failure: fewer rounds
                by_round = [r for g, p in pairs if (r := ratio(g.rps, p.rps)) is not None]
                row["gateway_over_passthrough_by_round"] = by_round
                # Paired: each round's two targets ran a few seconds apart, under the same
                # machine; the median's ratio may pair one round's gateway with another's.
                if by_round:
                    row["gateway_over_passthrough_round_median"] = statistics.median(by_round)
            cpu = {t: statistics.median(v) for t in measured if (v := self.cpu_us.get((cell, t)))}
            row["cpu_us_per_request"] = {t: round(v, 1) for t, v in cpu.items()}
            if "gateway" in cpu and "passthrough" in cpu:
                # The performance target: CPU a request, the gateway's over the pass-through's.
                row["gateway_over_passthrough_cpu"] = ratio(cpu["gateway"], cpu["passthrough"])
            if W2 in rps and "passthrough" in rps:
                row["w2_over_passthrough_rps"] = ratio(rps[W2], rps["passthrough"])
            if W2 in rps and "gateway" in rps:
                row["w2_over_gateway_rps_same_core"] = ratio(rps[W2], rps["gateway"])
            row["error_total"] = sum(sum(t["errors"].values()) for t in measured.values())
            cells.append(row)

        scaling: list[dict[str, Any]] = []
        for cell in SCALING_CELLS:
            one, two = self.scaling.get((cell, "gateway")), self.scaling.get((cell, W2))
            if not (one and two):
                continue
            m1, m2 = median_of(one), median_of(two)
            scaling.append(
                {
                    "mode": cell.mode,
                    "concurrency": cell.concurrency,
                    "gateway": {**m1, "rounds": [r.as_dict() for r in one]},
                    W2: {**m2, "rounds": [r.as_dict() for r in two]},
                    "w2_over_w1_rps": ratio(m2["rps"], m1["rps"]),
                    "error_total": sum(m1["errors"].values()) + sum(m2["errors"].values()),
                }
            )

        added: dict[str, dict[str, float]] = {}
        for row in cells:
            targets = row["targets"]
            if row["concurrency"] == 1 and "direct" in targets:
                base = targets["direct"]["p50_ms"]
                added[row["mode"]] = {
                    t: round(targets[t]["p50_ms"] - base, 3)
                    for t in ("passthrough", "gateway", W2)
                    if t in targets
                }
        logs = [*self.children, *(["gateway-cold"] if self.cold_start_count else [])]
        scans = {name: scan_log(self.log_path(name)) for name in logs}
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
                "targets": list(self.targets),
                "cold_starts": self.cold_start_count,
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
            "scaling": {
                "placement": (
                    f"gateway (1 worker) and {W2} (supervisor and workers, every thread) allowed "
                    f"CPUs {self.cores}; upstream stays on CPU {self.upstream_core}, wrk on CPU "
                    f"{self.target_core}"
                ),
                "skipped": self.scaling_skipped(),
                "cells": scaling,
            },
            "added_p50_ms_over_direct_c1": added,
            "peak_rss_mib": {
                name: round(kib / 1024, 1) if kib is not None else None
                for name, kib in self.peak_rss_kib.items()
                if name in ("passthrough", "gateway", W2)
            },
            "w2_peak_rss_mib_per_process": {
                name: round(kib / 1024, 1) if kib is not None else None
                for name, kib in self.w2_rss_kib.items()
            },
            "cold_start": self.cold_start_report(),
            "gateway_db_mib": self.db_mib,
            "warmup_errors": self.warmup_errors,
            "failures": self.failures,
            "log_problems": {name: scan.problems for name, scan in scans.items() if scan.problems},
            # Informational: tracebacks from wrk dropping its connections at the end of each run.
            "log_client_disconnects": {name: scan.disconnects for name, scan in scans.items()},
            "logs": {name: str(self.log_path(name).relative_to(REPO)) for name in logs},
        }


def print_cold_start(cold: dict[str, Any]) -> None:
    if not cold["starts"]:
        return
    print(
        f"gateway cold start, median of {cold['starts']} fresh starts on CPU {cold['core']}: "
        f"spawn -> first answered chat completion {cold['first_completion_median_s']} s "
        f"{cold['first_completion_s']}; spawn -> first 200 on /health/ready "
        f"{cold['ready_median_s']} s {cold['ready_s']}; the gateway's CPU to its first answer "
        f"{cold['cpu_to_first_completion_median_s']} s; bytecode {cold['bytecode']}"
    )


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
    header = (
        f"{'cell':<18} {'target':<12} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8} {'errors':>7}"
        f" {'CPU us/req':>10}"
    )
    print(header)
    print("-" * len(header) + "  gw/pt req/s (w2: w2/pt, w2/gateway on the same core)")
    for row in report["cells"]:
        cell = f"{row['mode']} c={row['concurrency']}"
        for target, m in row["targets"].items():
            errors = sum(m["errors"].values())
            ratio = ""
            if target == "gateway" and row.get("gateway_over_passthrough_rps") is not None:
                ratio = f"  {row['gateway_over_passthrough_rps']:.2f}"
                by_round = row.get("gateway_over_passthrough_by_round") or []
                if len(by_round) > 1:
                    rounds = " ".join(f"{r:.2f}" for r in by_round)
                    paired = row["gateway_over_passthrough_round_median"]
                    ratio += f"  (rounds {rounds}: median {paired:.2f})"
            if target == W2 and row.get("w2_over_passthrough_rps") is not None:
                ratio = f"  {row['w2_over_passthrough_rps']:.2f}"
                if row.get("w2_over_gateway_rps_same_core") is not None:
                    ratio += f"  ({row['w2_over_gateway_rps_same_core']:.2f})"
            loud = "  <-- !!! ERRORS " + str(m["errors"]) if errors else ""
            cpu = row.get("cpu_us_per_request", {}).get(target)
            print(
                f"{cell:<18} {target:<12} {m['rps']:9.0f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} "
                f"{errors:7d} {'-' if cpu is None else f'{cpu:.0f}':>10}{ratio}{loud}"
            )
            cell = ""
        if row.get("gateway_over_passthrough_cpu") is not None:
            print(f"{'':<18} CPU a request, gateway / pass-through: "
                  f"x{row['gateway_over_passthrough_cpu']:.2f}")  # fmt: skip
    scaling = report["scaling"]
    print()
    if scaling["skipped"]:
        print(f"scaling: skipped ({scaling['skipped']})")
    elif scaling["cells"]:
        print(f"scaling, --workers 2 over 1 worker: {scaling['placement']}")
        print(f"{'cell':<18} {'1 worker':>9} {'2 workers':>10} {'factor':>7}")
        for row in scaling["cells"]:
            errors = row["error_total"]
            loud = f"  <-- !!! {errors} ERRORS" if errors else ""
            factor = row["w2_over_w1_rps"]
            print(
                f"{row['mode'] + ' c=' + str(row['concurrency']):<18} "
                f"{row['gateway']['rps']:9.0f} {row[W2]['rps']:10.0f} "
                f"{'-' if factor is None else f'{factor:.2f}':>7}{loud}"
            )
    print()
    for mode, added in report["added_p50_ms_over_direct_c1"].items():
        parts = ", ".join(f"{t} +{v:.3f} ms" for t, v in added.items())
        print(f"added p50 over direct at c=1, {mode}: {parts}")
    rss = ", ".join(f"{k} {v} MiB" for k, v in report["peak_rss_mib"].items())
    if report["w2_peak_rss_mib_per_process"]:
        each = ", ".join(f"{k} {v}" for k, v in report["w2_peak_rss_mib_per_process"].items())
        rss += f" (the sum of: {each})"
    print(f"peak RSS (VmHWM): {rss}")
    print_cold_start(report["cold_start"])
    disconnects = ", ".join(f"{k} {v}" for k, v in report["log_client_disconnects"].items())
    print(f"client-disconnect tracebacks in logs (wrk stops mid-request; expected): {disconnects}")
    dbs = ", ".join(f"{k} {v} MiB" for k, v in report["gateway_db_mib"].items())
    print(f"gateway SQLite stores at the end (db + wal): {dbs}")
    if report["warmup_errors"]:
        print(f"!!! errors during warm-up: {report['warmup_errors']}")
    for name, found in report["log_problems"].items():
        print(f"!!! {len(found)} problem(s) in the {name} log ({report['logs'][name]}); first:")
        print("    " + found[0].replace("\n", "\n    "))
    for failure in report["failures"]:
        print(f"!!! FAILURE: {failure}")
    total = sum(row["error_total"] for row in report["cells"])
    total += sum(row["error_total"] for row in scaling["cells"])
    if total:
        print(f"!!! {total} failed requests (connect/read/write/timeout/non-2xx) across cells")


def pycache_dir(tmp: Path) -> Path | None:
    return None if os.environ.get("BENCH_PYCACHE") == "0" else tmp / "pycache"


def cold_start_only(count: int, stamp: str) -> int:
    """`python -m bench.run cold-start [N]`: the upstream, the store and key, N cold starts."""
    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    bench = Bench(1, 1, stamp, cold_starts=count, pycache=pycache_dir(tmp))
    os.sched_setaffinity(0, {bench.upstream_core})
    try:
        bench.start_upstream()
        bench.prepare_gateway(tmp)
        bench.cold_starts()
    except Exception as exc:
        bench.failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        bench.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    cold = bench.cold_start_report()
    problems = scan_log(bench.log_path("gateway-cold")).problems
    out = RESULTS / f"cold-start-{stamp}.json"
    out.write_bytes(
        orjson.dumps(
            {"git": bench.git, **cold, "failures": bench.failures, "log_problems": problems},
            option=orjson.OPT_INDENT_2,
        )
    )
    print_cold_start(cold)
    for failure in bench.failures + problems:
        print(f"!!! {failure}")
    print(f"wrote {out.relative_to(REPO)}")
    return 1 if bench.failures or problems else 0


def main() -> int:
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    if sys.argv[1:2] == ["cold-start"]:
        return cold_start_only(int(sys.argv[2]) if len(sys.argv) > 2 else 5, stamp)
    # Three rounds of 10 s, interleaved (every cell, then every cell again), reported as
    # medians: how the performance issue measured its own table. On this shared VM a slow
    # moment then costs one round of a cell rather than the whole cell, and a short stall
    # little of a round (with 2 s rounds one stall could decide a cell's ratio).
    duration_s = env_int("BENCH_DURATION", 10)
    rounds = env_int("BENCH_ROUNDS", 3)
    tmp = Path(tempfile.mkdtemp(prefix="gateway-bench-"))
    bench = Bench(
        duration_s,
        rounds,
        stamp,
        workers2=env_int("BENCH_W2", 1, minimum=0) > 0,
        cold_starts=env_int("BENCH_COLD_STARTS", 3, minimum=0),
        pycache=pycache_dir(tmp),
    )
    # The harness only waits on children; keep its polling off the core under test.
    os.sched_setaffinity(0, {bench.upstream_core})
    started = time.perf_counter()
    try:
        bench.start_upstream()
        bench.start_passthrough()
        bench.prepare_gateway(tmp)
        # Before the gateway target starts: nothing else of the gateway's runs meanwhile.
        bench.cold_starts()
        bench.start_gateway()
        if bench.workers2:
            bench.start_w2(tmp)
        bench.smoke()
        if not bench.failures:
            bench.measure()
        if not bench.failures:
            bench.measure_scaling()
    except Exception as exc:  # still report what was measured, and stop every child
        bench.failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        bench.stop()
        bench.measure_db()
        shutil.rmtree(tmp, ignore_errors=True)
    report = bench.report()
    report["wall_s"] = round(time.perf_counter() - started, 1)
    out = RESULTS / f"bench-{stamp}.json"
    out.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2))
    print_report(report)
    print(f"\nwrote {out.relative_to(REPO)}  ({report['wall_s']} s)")
    bad = report["failures"] or report["log_problems"] or report["warmup_errors"]
    errors = sum(row["error_total"] for row in report["cells"] + report["scaling"]["cells"])
    return 1 if bad or errors else 0


if __name__ == "__main__":
    sys.exit(main())
