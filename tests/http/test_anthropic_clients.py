"""What Anthropic clients (Claude Code among them) need beyond a message: their body reaching an
Anthropic deployment as they sent it, their betas and API version, Anthropic's own fields
carried where they can be and refused by name where not, and `messages.count_tokens`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from anthropic._constants import ANTHROPIC_API_VERSION

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import API_KEY, Block, FakeUpstream, Reply, Script, status
from tests.providers.upstreams import AnthropicServer

BETA = "context-1m-2025-08-07"
CLAUDE_CODE_FIELDS = {
    "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
    "output_config": {"effort": "medium"},
    "container": "container_011",
    "mcp_servers": [
        {
            "type": "url",
            "url": "https://mcp.example",
            "name": "docs",
            "authorization_token": "tok-9",
        }
    ],
}


class Claude(AnthropicServer):
    """Anthropic's Messages API and its token counter, answering from a script or, for a
    count, with a fixed number; what each request carried is kept."""

    model = "claude-upstream"
    count = 4242

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/v1/messages", self.handle)
        router.add_post("/v1/messages/count_tokens", self.handle)

    def default(self, request: web.Request, body: dict[str, Any]) -> Script:
        if request.path.endswith("/count_tokens"):

            async def counted(request: web.Request) -> web.StreamResponse:
                return web.json_response({"input_tokens": self.count})

            return counted
        if body.get("stream"):
            return self.answer(Reply([Block("text", ["Hello", " there."])]))
        message = {
            "id": "msg_fake",
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [{"type": "text", "text": "Hello there."}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 10, "output_tokens": 3},
        }
        return status(200, message)


MakeServer = Callable[..., Awaitable[TestServer]]


async def setup(
    make_gateway: MakeGateway,
    aiohttp_server: MakeServer,
    *,
    beta: str | None = None,
    **alias: Any,
) -> tuple[GatewayUnderTest, Claude, FakeUpstream]:
    claude = await Claude().start(aiohttp_server)
    openai_like = await FakeUpstream(plain_answer="Hello there.").start(aiohttp_server)
    extra = {"extra_headers": {"anthropic-beta": beta}} if beta else {}
    gw = await make_gateway(
        models=[
            {"name": "claude", "deployments": [claude.deployment(**extra)], **alias},
            {"name": "gpt", "deployments": [openai_like.deployment()], **alias},
            {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]},
        ]
    )
    return gw, claude, openai_like


def client(gw: GatewayUnderTest) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gw.url, api_key="test-key", max_retries=0)


HISTORY: list[Any] = [
    {"role": "user", "content": [{"type": "text", "text": "Run it."}]},
    {"role": "system", "content": [{"type": "text", "text": "env: linux, cwd /work"}]},
    {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": "toolu_1", "name": "Bash", "input": {"c": "ls"}}],
    },
    {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": "toolu_1",
                "content": "a.txt",
                "is_error": False,
                "cache_control": {"type": "ephemeral"},
            }
        ],
    },
]
TOOLS: list[Any] = [
    {"name": "Bash", "description": "Run", "input_schema": {"type": "object"}},
    {
        "name": "Later",
        "description": "Loaded on demand",
        "input_schema": {"type": "object"},
        "defer_loading": True,
    },
]


async def test_an_anthropic_deployment_gets_the_clients_body_as_it_came(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, claude, _ = await setup(make_gateway, aiohttp_server)
    sent = {
        "max_tokens": 64000,
        "system": [
            {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": HISTORY,
        "tools": TOOLS,
        "thinking": {"type": "adaptive", "display": "omitted"},
        "metadata": {"user_id": "session-7"},
        **CLAUDE_CODE_FIELDS,
    }
    async with client(gw) as claude_client:
        async with claude_client.beta.messages.stream(model="claude", **sent) as stream:
            text = "".join([t async for t in stream.text_stream])
    assert text == "Hello there."
    assert claude.requests[-1] == {**sent, "model": claude.model, "stream": True}
    # The turn keeps the parameters, not the client's body twice, and no MCP server's token.
    await gw.flush()
    [(request,)] = gw.query("SELECT request FROM turns")
    assert "tok-9" not in request and "anthropic_request" not in request
    assert "clear_thinking_20251015" in request


async def test_betas_and_the_version_reach_an_anthropic_deployment(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, claude, openai_like = await setup(make_gateway, aiohttp_server, beta="own-beta-1")
    async with client(gw) as claude_client:
        await claude_client.beta.messages.create(
            model="claude",
            max_tokens=100,
            messages=[{"role": "user", "content": "Hi"}],
            betas=[BETA, "interleaved-thinking-2025-05-14"],
        )
        seen = claude.seen[-1].headers
        assert seen["anthropic-beta"] == f"own-beta-1,{BETA},interleaved-thinking-2025-05-14"
        assert seen["anthropic-version"] == ANTHROPIC_API_VERSION  # the SDK's, not the default
        assert seen["x-api-key"] == API_KEY
        # Without betas, the deployment's own alone.
        await claude_client.messages.create(
            model="claude", max_tokens=100, messages=[{"role": "user", "content": "Hi"}]
        )
        assert claude.seen[-1].headers["anthropic-beta"] == "own-beta-1"
        # Another provider gets no Anthropic header.
        await claude_client.beta.messages.create(
            model="gpt", max_tokens=100, messages=[{"role": "user", "content": "Hi"}], betas=[BETA]
        )
        assert "anthropic-beta" not in openai_like.seen[-1].headers


@pytest.mark.parametrize("field", sorted(CLAUDE_CODE_FIELDS))
async def test_anthropics_own_fields_are_refused_by_name_elsewhere(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, field: str
) -> None:
    gw, _, openai_like = await setup(make_gateway, aiohttp_server)
    async with client(gw) as claude_client:
        with pytest.raises(anthropic.BadRequestError) as raised:
            await claude_client.messages.create(
                model="gpt",
                max_tokens=100,
                messages=[{"role": "user", "content": "Hi"}],
                extra_body={field: CLAUDE_CODE_FIELDS[field]},
            )
    assert f"'{field}'" in raised.value.message and "drop_params" in raised.value.message
    assert openai_like.requests == []


async def test_drop_params_drops_them_for_another_provider_and_says_so(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, claude, openai_like = await setup(make_gateway, aiohttp_server, drop_params=True)
    async with client(gw) as claude_client:
        raw = await claude_client.messages.with_raw_response.create(
            model="gpt",
            max_tokens=100,
            messages=[{"role": "user", "content": "Hi"}],
            extra_body=CLAUDE_CODE_FIELDS,
        )
        dropped = raw.headers["X-Gateway-Dropped-Params"].split(", ")
        assert sorted(dropped) == sorted(CLAUDE_CODE_FIELDS)
        assert not set(CLAUDE_CODE_FIELDS) & set(openai_like.requests[-1])
        assert "anthropic_extras" not in openai_like.requests[-1]
        # An Anthropic deployment of the same gateway still gets every one of them.
        await claude_client.messages.create(
            model="claude",
            max_tokens=100,
            messages=[{"role": "user", "content": "Hi"}],
            extra_body=CLAUDE_CODE_FIELDS,
        )
        assert {k: claude.requests[-1][k] for k in CLAUDE_CODE_FIELDS} == CLAUDE_CODE_FIELDS


async def test_count_tokens_is_anthropics_own_count_on_an_anthropic_deployment(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, claude, _ = await setup(make_gateway, aiohttp_server)
    async with client(gw) as claude_client:
        raw = await claude_client.beta.messages.with_raw_response.count_tokens(
            model="claude",
            system="Be brief.",
            messages=[{"role": "user", "content": "How many tokens is this?"}],
            tools=TOOLS,
            betas=[BETA],
        )
    counted = await raw.parse()
    assert counted.input_tokens == Claude.count
    assert raw.headers["X-Gateway-Token-Count"] == "provider"
    request = claude.seen[-1]
    assert request.path == "/v1/messages/count_tokens"
    assert BETA in request.headers["anthropic-beta"]
    assert claude.requests[-1] == {
        "model": claude.model,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": "How many tokens is this?"}],
        "tools": TOOLS,
    }
    # Counting calls no model: nothing recorded, nothing metered.
    await gw.flush()
    assert gw.query("SELECT COUNT(*) FROM usage") == [(0,)]


async def test_count_tokens_is_an_estimate_elsewhere(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, _, openai_like = await setup(make_gateway, aiohttp_server)
    question = "How many tokens is this? " * 20
    async with client(gw) as claude_client:
        raw = await claude_client.messages.with_raw_response.count_tokens(
            model="gpt", messages=[{"role": "user", "content": question}]
        )
        short = await claude_client.messages.count_tokens(
            model="gpt", messages=[{"role": "user", "content": "Hi"}]
        )
        with pytest.raises(anthropic.NotFoundError) as raised:
            await claude_client.messages.count_tokens(
                model="nope", messages=[{"role": "user", "content": "Hi"}]
            )
        with pytest.raises(anthropic.BadRequestError):
            await claude_client.messages.count_tokens(model="gpt", messages=[])
    counted = await raw.parse()
    assert raw.headers["X-Gateway-Token-Count"] == "estimated"
    assert 100 <= counted.input_tokens <= 200  # 20 x 7 tokens, and a few of framing
    assert short.input_tokens < 20
    assert raised.value.body["type"] == "error"  # Anthropic's error shape
    assert openai_like.requests == []
