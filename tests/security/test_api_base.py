"""`api_base` comes only from the config: nothing in a request makes the gateway call another URL.

A second fake upstream plays the attacker's server ("evil"). Requests name it every way a client
could try: body fields (`api_base`, `base_url`, litellm's `api_base`/`custom_llm_provider`/
`litellm_params`, `extra_body`, `extra_headers`), headers (`Host`, `X-Forwarded-Host`,
`Forwarded`, `X-Original-URL`, ...), and a URL as the `model`. Through an OpenAI-compatible
deployment and a litellm one (whose adapter forwards only an allow-list of parameters), on every
completion endpoint and embeddings: the configured upstream gets every call, evil gets none.

An upstream's redirect is not followed either: aiohttp would follow a 307 to any host and keep
`x-api-key` / `api-key` headers on the way (it drops only `Authorization`), handing an Anthropic
or Azure key to whoever the Location names. A redirect is an upstream fault (502, retryable).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from yarl import URL

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import completion

HELLO = [{"role": "user", "content": "hello"}]
GOOD_KEY = "sk-good-configured-key-0123456789"

# litellm's own deprecation warnings (its Pydantic usage) are not the gateway's.
pytestmark = pytest.mark.filterwarnings(r"ignore::DeprecationWarning:litellm\.")


def body_fields(evil: str) -> list[dict[str, Any]]:
    host = URL(evil).authority
    return [
        {"api_base": evil},
        {"base_url": evil},
        {"api_base": evil, "api_key": "sk-evil", "custom_llm_provider": "openai"},
        {"extra_body": {"api_base": evil, "base_url": evil}},
        {"litellm_params": {"api_base": evil, "model": "openai/x"}},
        {"extra_headers": {"Host": host, "X-Forwarded-Host": host}},
        {"url": evil, "endpoint": evil, "azure_endpoint": evil, "api_version": "x"},
        {"metadata": {"api_base": evil}, "user": evil},
    ]


def headers(evil: str) -> list[dict[str, str]]:
    host = URL(evil).authority
    return [
        {"Host": host},
        {"X-Forwarded-Host": host, "X-Forwarded-Proto": "http", "X-Forwarded-Port": "1"},
        {"Forwarded": f"host={host};proto=http"},
        {"X-Original-URL": evil, "X-Rewrite-URL": evil},
        {"X-Api-Base": evil, "X-Base-Url": evil, "X-Upstream": evil},
    ]


async def post(
    gw: GatewayUnderTest, path: str, body: dict[str, Any], extra: dict[str, str] | None = None
) -> int:
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + path, json=body, headers=extra or {}) as response:
            await response.read()
            return response.status


class Evil:
    """Any method, any path: every request it gets is recorded (and refused)."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/{tail:.*}", self._handle)
        self.url = ""

    async def _handle(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path_qs, dict(request.headers)))
        return web.json_response({"error": {"message": "evil", "type": "x"}}, status=418)


Server = Callable[..., Awaitable[TestServer]]


@pytest.fixture
async def evil(aiohttp_server: Server) -> Evil:
    made = Evil()
    made.url = str((await aiohttp_server(made.app)).make_url("/v1"))
    return made


async def test_no_request_field_or_header_redirects_the_upstream_call(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, evil: Evil
) -> None:
    good = await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "native",
                "retry": {"max_attempts": 1},
                "deployments": [
                    {"provider": "openai", "api_base": good.url, "api_key": GOOD_KEY,
                     "model": "good-model"}
                ],
            },
            {
                "name": "lite",
                "retry": {"max_attempts": 1},
                "deployments": [
                    {"provider": "litellm", "api_base": good.url, "api_key": GOOD_KEY,
                     "model": "openai/good-model"}
                ],
            },
        ]
    )  # fmt: skip
    calls = 0

    async def ask(path: str, body: dict[str, Any], extra: dict[str, str] | None = None) -> int:
        nonlocal calls
        calls += 1
        if not body.get("stream"):
            good.push(completion("a whole answer"))  # else the fake replays a stream
        return await post(gw, path, body, extra)

    for alias in ("native", "lite"):
        for fields in body_fields(evil.url):
            for stream in (False, True):
                body = {"model": alias, "messages": HELLO, "stream": stream, **fields}
                assert await ask("/v1/chat/completions", body) == 200, (alias, fields)
        for extra in headers(evil.url):
            body = {"model": alias, "messages": HELLO, "stream": True}
            assert await ask("/v1/chat/completions", body, extra) == 200, (alias, extra)
        for fields in body_fields(evil.url)[:4]:
            body = {"model": alias, "max_tokens": 50, "messages": HELLO, **fields}
            # The Messages API refuses a field it cannot carry by name: never a destination.
            status = await ask("/v1/messages", body)
            assert status in (200, 400), (alias, fields)
            if status == 400:
                calls -= 1  # refused before any upstream call
            body = {"model": alias, "input": "hello", **fields}
            assert await ask("/v1/responses", body) in (200, 400), (alias, fields)
    await post(gw, "/v1/embeddings", {"model": "native", "input": "x", "api_base": evil.url})
    # A URL as the model is an unknown alias, never a destination.
    for model in (evil.url, evil.url + "/chat/completions", f"openai/{evil.url}", "lite/x"):
        assert await post(gw, "/v1/chat/completions", {"model": model, "messages": HELLO}) == 404
    assert evil.requests == []
    assert len(good.requests) >= calls
    assert {r["model"] for r in good.requests} == {"good-model"}
    assert {seen.headers["Authorization"] for seen in good.seen} == {f"Bearer {GOOD_KEY}"}


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
async def test_an_upstream_redirect_is_not_followed(
    make_gateway: MakeGateway,
    make_upstream: MakeUpstream,
    aiohttp_server: Server,
    evil: Evil,
    code: int,
) -> None:
    async def redirect(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=code, headers={"Location": evil.url + request.path})

    redirector = web.Application()
    redirector.router.add_post("/{tail:.*}", redirect)
    base = str((await aiohttp_server(redirector)).make_url("")).rstrip("/")
    good = await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": provider,
                "retry": {"max_attempts": 1},
                "deployments": [
                    {"provider": provider, "api_key": GOOD_KEY, "model": "m", "name": provider,
                     "api_base": base + ("/v1" if provider == "openai" else "")}
                ],
            }
            for provider in ("openai", "azure", "anthropic")
        ] + [
            {
                "name": "chain",
                "deployments": [
                    {"provider": "anthropic", "api_base": base, "api_key": GOOD_KEY,
                     "name": "redirected"},
                    {"provider": "openai", "api_base": good.url, "name": "fine"},
                ],
            }
        ]
    )  # fmt: skip
    for provider in ("openai", "azure", "anthropic"):
        for stream in (False, True):
            body = {"model": provider, "messages": HELLO, "stream": stream}
            async with aiohttp.ClientSession() as session:
                async with session.post(gw.url + "/v1/chat/completions", json=body) as response:
                    assert response.status == 502, (provider, await response.text())
                    error = (await response.json())["error"]
                    assert error["code"] == "upstream_redirect", error
    # A redirect is an upstream fault like any other: the next deployment answers.
    good.push(completion("from the next deployment"))
    async with aiohttp.ClientSession() as session:
        body = {"model": "chain", "messages": HELLO}
        async with session.post(gw.url + "/v1/chat/completions", json=body) as response:
            assert response.status == 200
            assert response.headers["X-Gateway-Deployment"] == "fine"
    assert evil.requests == []
