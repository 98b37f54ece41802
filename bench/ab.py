"""`python -m bench.ab REV [CELL ...]`: the gateway's CPU per request, a revision against the tree.

How each optimisation is judged (docs/performance.md). req/s on this shared machine swing
10-30% between runs; the CPU a request costs, with both versions served at once and loaded in
alternation, moves far less. This starts the bench's fake upstream and two gateways, `REV`'s
(its `gateway/` from `git archive`, first on `PYTHONPATH`) and the working tree's, each on a
store of its own with a virtual key, on the same core as wrk; then, per round and cell, loads
each for `AB_SECONDS` (after a second's warm-up), the order swapped every round, and reads
the process's CPU time from /proc around the measured run. It prints each cell's median CPU
microseconds a request for both and the change.

Cells: `non-stream:16`, `stream:16` (a chunk per write), `burst:1` (the stream in one
write), `history:16` (non-stream, the question after an earlier exchange of a recorded
conversation), `history-200:16` (after 200 of them), ...; default
`non-stream:16 stream:16 burst:16`. `AB_SECONDS` (3) and `AB_ROUNDS` (4) set the length.

`AB_PASSTHROUGH=1` loads the bare pass-through (`bench/passthrough.py`) in the same rounds and
prints each gateway's CPU a request over its: the ratio the performance target is set in.

`AB_BASE_SET` and `AB_TREE_SET` change REV's gateway's config and the tree's: space-separated
`dotted.path=value` (the value JSON, or else a string), e.g. `AB_TREE_SET=logging.access_log=false`
with `REV` `.` weighs the access log on the same code (what docs/performance.md's table of
features is made of). `REV` must have the same config format and CLI as the tree (any revision
since the bench has existed).
"""

from __future__ import annotations

import os
import re
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from bench.procs import HOST, cpu_s
from bench.run import (
    CHAT_PATH,
    REPO,
    RESULTS,
    WARMUP_S,
    Bench,
    Cell,
    create_virtual_key,
    env_int,
    prepare_history,
    request_body,
    write_gateway_config,
)
from bench.wrk import run_wrk

# The two gateways, as the bench names its targets (and their logs: ab-base-<UTC>.log).
BASE, TREE, PT = "ab-base", "ab-tree", "passthrough"
_MODES = {
    "non-stream": (False, False, False),
    "stream": (True, False, False),
    "burst": (True, True, False),
    "history": (False, False, True),
}
_HISTORY = re.compile(r"history-(\d+)")


def parse_cell(text: str) -> Cell:
    mode, _, concurrency = text.partition(":")
    exchanges = _HISTORY.fullmatch(mode)
    if exchanges is not None:
        mode = "history"
    if mode not in _MODES or not concurrency.isdigit():
        raise SystemExit(
            f"a cell is MODE:CONCURRENCY with MODE one of {sorted(_MODES)} or history-N: {text!r}"
        )
    stream, burst, history = _MODES[mode]
    count = int(exchanges.group(1)) if exchanges is not None else int(history)
    return Cell(stream, int(concurrency), burst, count)


def config_overrides(name: str) -> dict[str, Any]:
    """`a.b=1 c=text` from the environment variable `name` -> {"a.b": 1, "c": "text"}."""
    overrides: dict[str, Any] = {}
    for pair in os.environ.get(name, "").split():
        path, sep, text = pair.partition("=")
        if not sep or not path:
            raise SystemExit(f"{name}: each setting is dotted.path=value, got {pair!r}")
        try:
            overrides[path] = orjson.loads(text)
        except orjson.JSONDecodeError:
            overrides[path] = text
    return overrides


