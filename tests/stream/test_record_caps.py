"""A hostile upstream's stream is relayed whole but recorded only up to the caps of
`conversations.record_max_text_chars` and `record_max_tool_argument_chars`: the record is cut
and marked `truncated_record`, and the gateway's memory stays bounded, whatever the size."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from aiohttp import web

from gateway.stream.attempt_log import AttemptLog
from gateway.stream.events import BlockDelta, BlockStart, Finish
from tests.fakes import DONE, FakeUpstream, chunk
from tests.floods import while_flooding
from tests.test_cli import free_port
from tests.test_process import start

HOSTILE_MB = 120
PIECE = "A" * 4000  # tool-call arguments a frame
CAP = 1_000_000  # characters of tool-call arguments the test's gateway records
# What the gateway may grow by, beyond its size after a first small answer: the capped record
# (a character a byte, here, held a few times over while it is encoded), the relay's buffers
# and the interpreter's own slack. Unbounded, 120 MB of arguments took it up by 864 MB.
GROWTH_MB = 64


def _hostile(total_mb: int) -> Any:
    frame = chunk(tool={"index": 0, "function": {"arguments": PIECE}})
    frames = total_mb * 1_000_000 // len(PIECE) // 64 * 64

    async def script(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        opening = {"index": 0, "id": "call_1", "type": "function"}
        opening["function"] = {"name": "write", "arguments": ""}
        await response.write(chunk(tool=opening))
        batch = frame * 64
        for _ in range(frames // 64):
            await response.write(batch)
        await response.write(chunk(finish="tool_calls"))
        await response.write(DONE)
        return response

    return script, frames * len(PIECE)


def _high_water_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


async def test_a_hostile_stream_is_relayed_whole_recorded_cut_and_memory_stays_bounded(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    script, sent = _hostile(HOSTILE_MB)
    deployment = orjson.dumps(upstream.deployment()).decode()
    config = tmp_path / "gw.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db'}}\n"
        f"conversations: {{record_max_tool_argument_chars: {CAP}}}\n"
        f"models: [{{name: fake, deployments: [{deployment}]}}]\n"
    )
    port = free_port()
    process = await start(config, port)
    url = f"http://127.0.0.1:{port}"
    question = {"model": "fake", "stream": True, "messages": [{"role": "user", "content": "go"}]}
    try:
        async with aiohttp.ClientSession() as session:
            async with session.post(url + "/v1/chat/completions", json=question) as response:
                await response.read()
            before = _high_water_mb(process.pid)
            upstream.push(script)

            async def hostile() -> tuple[int, str]:
                received = 0
                async with session.post(url + "/v1/chat/completions", json=question) as answer:
                    assert answer.status == 200
                    async for piece in answer.content.iter_any():
                        received += piece.count(b"A")
                    return received, answer.headers["X-Conversation-Id"]

            async def live() -> None:
                async with session.get(url + "/health/live") as response:
                    assert response.status == 200

            [(received, conversation)], seen = await while_flooding([hostile()], {"live": live})
            async with session.get(f"{url}/v1/conversations/{conversation}/events") as response:
                assert response.status == 200, await response.text()
                events = (await response.json())["data"]
            async with session.get(url + "/metrics") as response:
                scraped = await response.text()
            grown = _high_water_mb(process.pid) - before
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 30)
    assert received == sent  # the client got every byte
    assert grown < GROWTH_MB, f"the gateway grew by {grown:.0f} MB"
    # Relaying 120 MB keeps the loop busy, a read's frames at a time; no record's work is
    # in its way any more (unbounded, /health/live waited over a second at the turn's end).
    assert seen.median("live") < 0.05, seen.times
    assert seen.worst("live") < 1.0, seen.times
    answer = next(e for e in events if e["type"] == "assistant/message")
    assert answer["payload"]["truncated_record"] is True
    call = answer["payload"]["content"][0]
    assert call["type"] == "tool_call" and call["name"] == "write"
    assert 0 < len(call["arguments"]) <= CAP
    assert 'gateway_truncated_records_total{kind="tool_call"} 1.0' in scraped
    with sqlite3.connect(tmp_path / "gw.db") as db:
        stored = db.execute("SELECT SUM(LENGTH(payload)) FROM events").fetchone()[0] + (
            db.execute("SELECT SUM(LENGTH(body)) FROM event_payloads").fetchone()[0] or 0
        )
    assert stored < 3 * CAP, stored  # once in the content, once in the timed stream


def test_the_record_ends_at_a_kinds_cap_and_the_frames_keep_their_marks() -> None:
    log = AttemptLog(started=0.0)
    log.cap(10, 6)
    log.text_frames(0, ["abcd", "efgh"], 1.0)  # the fast path, within the cap
    log.text_frames(0, ["ijkl", "mn"], 2.0)  # past it: what fits of the first, then nothing
    log.add([BlockStart(1, "tool_call", "call_1", "write")], 3.0)
    log.mark()
    for piece in ('{"a', '":1', "}"):
        log.add([BlockDelta(1, piece)], 4.0)
        log.mark()
    log.add([BlockDelta(0, "o")], 5.0)  # text stays cut, however small
    log.add([Finish("tool_calls")], 6.0)
    log.mark()
    assert log.truncated == ["text", "tool_call"]
    assert log.count == 10 and log.cut(9) == log.count
    events = list(log.events(log.count))
    assert events == [
        BlockDelta(0, "abcdefghij"),
        BlockStart(1, "tool_call", "call_1", "write"),
        BlockDelta(1, '{"a":1'),
        Finish("tool_calls"),
    ]
    assert list(log.events(log.cut(5))) == events[:2]  # a delivered prefix, as marked
    assert list(log.events(log.cut(6))) == [events[0], events[1], BlockDelta(1, '{"a')]


def test_an_uncapped_log_records_everything() -> None:
    log = AttemptLog(started=0.0)
    log.text_frames(0, ["x" * 300, "y"], 1.0)
    assert log.truncated == [] and log.text() == "x" * 300 + "y"
