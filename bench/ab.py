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
write), `history:16` (non-stream, the question after an earlier exchange), ...; default
`non-stream:16 stream:16 burst:16`. `AB_SECONDS` (3) and `AB_ROUNDS` (4) set the length.
`AB_THREADING=header:auto` sets `conversations.threading` of REV's gateway and the tree's
(default `auto:auto`): `python -m bench.ab . history:16` with it weighs automatic threading
against none, on the same code. `REV` must have the same config format and CLI as the tree
(any revision since the bench has existed).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

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
    request_body,
    write_gateway_config,
)
from bench.wrk import run_wrk

# The two gateways, as the bench names its targets (and their logs: ab-base-<UTC>.log).
BASE, TREE = "ab-base", "ab-tree"
_MODES = {
    "non-stream": (False, False, False),
    "stream": (True, False, False),
    "burst": (True, True, False),
    "history": (False, False, True),
}


def parse_cell(text: str) -> Cell:
    mode, _, concurrency = text.partition(":")
    if mode not in _MODES or not concurrency.isdigit():
        raise SystemExit(f"a cell is MODE:CONCURRENCY with MODE one of {sorted(_MODES)}: {text!r}")
    stream, burst, history = _MODES[mode]
    return Cell(stream, int(concurrency), burst, history)


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
    with tempfile.TemporaryDirectory(prefix="gateway-ab-") as tmp_text:
        tmp = Path(tmp_text)
        base_tree = checkout(rev, tmp / "base")
        threadings = os.environ.get("AB_THREADING", "auto:auto").split(":")
        names = {BASE: f"{rev} {threadings[0]}", TREE: f"tree {threadings[1]}"}
        try:
            bench.start_upstream()
            keys: dict[str, str] = {}
            for number, target in enumerate((BASE, TREE)):
                env = dict(bench.env)
                if target == BASE:
                    env["PYTHONPATH"] = str(base_tree)
                threading = threadings[number]
                config = write_gateway_config(
                    tmp / f"store-{number}", bench.ports["direct"], threading
                )
                bench.configs[target] = config
                keys[target] = create_virtual_key(bench.gateway_bin, config, env)
                bench.start_gateway(target, env)
            ports, children = bench.ports, bench.children
            spent: dict[tuple[Cell, str], list[float]] = {}
            for round_number in range(rounds):
                order = [BASE, TREE] if round_number % 2 == 0 else [TREE, BASE]
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
                              f"{names[target]:<12} {us:6.0f} us/request  {result.rps:6.0f} req/s",
                              flush=True)  # fmt: skip
            print(f"\nmedian CPU a request over {rounds} rounds of {seconds} s, {rev} -> the tree")
            for cell in cells:
                a = statistics.median(spent[(cell, BASE)])
                b = statistics.median(spent[(cell, TREE)])
                print(f"{cell.name:<20} {a:6.0f} -> {b:6.0f} us  ({(b - a) / a:+.1%})")
        finally:
            for child in bench.children.values():
                child.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