def checkout(rev: str, into: Path) -> Path:
    """`rev`'s gateway package, to put first on PYTHONPATH (a directory holding a `gateway/`
    package is used as it is: an experiment's copy)."""
    if (Path(rev) / "gateway").is_dir():
        return Path(rev)
    into.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "archive", rev, "gateway"], cwd=REPO, capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    rev = args[0]
    cells = [parse_cell(c) for c in args[1:] or ("non-stream:16", "stream:16", "burst:16")]
    seconds, rounds = env_int("AB_SECONDS", 3), env_int("AB_ROUNDS", 4)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    RESULTS.mkdir(parents=True, exist_ok=True)
    bench = Bench(seconds, rounds, stamp)
    os.sched_setaffinity(0, {bench.upstream_core})  # the harness only waits: off the core measured
    with_pt = os.environ.get("AB_PASSTHROUGH", "") not in ("", "0")
    settings = {BASE: config_overrides("AB_BASE_SET"), TREE: config_overrides("AB_TREE_SET")}
    with tempfile.TemporaryDirectory(prefix="gateway-ab-") as tmp_text:
        tmp = Path(tmp_text)
        base_tree = checkout(rev, tmp / "base")
        names = {BASE: rev, TREE: "tree", PT: "passthrough"}
        for target, overrides in settings.items():
            if overrides:
                names[target] += " " + " ".join(f"{k}={v}" for k, v in overrides.items())
        try:
            bench.start_upstream()
            if with_pt:
                bench.start_passthrough()
            keys: dict[str, str] = {PT: "sk-bench"}
            for number, target in enumerate((BASE, TREE)):
                env = dict(bench.env)
                # Each gateway's package first on the path: the tree's too, so that a copy of the
                # tree run with another checkout's virtualenv serves its own code, not the one
                # that virtualenv's editable install points at.
                env["PYTHONPATH"] = str(base_tree if target == BASE else REPO)
                config = write_gateway_config(
                    tmp / f"store-{number}", bench.ports["direct"], settings[target]
                )
                bench.configs[target] = config
                keys[target] = create_virtual_key(bench.gateway_bin, config, env)
                bench.start_gateway(target, env)
            ports, children = bench.ports, bench.children
            spent: dict[tuple[Cell, str], list[float]] = {}
            targets = [BASE, TREE, *([PT] if with_pt else [])]
            width = max(len(name) for name in names.values())
            for cell in cells:
                if cell.history:
                    for target in (BASE, TREE):
                        url = f"http://{HOST}:{ports[target]}{CHAT_PATH}"
                        prepare_history(url, keys[target], cell.history)
            for round_number in range(rounds):
                order = targets if round_number % 2 == 0 else targets[::-1]
                for cell in cells:
                    body = request_body(cell.stream, cell.burst, cell.history)
                    for target in order:
                        url = f"http://{HOST}:{ports[target]}{CHAT_PATH}"
                        run = (bench.wrk, url, body, cell.concurrency)
                        run_wrk(*run, WARMUP_S, bench.target_core, keys[target])
                        pid = children[target].pid
                        before = cpu_s(pid) or 0.0
                        result = run_wrk(*run, seconds, bench.target_core, keys[target])
                        used = (cpu_s(pid) or 0.0) - before
                        if result.error_total or not result.requests:
                            raise SystemExit(f"{names[target]} {cell.name}: {result.errors}")
                        us = used * 1e6 / result.requests
                        spent.setdefault((cell, target), []).append(us)
                        print(f"round {round_number + 1}/{rounds} {cell.name:<18} "
                              f"{names[target]:<{width}} {us:6.0f} us/request  "
                              f"{result.rps:6.0f} req/s", flush=True)  # fmt: skip
            print(f"\nmedian CPU a request over {rounds} rounds of {seconds} s: "
                  f"{names[BASE]} -> {names[TREE]}")  # fmt: skip
            for cell in cells:
                a = statistics.median(spent[(cell, BASE)])
                b = statistics.median(spent[(cell, TREE)])
                line = f"{cell.name:<20} {a:6.0f} -> {b:6.0f} us  ({(b - a) / a:+.1%})"
                if with_pt:
                    pt = statistics.median(spent[(cell, PT)])
                    line += f"   passthrough {pt:4.0f} us: x{a / pt:.2f} -> x{b / pt:.2f}"
                print(line)
        finally:
            for child in bench.children.values():
                child.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
