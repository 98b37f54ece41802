"""`python -m bench.recording [REV|DIR]`: instructions it takes to record one turn.

What recording costs, apart from HTTP and the upstream: the bench's non-stream turn (a new
conversation, its user message, the upstream's answer parsed, its attempt logged, the answer's
blocks and compact stream, metering, the three events and the usage row) queued, journaled and
committed to a real SQLite file by the store's thread. The process runs under valgrind's
callgrind twice, recording `SMALL` then `LARGE` turns (16 between journal appends, as at c=16);
the difference over the difference in turns is what one turn costs, everything a process does
once (imports, the store's start) cancelled out. Repeats to about 0.1%: a change of 1% to the
recording path is plain here when bench.ab cannot see it. Given `REV` (a revision, or a directory
holding a `gateway/` package), that is measured too, first, for comparison. ~1 minute a target.

`python -m bench.recording --turns N` records N turns natively (what runs under valgrind).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMALL, LARGE = 320, 1920
_PER_JOURNAL = 16  # turns between two durable_enough calls: c=16's shape


async def record(turns: int) -> None:
    import orjson

    from bench.upstream import COMPLETION_BODY
    from gateway.config import StoreConfig
    from gateway.conversations.recorder import TurnRecorder
    from gateway.ids import new_id
    from gateway.metering.reports import UsageStore
    from gateway.metering.usage import Meter
    from gateway.providers.wire import OPENAI_CHAT, parse_body
    from gateway.storage.backends import make_store
    from gateway.storage.records import Conversation

    with tempfile.TemporaryDirectory(prefix="bench-recording-") as tmp:
        config = StoreConfig(url=f"sqlite:///{tmp}/bench.db", spool_path=tmp)
        store = make_store(config, "bench")
        await store.start()
        meter = Meter(lambda deployment, model: None, UsageStore(store).write)
        answer = orjson.loads(COMPLETION_BODY)
        route = {"provider": "openai", "deployment": "bench/0-openai", "model": "fake-model"}
        messages = [{"role": "user", "content": "Say hello."}]
        request: dict[str, object] = {"endpoint": "openai.chat", "request_id": "0" * 32}
        request |= {"model": "bench", "stream": False, "instructions": [], "params": {}}

        def one() -> None:
            cid = new_id("conv")
            turn = TurnRecorder(
                store, cid, new_id("turn"), team_id="bench", key_id="key_bench",
                alias="bench", prompt=messages, meter=meter,
            )  # fmt: skip
            conversation = Conversation(cid, time.time(), team_id="bench", key_id="key_bench")
            turn.begin(new_conversation=conversation, new_messages=messages, request=request)
            attempt = turn.new_attempt(route)
            events = parse_body(OPENAI_CHAT, answer)
            attempt.add(events)
            with contextlib.suppress(AttributeError):  # (a revision without whole answers)
                attempt.whole = events  # a whole answer, as the relay keeps it
            turn.completed(attempt)

        for _ in range(turns // _PER_JOURNAL):
            for _ in range(_PER_JOURNAL):
                one()
            await store.durable_enough()
        await store.flush()
        await store.close()


def instructions(turns: int, pythonpath: str, cwd: Path) -> int:
    """Instructions of a whole process that records `turns` turns."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONPATH": pythonpath}
    argv = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
            sys.executable, "-m", "bench.recording", "--turns", str(turns)]  # fmt: skip
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if found is None:
        raise SystemExit(f"no instruction count from callgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1))


def per_turn(pythonpath: str, cwd: Path) -> float:
    small, large = instructions(SMALL, pythonpath, cwd), instructions(LARGE, pythonpath, cwd)
    return (large - small) / (LARGE - SMALL)


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--turns"]:
        asyncio.run(record(int(args[1])))
        return 0
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    repo = Path(__file__).resolve().parent.parent
    bench_path = str(repo)  # bench/ itself always from the tree
    results: list[tuple[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="bench-recording-code-") as tmp:
        if args:
            from bench.ab import checkout

            base = checkout(args[0], Path(tmp) / "base")
            # The revision's gateway/ ahead of the tree's (run from a directory of neither).
            results.append((args[0], per_turn(f"{base}{os.pathsep}{bench_path}", Path(tmp))))
        results.append(("the tree", per_turn(bench_path, Path(tmp))))
    for name, value in results:
        print(f"{name:<12} {value / 1000:8.1f} k instructions a recorded turn")
    if len(results) == 2:
        (_, before), (_, after) = results
        print(f"change       {(after - before) / before:+.2%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
