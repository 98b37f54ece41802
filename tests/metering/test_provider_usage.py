"""The provider's own usage is asked for on every stream, whatever the client asked: a client
cannot leave its turn to the gateway's estimate."""

from __future__ import annotations

import json

import aiohttp
import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import COMPLETION_TOKENS, PROMPT_TOKENS, FakeUpstream


@pytest.mark.parametrize("options", [{"include_usage": False}, {}, None])
async def test_a_stream_is_metered_by_the_provider_whatever_the_client_asked(
    gw: GatewayUnderTest, upstream: FakeUpstream, options: dict[str, bool] | None
) -> None:
    upstream.text(["Hello", " there"])
    body: dict[str, object] = {
        "model": "fake",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
    }
    if options is not None:
        body["stream_options"] = options
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            raw = await response.read()
    chunks = [json.loads(line[6:]) for line in raw.split(b"\n") if line.startswith(b"data: {")]
    # The client asked for no usage: it gets none.
    assert not any(chunk.get("usage") for chunk in chunks)
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "Hello there"
    assert upstream.requests[-1]["stream_options"]["include_usage"] is True
    await gw.flush()
    assert gw.query("SELECT usage_source, prompt_tokens, completion_tokens FROM usage") == [
        ("provider", PROMPT_TOKENS, COMPLETION_TOKENS)
    ]
