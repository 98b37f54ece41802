"""The Anthropic adapter against a real fake Messages server on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from multidict import CIMultiDict

from gateway.config import DeploymentConfig
from gateway.errors import UpstreamConnectError, UpstreamHTTPError
from gateway.providers.anthropic import AnthropicProvider
from gateway.providers.anthropic_messages import parse_message
from gateway.stream.assembler import BlockAssembler
from gateway.upstream.pool import UpstreamPool
from gateway.upstream.seam import UpstreamBody
from tests.fakes import fixture_bytes

KEY = "sk-ant-test"
BODY = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 64}


@dataclass
class FakeAnthropic:
    """Answers `POST /v1/messages` with `reply`; records each request's headers and body."""

    reply: Callable[[web.Request], Awaitable[web.StreamResponse]] | None = None
    requests: list[tuple[CIMultiDict[str], dict[str, Any]]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append((request.headers.copy(), body))
        if request.headers.get("x-api-key") != KEY:
            return web.json_response(
                _error("authentication_error", "invalid x-api-key"), status=401
            )
        if request.headers.get("anthropic-version") != "2023-06-01":
            return web.json_response(_error("invalid_request_error", "bad version"), status=400)
        if request.headers.get("content-type") != "application/json":
            return web.json_response(_error("invalid_request_error", "not JSON"), status=400)
        if self.reply is not None:
            return await self.reply(request)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(fixture_bytes("anthropic-thinking-tool-use.sse"))
        await response.write_eof()
        return response


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": kind, "message": message}, "request_id": "req_1"}


def status(code: int, body: dict[str, Any] | str, headers: dict[str, str] | None = None) -> Any:
    async def reply(request: web.Request) -> web.StreamResponse:
        if isinstance(body, str):
            return web.Response(status=code, text=body, content_type="text/html", headers=headers)
        return web.json_response(body, status=code, headers=headers)

    return reply


@pytest.fixture
async def fake(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> FakeAnthropic:
    fake = FakeAnthropic()
    app = web.Application()
    app.router.add_post("/v1/messages", fake.handle)
    server = await aiohttp_server(app)
    fake.url = str(server.make_url("")).rstrip("/")
    return fake


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    pool = UpstreamPool()
    yield pool
    await pool.close()


def provider(pool: UpstreamPool, api_base: str, **config: Any) -> AnthropicProvider:
    deployment = DeploymentConfig(provider="anthropic", api_base=api_base, api_key=KEY, **config)
    return AnthropicProvider(deployment, pool, "claude-sonnet-4-5")


async def read_all(response: UpstreamBody) -> bytes:
    parts = []
    while chunk := await response.read():
        parts.append(chunk)
    response.close()
    return b"".join(parts)


@pytest.mark.parametrize("suffix", ["", "/v1", "/v1/"])
async def test_streaming_read_returns_the_exact_bytes(
    fake: FakeAnthropic, pool: UpstreamPool, suffix: str
) -> None:
    response = await provider(pool, fake.url + suffix).chat(BODY, stream=True)
    assert response.usage_injected is False
    assert await read_all(response) == fixture_bytes("anthropic-thinking-tool-use.sse")
    [(_, body)] = fake.requests
    assert body == {
        "model": "claude-sonnet-4-5",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
        "max_tokens": 64,
        "stream": True,
    }


async def test_extra_headers_are_sent_and_can_override(
    fake: FakeAnthropic, pool: UpstreamPool
) -> None:
    extra = {"anthropic-beta": "interleaved-thinking-2025-05-14", "Anthropic-Version": "2023-06-01"}
    response = await provider(pool, fake.url, extra_headers=extra).chat(BODY, stream=True)
    await read_all(response)
    [(headers, _)] = fake.requests
    assert headers["anthropic-beta"] == "interleaved-thinking-2025-05-14"
    assert headers.getall("anthropic-version") == ["2023-06-01"]  # replaced, not doubled


async def test_non_streaming_body_parses(fake: FakeAnthropic, pool: UpstreamPool) -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": "Hello."}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 3, "output_tokens": 2},
    }
    fake.reply = status(200, message)
    response = await provider(pool, fake.url).chat(BODY, stream=False)
    raw = await read_all(response)
    assembler = BlockAssembler.of(parse_message(orjson.loads(raw)))
    assert [b.to_content() for b in assembler.blocks()] == [{"type": "text", "text": "Hello."}]
    assert assembler.finish_reason == "stop"
    assert fake.requests[0][1]["stream"] is False


async def test_overloaded_is_a_retryable_http_error(
    fake: FakeAnthropic, pool: UpstreamPool
) -> None:
    fake.reply = status(529, _error("overloaded_error", "Overloaded"), {"retry-after": "3"})
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(pool, fake.url).chat(BODY, stream=True)
    error = info.value
    assert error.status == 529
    assert error.retryable is True
    assert error.retry_after == 3.0
    assert error.code == "overloaded"
    assert error.to_openai() == {
        "error": {
            "message": "Overloaded",
            "type": "overloaded_error",
            "code": "overloaded",
            "param": None,
        }
    }


async def test_bad_request_is_not_retryable(fake: FakeAnthropic, pool: UpstreamPool) -> None:
    fake.reply = status(400, _error("invalid_request_error", "max_tokens: too large"))
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(pool, fake.url).chat(BODY, stream=True)
    assert info.value.status == 400
    assert info.value.retryable is False
    assert info.value.to_openai()["error"]["message"] == "max_tokens: too large"
    assert info.value.to_openai()["error"]["type"] == "invalid_request_error"


async def test_wrong_key_is_an_authentication_error(
    fake: FakeAnthropic, pool: UpstreamPool
) -> None:
    deployment = DeploymentConfig(provider="anthropic", api_base=fake.url, api_key="sk-wrong")
    with pytest.raises(UpstreamHTTPError) as info:
        await AnthropicProvider(deployment, pool, "claude").chat(BODY, stream=True)
    assert info.value.status == 401
    assert info.value.code == "invalid_api_key"


async def test_non_json_error_body_keeps_its_text(fake: FakeAnthropic, pool: UpstreamPool) -> None:
    fake.reply = status(502, "<html>Bad Gateway</html>")
    with pytest.raises(UpstreamHTTPError) as info:
        await provider(pool, fake.url).chat(BODY, stream=True)
    assert info.value.status == 502
    assert info.value.retryable is True
    assert "Bad Gateway" in info.value.message


async def test_connection_refused_is_a_connect_error(
    pool: UpstreamPool, unused_tcp_port: int
) -> None:
    url = f"http://127.0.0.1:{unused_tcp_port}"
    with pytest.raises(UpstreamConnectError):
        await provider(pool, url).chat(BODY, stream=True)
