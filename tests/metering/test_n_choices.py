"""Every choice of an `n > 1` chat stream is metered: a whole stream by the provider's usage
(which counts them all), a cancelled one by what each choice generated and, of that, what the
client received, and so is one closed from its checkpoint after its process was killed; only
the first choice is recorded as the assistant message."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest

from gateway.metering.choices import OtherChoices
from gateway.metering.tokens import count_text
from gateway.providers.litellm_adapter import load_litellm
from gateway.stream.attempt_log import AttemptLog
from gateway.stream.events import BlockStart
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import DONE, FakeUpstream, frames, sse
from tests.reliability.test_crash_recovery import stored_checkpoints
from tests.test_cli import free_port
from tests.test_process import start

MICRO = 1e-6
MODEL = "gpt-4o-mini"
QUESTION = [{"role": "user", "content": "Write four openings for a story about a lighthouse."}]
WORDS = (
    "The keeper climbed the hundred steps each night and counted them aloud, "
    "as his father had, so that the lamp would know someone was still coming to it."
)
# Four choices, each a different answer of about fifty tokens, in pieces of a few words.
TEXTS = [f"Opening {i + 1}: {WORDS}" for i in range(4)]


def pieces(text: str) -> list[str]:
    words = text.split(" ")
    return [" ".join(words[i : i + 3]) + " " for i in range(0, len(words), 3)]


def choice_chunk(index: int, delta: dict[str, Any], finish: str | None = None) -> bytes:
    choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
    return sse({"id": "chatcmpl-n", "object": "chat.completion.chunk", "created": 1,
                "model": MODEL, "choices": [choice]})  # fmt: skip


def interleaved() -> list[bytes]:
    """The four choices' pieces as OpenAI streams them: one choice per chunk, in turns."""
    split = [pieces(text) for text in TEXTS]
    out = [choice_chunk(i, {"role": "assistant", "content": ""}) for i in range(4)]
    for step in range(max(map(len, split))):
        out += [choice_chunk(i, {"content": p[step]}) for i, p in enumerate(split) if step < len(p)]
    return out


def litellm_cost(prompt: int, completion: int) -> float:
    litellm = load_litellm()
    usage = litellm.Usage(
        prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion
    )
    prompt_cost, completion_cost = litellm.cost_per_token(
        model=MODEL, custom_llm_provider="openai", usage_object=usage
    )
    return float(prompt_cost + completion_cost)


