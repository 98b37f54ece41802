"""`python -m bench.continuation REV [TURNS]`: CPU a request while one conversation is
continued turn after turn, each request carrying the whole history (as chat SDKs send it).

The `history-N` cells of bench.ab load one question many times (a regenerate after the
first); this is the other case, the usual one: each request the next turn of its
conversation. REV's gateway (as bench.ab serves it) and the tree's, each on a store of its own
with a virtual key, record `TURNS` (200) turns one after another, after 20 to warm up; printed:
the process's CPU a request on average over them.
"""

from __future__ import annotations

import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from bench.ab import checkout
from bench.procs import HOST, cpu_s
from bench.run import CHAT_PATH, Bench, create_virtual_key, prepare_history, write_gateway_config


def main() -> int:
    args = sys.argv[1:]
    if not args or args[0].startswith("-"):
        print(__doc__)
        return 2
    rev, turns = args[0], int(args[1]) if len(args) > 1 else 200
    bench = Bench(1, 1, datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ"))
    with tempfile.TemporaryDirectory(prefix="gateway-continuation-") as tmp_text:
        tmp = Path(tmp_text)
        base = checkout(rev, tmp / "base")
        try:
            bench.start_upstream()
            keys: dict[str, str] = {}
            for number, target in enumerate((rev, "tree")):
                env = dict(bench.env)
                if number == 0:
                    env["PYTHONPATH"] = str(base)
                config = write_gateway_config(tmp / f"store-{number}", bench.ports["direct"])
                bench.configs[target] = config
                keys[target] = create_virtual_key(bench.gateway_bin, config, env)
                bench.start_gateway(target, env)
            for target, key in keys.items():
                url = f"http://{HOST}:{bench.ports[target]}{CHAT_PATH}"
                pid = bench.children[target].pid
                prepare_history(url, key, 20)
                before = cpu_s(pid) or 0.0
                prepare_history(url, key, turns)
                spent = (cpu_s(pid) or 0.0) - before
                print(f"{target:<12} {turns} turns of one conversation: "
                      f"{spent * 1e6 / turns:6.0f} us CPU a request on average")  # fmt: skip
        finally:
            for child in bench.children.values():
                child.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
