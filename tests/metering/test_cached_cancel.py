"""A stream cancelled before its usage (OpenAI's comes last) is estimated with the cache reads
that are known: those the provider reported for the conversation's previous answer, whose
prompt the new one repeats (gateway.metering.prompt_cache); otherwise its prompt is billed at
the input price."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import orjson
import pytest
from aiohttp import web

from gateway.metering import prompt_cache
from gateway.metering.prompt_cache import PromptCacheReads
from gateway.providers.litellm_adapter import load_litellm
from gateway.reload import Reloader
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, frames

MICRO = 1e-6
MODEL = "gpt-4o-mini"
CACHED = 1280  # what OpenAI reports read from the cache: a multiple of 128 past 1,024
# A system prompt long enough to be cached (about 1,600 tokens).
SYSTEM = {"role": "system", "content": "You answer questions about the lease. " * 200}
FIRST = [SYSTEM, {"role": "user", "content": "Who pays for repairs?"}]
ANSWER = "The landlord, for structural repairs."


def answer_with_cache_reads() -> Any:
    async def script(request: web.Request) -> web.StreamResponse:
        usage = {
            "prompt_tokens": 1612,
            "completion_tokens": 9,
            "total_tokens": 1621,
            "prompt_tokens_details": {"cached_tokens": CACHED},
        }
        return web.json_response(
            {
                "id": "chatcmpl-c",
                "object": "chat.completion",
                "created": 1,
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": ANSWER},
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )

    return script


async def cancelled(gw: GatewayUnderTest, messages: list[Any], conversation_id: str) -> None:
    """A stream its client leaves after its two pieces (no usage ever comes)."""
    body = {"model": "lease", "messages": messages, "stream": True}
    headers = {"X-Conversation-Id": conversation_id} if conversation_id else {}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/chat/completions", json=body, headers=headers) as response,
    ):
        seen = ""
        async for line in response.content:
            if line.startswith(b"data: {"):
                seen += orjson.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if seen == "Also the roof.":
                break
    await gw.wait_turn_end(response.headers["X-Conversation-Id"], count=2 if headers else 1)


def litellm_cost(prompt: int, cached: int, completion: int) -> float:
    litellm = load_litellm()
    usage = litellm.Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details={"cached_tokens": cached},
    )
    prompt_cost, completion_cost = litellm.cost_per_token(
        model=MODEL, custom_llm_provider="openai", usage_object=usage
    )
    return float(prompt_cost + completion_cost)


@pytest.mark.parametrize("reload", [False, True])
async def test_a_cancel_counts_the_cache_reads_its_conversation_reported(
    make_gateway: MakeGateway, upstream: FakeUpstream, tmp_path: Path, reload: bool
) -> None:
    models = [{"name": "lease", "deployments": [{**upstream.deployment(), "model": MODEL}]}]
    gw = await make_gateway(models)
    upstream.push(answer_with_cache_reads())
    raw = await gw.client().chat.completions.with_raw_response.create(
        model="lease",
        messages=FIRST,  # type: ignore[arg-type]
    )
    conversation_id = raw.headers["X-Conversation-Id"]
    if reload:  # new prices: what providers reported before is still known
        config = tmp_path / "gateway.json"
        config.write_text(
            json.dumps({"store": {"url": f"sqlite:///{gw.db_path}"}, "models": models})
        )
        assert await Reloader(gw.app, config).reload()
    upstream.push(frames(chunk("Also "), chunk("the roof."), then="stall"))
    follow = [*FIRST, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "And?"}]
    await cancelled(gw, follow, conversation_id)
    # A conversation of its own, its prompt never reported: billed at the input price.
    upstream.push(frames(chunk("Also "), chunk("the roof."), then="stall"))
    await cancelled(gw, [SYSTEM, {"role": "user", "content": "And the garden?"}], "")
    await gw.flush()
    rows = gw.query(
        "SELECT conversation_id, usage_source, prompt_tokens, cached_tokens, completion_tokens,"
        " cost_usd FROM usage WHERE status = 'interrupted'"
    )
    by_conversation = {row[0]: row[1:] for row in rows}
    source, prompt, cached, completion, cost = by_conversation.pop(conversation_id)
    assert (source, cached) == ("estimated", CACHED) and prompt > CACHED
    assert cost == pytest.approx(litellm_cost(prompt, CACHED, completion), abs=MICRO)
    [(source, prompt, cached, completion, cost)] = by_conversation.values()
    assert (source, cached) == ("estimated", 0)
    assert cost == pytest.approx(litellm_cost(prompt, 0, completion), abs=MICRO)


def test_only_a_repeated_prompt_on_the_same_deployment_and_recent_is_known_cached() -> None:
    reads = PromptCacheReads()
    tools: list[Any] = [[{"type": "function", "function": {"name": "f"}}]]
    reads.reported("c1", "d1", tools, FIRST, CACHED)
    follow = [*FIRST, {"role": "assistant", "content": ANSWER}, {"role": "user", "content": "?"}]
    assert reads.known("c1", "d1", tools, follow) == CACHED
    assert reads.known("c2", "d1", tools, follow) == 0  # another conversation
    assert reads.known("c1", "d2", tools, follow) == 0  # another deployment's cache
    assert reads.known("c1", "d1", None, follow) == 0  # other tools: another prefix
    edited = [{**SYSTEM, "content": "Be brief."}, *follow[1:]]
    assert reads.known("c1", "d1", tools, edited) == 0  # the prefix changed
    assert reads.known("c1", "d1", tools, FIRST[:1]) == 0  # shorter than what was cached
    later = prompt_cache.time.monotonic() + prompt_cache.KEPT_S + 1
    with mock.patch.object(prompt_cache.time, "monotonic", return_value=later):
        assert reads.known("c1", "d1", tools, follow) == 0  # the cache may have let it go