async def gateway(make_gateway: MakeGateway, upstream: FakeUpstream) -> GatewayUnderTest:
    deployment = {**upstream.deployment(), "model": MODEL}
    return await make_gateway(
        [{"name": "n", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    )


def usage_row(gw: GatewayUnderTest) -> dict[str, Any]:
    columns = ("status", "usage_source", "prompt_tokens", "completion_tokens",
               "completion_delivered", "cost_usd")  # fmt: skip
    [row] = gw.query(f"SELECT {', '.join(columns)} FROM usage")
    return dict(zip(columns, row, strict=True))


async def test_a_cancelled_n4_stream_meters_every_choice(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await gateway(make_gateway, upstream)
    upstream.push(frames(*interleaved(), then="stall"))
    body = {"model": "n", "messages": QUESTION, "stream": True, "n": 4}
    seen = ["", "", "", ""]
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/chat/completions", json=body) as response,
    ):
        async for line in response.content:
            if line.startswith(b"data: {"):
                (choice,) = orjson.loads(line[6:])["choices"]
                seen[choice["index"]] += choice["delta"].get("content") or ""
            if seen == [t + " " for t in TEXTS]:
                break  # every choice whole, no finish yet: the client leaves
    conversation_id = response.headers["X-Conversation-Id"]
    events = await gw.wait_turn_end(conversation_id)
    await gw.flush()
    row = usage_row(gw)
    every = sum(count_text(t + " ") for t in TEXTS)
    assert (row["status"], row["usage_source"]) == ("interrupted", "estimated")
    # All four choices generated, and all four reached the client.
    assert row["completion_tokens"] == every
    assert row["completion_delivered"] == every
    assert row["cost_usd"] == pytest.approx(litellm_cost(row["prompt_tokens"], every), abs=MICRO)
    # The recorded answer is the first choice alone.
    [message] = [e for e in events if e["type"] == "assistant/message"]
    assert [b["text"] for b in message["payload"]["content"]] == [TEXTS[0] + " "]


async def test_a_whole_n4_stream_is_metered_by_its_providers_usage(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await gateway(make_gateway, upstream)
    usage = {"prompt_tokens": 19, "completion_tokens": 204, "total_tokens": 223}
    finishes = [choice_chunk(i, {}, "stop") for i in range(4)]
    tail = sse({"id": "chatcmpl-n", "object": "chat.completion.chunk", "created": 1,
                "model": MODEL, "choices": [], "usage": usage})  # fmt: skip
    upstream.push(frames(*interleaved(), *finishes, tail, DONE))
    stream = await gw.client().chat.completions.create(
        model="n",
        messages=QUESTION,  # type: ignore[arg-type]
        stream=True,
        n=4,
        stream_options={"include_usage": True},
    )
    [_ async for _ in stream]
    await gw.flush()
    row = usage_row(gw)
    assert (row["status"], row["usage_source"]) == ("completed", "provider")
    assert (row["prompt_tokens"], row["completion_tokens"]) == (19, 204)
    assert row["completion_delivered"] == 204
    assert row["cost_usd"] == pytest.approx(litellm_cost(19, 204), abs=MICRO)


async def test_a_killed_n4_stream_closed_from_its_checkpoint_meters_every_choice(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    upstream.push(frames(*interleaved(), then="stall"))
    db = tmp_path / "gw.db"
    deployment = {**upstream.deployment(), "model": MODEL}
    config = tmp_path / "gw.yaml"
    config.write_text(
        json.dumps(
            {
                "store": {"url": f"sqlite:///{db}", "spool_path": str(tmp_path / "spool")},
                "models": [{"name": "n", "deployments": [deployment]}],
            }
        )
    )
    port = free_port()
    process = await start(config, port)
    body = {"model": "n", "messages": QUESTION, "stream": True, "n": 4,
            "metadata": {"project": "apollo"}}  # fmt: skip
    others = sum(count_text(t + " ") for t in TEXTS[1:])
    seen = ["", "", "", ""]
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=body) as response,
    ):
        async for line in response.content:
            if line.startswith(b"data: {"):
                (choice,) = orjson.loads(line[6:])["choices"]
                seen[choice["index"]] += choice["delta"].get("content") or ""
            if seen == [t + " " for t in TEXTS]:
                break  # every choice whole: the client holds on, and the process is killed
        conversation_id = response.headers["X-Conversation-Id"]

        def checkpointed() -> bool:
            checkpoint = stored_checkpoints(db).get(conversation_id)
            if checkpoint is None or checkpoint["message"] is None:
                return False
            [attempt] = checkpoint["attempts"]
            return (attempt.get("others") or {}).get("delivered") == others

        async with asyncio.timeout(20):
            while not checkpointed():
                await asyncio.sleep(0.02)
        process.send_signal(signal.SIGKILL)
        assert await process.wait() == -signal.SIGKILL
    process = await start(config, port)  # the same instance closes the turn
    process.send_signal(signal.SIGTERM)
    await process.wait()
    with sqlite3.connect(db) as connection:
        [(status, source, prompt, completion, delivered, cost, tags)] = connection.execute(
            "SELECT status, usage_source, prompt_tokens, completion_tokens,"
            " completion_delivered, cost_usd, tags FROM usage"
        ).fetchall()
    every = sum(count_text(t + " ") for t in TEXTS)
    assert (status, source) == ("interrupted", "estimated_lower_bound")
    assert completion == delivered == every  # all four choices, not the first alone
    assert cost == pytest.approx(litellm_cost(prompt, every), abs=MICRO)
    assert json.loads(tags) == {"project": "apollo"}  # the export groups it by its tag


def test_what_was_delivered_of_the_other_choices_is_cut_at_the_clients_frames() -> None:
    log = AttemptLog()
    others = OtherChoices(log, relayed=True)
    for step, word in enumerate(["alpha ", "beta ", "gamma "]):
        log.add([BlockStart(0, "text")] if step == 0 else [], 0.0)
        log.delta(0, word, 0.0)
        log.mark()
        others.add({"index": 1, "delta": {"content": word.upper()}})
        log.mark()  # the other choice's frame: no event of the first choice
    # Frames 1-4 reached the client: two pieces of each choice. By the first choice's events
    # alone, the other's piece after its last one is not counted (a floor).
    delivered = log.cut(4)
    assert others.tokens(delivered) == (count_text("ALPHA "), 0)
    others.delivered_frames = 4
    assert others.tokens(delivered) == (count_text("ALPHA BETA "), 0)
    others.delivered_frames = 6
    assert others.tokens(log.cut(6)) == others.tokens() == (count_text("ALPHA BETA GAMMA "), 0)
    # Rendered into another dialect, the client is sent the first choice only.
    assert OtherChoices(log, relayed=False).tokens(delivered) == (0, 0)
