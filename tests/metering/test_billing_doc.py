"""The re-rating script of docs/billing.md, run as written on a real export: it finds every
record's cost again, from the prices the record keeps and from litellm's cost functions, and
names a record whose cost differs."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream
from tests.metering.test_cache_pricing import anthropic_stream
from tests.providers.upstreams import AnthropicServer

DOC = Path(__file__).parents[2] / "docs" / "billing.md"
HELLO = [{"role": "user", "content": "Summarise the attached contract."}]


def script() -> str:
    """The doc's one Python block, unindented."""
    [block] = re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
    return "\n".join(line.removeprefix("   ") for line in block.splitlines())


@pytest.fixture
async def claude(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> AnthropicServer:
    return await AnthropicServer().start(aiohttp_server)


def whole_answer(model: str, usage: dict[str, Any]) -> Any:
    """A whole OpenAI answer with this usage."""

    async def reply(request: web.Request) -> web.StreamResponse:
        message = {"role": "assistant", "content": "It says..."}
        return web.json_response(
            {
                "id": "chatcmpl-c",
                "object": "chat.completion",
                "created": 1,
                "model": model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
        )

    return reply


def cached_answer(upstream: FakeUpstream) -> Any:
    """A whole OpenAI answer that read 1,024 of its 1,500 prompt tokens from the cache."""
    usage = {
        "prompt_tokens": 1500,
        "completion_tokens": 120,
        "total_tokens": 1620,
        "prompt_tokens_details": {"cached_tokens": 1024},
    }
    return whole_answer("gpt-4o", usage)


# An answer of an audio model: audio inside its prompt and completion, at the audio prices.
AUDIO_USAGE = {
    "prompt_tokens": 1000,
    "completion_tokens": 500,
    "total_tokens": 1500,
    "prompt_tokens_details": {"audio_tokens": 600, "cached_tokens": 0},
    "completion_tokens_details": {"audio_tokens": 300, "reasoning_tokens": 0},
}


async def test_the_docs_rerating_finds_each_cost_again_and_names_one_that_differs(
    make_gateway: MakeGateway,
    upstream: FakeUpstream,
    claude: AnthropicServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    models = [
        {"name": "gpt", "deployments": [upstream.deployment(model="gpt-4o")]},
        {"name": "claude", "deployments": [claude.deployment(model="claude-sonnet-4-5")]},
        {"name": "voice", "deployments": [upstream.deployment(model="gpt-audio")]},
    ]
    gw = await make_gateway(models=models)
    upstream.push(cached_answer(upstream), whole_answer("gpt-audio", AUDIO_USAGE))
    await gw.client().chat.completions.create(model="gpt", messages=HELLO)  # type: ignore[arg-type]
    await gw.client().chat.completions.create(model="voice", messages=HELLO)  # type: ignore[arg-type]
    start = {
        "input_tokens": 50,
        "cache_creation_input_tokens": 3000,
        "cache_read_input_tokens": 10000,
        "cache_creation": {"ephemeral_5m_input_tokens": 2000, "ephemeral_1h_input_tokens": 1000},
        "output_tokens": 1,
    }
    claude.push(anthropic_stream(start, {"output_tokens": 400}))
    stream = await gw.client().chat.completions.create(
        model="claude",
        messages=HELLO,  # type: ignore[arg-type]
        stream=True,
    )
    [_ async for _ in stream]
    await gw.flush()
    async with (
        aiohttp.ClientSession() as session,
        session.get(gw.url + "/v1/usage/requests?format=jsonl") as response,
    ):
        assert response.status == 200
        export = await response.text()
    rows = [json.loads(line) for line in export.splitlines()]
    assert sorted(r["upstream_model"] for r in rows) == ["claude-sonnet-4-5", "gpt-4o", "gpt-audio"]
    heard = next(r for r in rows if r["upstream_model"] == "gpt-audio")
    assert (heard["audio_prompt_tokens"], heard["audio_completion_tokens"]) == (600, 300)
    assert all(r["usage_source"] == "provider" and r["cost_usd"] > 0 for r in rows)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # (the script sets it: undone)
    (tmp_path / "usage.jsonl").write_text(export)
    exec(script(), {})
    assert capsys.readouterr().out == ""  # every cost found again
    rows[1]["cost_usd"] += 2e-6  # a record billed two micro-dollars more than its tokens
    (tmp_path / "usage.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    exec(script(), {})
    [named] = capsys.readouterr().out.splitlines()
    assert named.split()[0] == rows[1]["id"]
