"""`python -m bench.caches [TURNS]`: what recording a turn costs with its code and data in the
CPU's caches, and without.

The recorder alone (no HTTP, no store: its writes are dropped), recording the bench's
non-stream turn TURNS times (3,000) in a tight loop ("hot"), then again with 16 MiB touched
between turns ("cold": the caches hold none of it, as when a turn's recording runs once
between the rest of a request). Per phase, microseconds a turn: the recorder's setup, the
turn's start, the answer parsed and logged, the turn's end (`completed()`). Session 16 read
hot 2.5 / 1.2 / 5.8 / 14.6 and cold 71 / 15 / 74 / 117: in the gateway, what recording costs
is mostly cache misses, which instruction counts (bench.recording) do not see.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import orjson

from bench.upstream import COMPLETION_BODY
from gateway.conversations.recorder import TurnRecorder
from gateway.ids import new_id
from gateway.metering.usage import Meter
from gateway.providers.wire import OPENAI_CHAT, parse_body
from gateway.storage.records import Conversation, NewEvent, TurnStart

_EVICT = bytearray(16 * 1024 * 1024)
PHASES = ("setup", "start", "answer", "end")


class Dropped:
    """A store that keeps nothing (TurnWrites)."""

    def create_conversation(self, conversation: Conversation) -> None:
        pass

    def start_turn(self, turn: TurnStart) -> None:
        pass

    def append(self, event: NewEvent) -> None:
        pass

    async def durable_enough(self) -> None:
        pass

    def journal_pending(self) -> None:
        pass


def evict() -> None:
    for i in range(0, len(_EVICT), 64):
        _EVICT[i] ^= 1


def measure(turns: int, cold: bool) -> dict[str, float]:
    store, meter = Dropped(), Meter(lambda deployment, model: None, lambda record: None)
    answer = orjson.loads(COMPLETION_BODY)
    route = {"provider": "openai", "deployment": "bench/0-openai", "model": "fake-model"}
    messages: list[Any] = [{"role": "user", "content": "Say hello."}]
    request: dict[str, Any] = {"endpoint": "openai.chat", "model": "bench", "stream": False}
    spent = dict.fromkeys(PHASES, 0.0)
    for _ in range(turns):
        if cold:
            evict()
        t0 = time.perf_counter()
        cid = new_id("conv")
        turn = TurnRecorder(store, cid, new_id("turn"), team_id="t", key_id="k", alias="bench",
                            prompt=messages, meter=meter)  # fmt: skip
        conversation = Conversation(cid, time.time(), team_id="t", key_id="k")
        t1 = time.perf_counter()
        turn.begin(new_conversation=conversation, new_messages=messages, request=request)
        t2 = time.perf_counter()
        attempt = turn.new_attempt(route)
        attempt.add(parse_body(OPENAI_CHAT, answer))
        t3 = time.perf_counter()
        turn.completed(attempt)
        t4 = time.perf_counter()
        for phase, seconds in zip(PHASES, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
            spent[phase] += seconds
    return {phase: seconds * 1e6 / turns for phase, seconds in spent.items()}


def main() -> int:
    turns = int(sys.argv[1]) if len(sys.argv) > 1 else 3000
    measure(200, cold=False)  # warm-up: imports, first calls
    for name, cold in (("hot", False), ("cold", True)):
        figures = measure(turns, cold)
        print(f"{name:<5} " + "  ".join(f"{p} {figures[p]:6.1f} us" for p in PHASES))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
