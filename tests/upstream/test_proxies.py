"""The upstream client through real forward proxies and to a TLS upstream with its own CA.

Every part is real: a forward proxy on loopback (tests/upstream/proxy_server.py) that records
what it saw, an aiohttp upstream serving TLS with a certificate from a CA made for the test
(trustme), the gateway's pool, and at the end the whole gateway driven by the `openai` SDK.
The environment is the client's input here: each test sets the proxy and CA variables it means
and clears the rest.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import trustme
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.config import ConfigError, load_config
from gateway.errors import UpstreamConnectError, UpstreamTimeout
from gateway.upstream.pool import Endpoint, UpstreamPool
from gateway.upstream.seam import post, read_all
from gateway.upstream.tls import TrustError, deployment_context
from tests.conftest import MakeGateway
from tests.upstream.proxy_server import ForwardProxy

MakeServer = Callable[..., Awaitable[TestServer]]
PROXY_VARIABLES = (
    "http_proxy",
    "HTTP_PROXY",
    "https_proxy",
    "HTTPS_PROXY",
    "no_proxy",
    "NO_PROXY",
    "all_proxy",
    "ALL_PROXY",
    "REQUEST_METHOD",
)
ANSWER = ["Hello", " through", " the", " proxy"]


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@dataclass
class Trust:
    """A CA made for the test, its PEM file, and a server context for 127.0.0.1 and localhost."""

    ca: trustme.CA
    ca_file: Path
    server: ssl.SSLContext

    def client(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))


@pytest.fixture(scope="module")
def trust(tmp_path_factory: pytest.TempPathFactory) -> Trust:
    ca = trustme.CA()
    ca_file = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "localhost").configure_cert(server)
    return Trust(ca, ca_file, server)


@dataclass
class Upstream:
    url: str  # the API base, .../v1
    seen: list[dict[str, Any]] = field(default_factory=list)  # each request's path and headers


def upstream_app(upstream: Upstream) -> web.Application:
    """An OpenAI-compatible chat upstream: `ANSWER` as a completion or a stream; other paths
    echo the body."""

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        upstream.seen.append(
            {"path": request.path_qs, **{k.lower(): v for k, v in request.headers.items()}}
        )
        if not request.path.endswith("/chat/completions"):
            return web.Response(body=b"echo:" + raw)
        body = orjson.loads(raw)
        base = {"id": "chatcmpl-p", "created": 1, "model": body["model"]}
        usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(ANSWER)}
            choice = {"index": 0, "message": message, "finish_reason": "stop"}
            return web.json_response(
                {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            )
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        chunk = {**base, "object": "chat.completion.chunk"}
        for i, text in enumerate(ANSWER):
            delta = {"role": "assistant", "content": text} if i == 0 else {"content": text}
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            await response.write(b"data: " + orjson.dumps({**chunk, "choices": [choice]}) + b"\n\n")
        end = {"index": 0, "delta": {}, "finish_reason": "stop"}
        await response.write(b"data: " + orjson.dumps({**chunk, "choices": [end]}) + b"\n\n")
        await response.write(
            b"data: " + orjson.dumps({**chunk, "choices": [], "usage": usage}) + b"\n\n"
        )
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/{tail:.*}", handle)
    return app


@pytest.fixture
async def tls_upstream(aiohttp_server: MakeServer, trust: Trust) -> Upstream:
    upstream = Upstream("")
    server = await aiohttp_server(upstream_app(upstream), ssl=trust.server)
    upstream.url = str(server.make_url("/v1"))
    assert upstream.url.startswith("https://127.0.0.1:")
    return upstream


@pytest.fixture
async def http_upstream(aiohttp_server: MakeServer) -> Upstream:
    upstream = Upstream("")
    server = await aiohttp_server(upstream_app(upstream))
    upstream.url = str(server.make_url("/v1"))
    return upstream


@pytest.fixture
async def proxy() -> AsyncIterator[ForwardProxy]:
    async with ForwardProxy() as running:
        yield running


@pytest.fixture
def trusting_env(monkeypatch: pytest.MonkeyPatch, trust: Trust) -> None:
    """SSL_CERT_FILE names the test's CA (and no SSL_CERT_DIR adds the system's)."""
    monkeypatch.setenv("SSL_CERT_FILE", str(trust.ca_file))
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)


@pytest.fixture
async def pool() -> AsyncIterator[UpstreamPool]:
    made = UpstreamPool()  # made after the fixtures above set the environment
    yield made
    await made.close()


async def fetch(pool: UpstreamPool, endpoint: Endpoint, body: bytes = b"hi") -> bytes:
    response = await pool.post(endpoint, body)
    assert response.status == 200, response.status
    return await read_all(response)


def closed_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- proxies from the environment ----------------------------------------------------------------


@pytest.mark.usefixtures("trusting_env")
async def test_an_https_upstream_through_the_environments_https_proxy(
    monkeypatch: pytest.MonkeyPatch, proxy: ForwardProxy, tls_upstream: Upstream
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    pool = UpstreamPool()
    endpoint = Endpoint(tls_upstream.url + "/echo", {})
    assert await fetch(pool, endpoint, b"one") == b"echo:one"
    assert await fetch(pool, endpoint, b"two") == b"echo:two"
    port = tls_upstream.url.split(":")[2].split("/")[0]
    # One tunnel, kept alive for the second request; TLS inside it was the upstream's own.
    assert [(r.method, r.target) for r in proxy.requests] == [("CONNECT", f"127.0.0.1:{port}")]
    assert proxy.requests[0].headers["host"] == f"127.0.0.1:{port}"
    assert "proxy-authorization" not in proxy.requests[0].headers
    assert proxy.connections == 1
    assert [seen["host"] for seen in tls_upstream.seen] == [f"127.0.0.1:{port}"] * 2
    await pool.close()


@pytest.mark.usefixtures("trusting_env")
async def test_lower_case_variables_win_and_no_proxy_bypasses(
    monkeypatch: pytest.MonkeyPatch, proxy: ForwardProxy, tls_upstream: Upstream
) -> None:
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{closed_port()}")  # would fail
    monkeypatch.setenv("https_proxy", proxy.url)
    assert Endpoint(tls_upstream.url, {}).proxy is not None
    assert Endpoint(tls_upstream.url, {}).proxy.display == proxy.url  # type: ignore[union-attr]
    monkeypatch.setenv("NO_PROXY", "example.com, 127.0.0.0/8")
    pool = UpstreamPool()
    endpoint = Endpoint(tls_upstream.url + "/echo", {})
    assert endpoint.proxy is None
    assert await fetch(pool, endpoint) == b"echo:hi"
    assert proxy.requests == []  # straight to the upstream
    monkeypatch.setenv("no_proxy", "localhost")  # the lower-case one is read first
    assert Endpoint(tls_upstream.url, {}).proxy is not None
    assert Endpoint(tls_upstream.url.replace("127.0.0.1", "localhost"), {}).proxy is None
    await pool.close()


@pytest.mark.usefixtures("trusting_env")
async def test_a_deployments_proxy_overrides_the_environment(
    monkeypatch: pytest.MonkeyPatch, proxy: ForwardProxy, tls_upstream: Upstream
) -> None:
    # The environment's proxy is not running: only the deployment's can answer.
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")  # the deployment's own proxy ignores this too
    pool = UpstreamPool()
    through = Endpoint(tls_upstream.url + "/echo", {}, proxy=proxy.url)
    assert await fetch(pool, through) == b"echo:hi"
    assert [r.method for r in proxy.requests] == ["CONNECT"]
    # `none`: directly, whatever HTTPS_PROXY says.
    monkeypatch.delenv("NO_PROXY")
    direct = Endpoint(tls_upstream.url + "/echo", {}, proxy="none")
    assert direct.proxy is None
    assert await fetch(pool, direct) == b"echo:hi"
    assert len(proxy.requests) == 1
    # The pool keys them apart: one connection each, never one shared by the two routes.
    assert through.key != direct.key and through.key[:3] == direct.key[:3]
    assert pool.open_connections == 2
    with pytest.raises(UpstreamConnectError, match=r"cannot reach the proxy http://127\.0\.0\.1:"):
        await fetch(pool, Endpoint(tls_upstream.url + "/echo", {}))  # the environment's
    await pool.close()


async def test_an_http_upstream_through_the_proxy_in_absolute_form(
    monkeypatch: pytest.MonkeyPatch, proxy: ForwardProxy, http_upstream: Upstream
) -> None:
    monkeypatch.setenv("http_proxy", proxy.url)
    monkeypatch.setenv("https_proxy", f"http://127.0.0.1:{closed_port()}")  # not for http URLs
    pool = UpstreamPool()
    endpoint = Endpoint(http_upstream.url + "/echo?x=1", {"Authorization": "Bearer sk-up-key"})
    assert await fetch(pool, endpoint, b"one") == b"echo:one"
    assert await fetch(pool, endpoint, b"two") == b"echo:two"
    origin = http_upstream.url.removesuffix("/v1")
    assert [(r.method, r.target) for r in proxy.requests] == [("POST", f"{origin}/v1/echo?x=1")] * 2
    assert proxy.connections == 1  # kept alive, to the proxy
    # The origin got its request in origin form, the Host its own.
    assert [seen["path"] for seen in http_upstream.seen] == ["/v1/echo?x=1"] * 2
    assert http_upstream.seen[0]["host"] == origin.removeprefix("http://")
    assert http_upstream.seen[0]["authorization"] == "Bearer sk-up-key"
    await pool.close()


def test_http_proxy_is_ignored_under_cgi(monkeypatch: pytest.MonkeyPatch) -> None:
    # "httpoxy": a CGI request's `Proxy:` header arrives as HTTP_PROXY; only http_proxy counts.
    monkeypatch.setenv("REQUEST_METHOD", "POST")
    monkeypatch.setenv("HTTP_PROXY", "http://attacker.test:3128")
    assert Endpoint("http://upstream.test/v1", {}).proxy is None
    monkeypatch.setenv("http_proxy", "http://proxy.test:3128")
    assert Endpoint("http://upstream.test/v1", {}).proxy is not None


# -- proxy credentials and refusals ----------------------------------------------------------------


@pytest.mark.usefixtures("trusting_env")
async def test_proxy_credentials_go_in_proxy_authorization(
    tls_upstream: Upstream, http_upstream: Upstream, pool: UpstreamPool
) -> None:
    async with ForwardProxy(credentials="alice:s3cret/pw") as guarded:
        url = guarded.url_with("alice:s3cret%2Fpw")
        assert await fetch(pool, Endpoint(tls_upstream.url + "/echo", {}, proxy=url)) == b"echo:hi"
        assert await fetch(pool, Endpoint(http_upstream.url + "/echo", {}, proxy=url)) == (
            b"echo:hi"
        )
        expected = "Basic YWxpY2U6czNjcmV0L3B3"  # alice:s3cret/pw
        assert [r.headers.get("proxy-authorization") for r in guarded.requests] == [expected] * 2
        # Only the proxy saw them: neither the tunnel's upstream nor the http one.
        assert all("proxy-authorization" not in seen for seen in tls_upstream.seen)
        assert all("proxy-authorization" not in seen for seen in http_upstream.seen)

        wrong = guarded.url_with("alice:wrong-password")
        with pytest.raises(UpstreamConnectError) as tunnel:
            await fetch(pool, Endpoint(tls_upstream.url, {}, proxy=wrong))
        message = str(tunnel.value)
        assert f"the proxy {guarded.url} refused to tunnel" in message
        assert "HTTP 407" in message and "credentials" in message
        assert "wrong-password" not in message and "alice" not in message
        with pytest.raises(UpstreamConnectError) as plain:
            await post(pool, Endpoint(http_upstream.url + "/echo", {}, proxy=wrong), {})
        message = str(plain.value)
        assert f"the proxy {guarded.url} refused the request: HTTP 407" in message
        assert "wrong-password" not in message and "alice" not in message


async def test_a_proxy_refusing_connect_is_a_clear_connect_error(
    tls_upstream: Upstream, pool: UpstreamPool
) -> None:
    async with ForwardProxy(refuse=403) as refusing:
        endpoint = Endpoint(tls_upstream.url, {}, proxy=refusing.url)
        with pytest.raises(UpstreamConnectError) as caught:
            await fetch(pool, endpoint)
    port = tls_upstream.url.split(":")[2].split("/")[0]
    assert str(caught.value) == (
        f"the proxy {refusing.url} refused to tunnel to 127.0.0.1:{port}: HTTP 403 Forbidden"
    )
    assert tls_upstream.seen == [] and pool.open_connections == 0


async def test_an_unreachable_proxy_is_named_without_its_credentials(
    tls_upstream: Upstream, pool: UpstreamPool
) -> None:
    port = closed_port()
    endpoint = Endpoint(tls_upstream.url, {}, proxy=f"http://bob:hunter22@127.0.0.1:{port}")
    with pytest.raises(UpstreamConnectError) as caught:
        await fetch(pool, endpoint)
    assert str(caught.value).startswith(f"cannot reach the proxy http://127.0.0.1:{port}: ")
    assert "hunter22" not in str(caught.value) and "bob" not in str(caught.value)


async def test_a_proxy_that_never_answers_connect_times_out(
    tls_upstream: Upstream, pool: UpstreamPool
) -> None:
    async with ForwardProxy(silent=True) as silent:
        endpoint = Endpoint(tls_upstream.url, {}, 0.2, proxy=silent.url)
        with pytest.raises(UpstreamTimeout, match="through the proxy") as caught:
            await fetch(pool, endpoint)
    assert caught.value.phase == "connect"
    assert pool.open_connections == 0


# -- which CAs are trusted ----------------------------------------------------------------------


async def test_ssl_cert_file_names_the_trusted_cas(
    monkeypatch: pytest.MonkeyPatch, trust: Trust, tls_upstream: Upstream, proxy: ForwardProxy
) -> None:
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(trust.ca_file))
    pool = UpstreamPool()
    assert await fetch(pool, Endpoint(tls_upstream.url + "/echo", {})) == b"echo:hi"
    # The same through a proxy: TLS inside the tunnel checks the same CAs.
    through = Endpoint(tls_upstream.url + "/echo", {}, proxy=proxy.url)
    assert await fetch(pool, through) == b"echo:hi"
    await pool.close()


async def test_without_the_ca_verification_fails_with_a_clear_connect_error(
    monkeypatch: pytest.MonkeyPatch, tls_upstream: Upstream, proxy: ForwardProxy
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    pool = UpstreamPool()  # the system's CAs: they do not know the test's
    for endpoint in (
        Endpoint(tls_upstream.url, {}),
        Endpoint(tls_upstream.url, {}, proxy=proxy.url),
    ):
        with pytest.raises(UpstreamConnectError) as caught:
            await fetch(pool, endpoint)
        message = str(caught.value)
        assert message.startswith("cannot reach the upstream 127.0.0.1: its TLS certificate is")
        assert "CERTIFICATE_VERIFY_FAILED" in message and "tls.ca_bundle" in message
    assert tls_upstream.seen == []
    await pool.close()


async def test_a_deployments_ca_bundle_is_trusted_instead(
    monkeypatch: pytest.MonkeyPatch, trust: Trust, tls_upstream: Upstream, proxy: ForwardProxy
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    pool = UpstreamPool()
    context = deployment_context(str(trust.ca_file), verify=True)
    assert context is deployment_context(str(trust.ca_file), verify=True)  # made once
    own = Endpoint(tls_upstream.url + "/echo", {}, ssl_context=context)
    assert await fetch(pool, own) == b"echo:hi"
    through = Endpoint(tls_upstream.url + "/echo", {}, proxy=proxy.url, ssl_context=context)
    assert await fetch(pool, through) == b"echo:hi"
    # The pool's default does not trust it: that connection is never reused for it.
    default = Endpoint(tls_upstream.url + "/echo", {})
    assert default.key != own.key
    with pytest.raises(UpstreamConnectError, match="not trusted"):
        await fetch(pool, default)
    await pool.close()


async def test_verify_false_checks_nothing(
    aiohttp_server: MakeServer, trust: Trust, pool: UpstreamPool
) -> None:
    # A certificate for another name, from a CA nobody trusts: neither is checked.
    stranger = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    trustme.CA().issue_cert("elsewhere.test").configure_cert(stranger)
    upstream = Upstream("")
    server = await aiohttp_server(upstream_app(upstream), ssl=stranger)
    url = str(server.make_url("/v1/echo"))
    context = deployment_context(None, verify=False)
    assert context is not None and context.verify_mode == ssl.CERT_NONE
    assert await fetch(pool, Endpoint(url, {}, ssl_context=context)) == b"echo:hi"
    with pytest.raises(UpstreamConnectError, match="not trusted"):
        await fetch(pool, Endpoint(url, {}, ssl_context=trust.client()))
    assert deployment_context(None, verify=True) is None  # the pool's default


def test_a_bad_ssl_cert_file_fails_the_config_and_the_pool_at_start(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = Path(__file__).parents[2] / "config" / "gateway.yaml"
    monkeypatch.setenv("SSL_CERT_FILE", str(tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match=r"SSL_CERT_FILE=.*missing\.pem: no such file"):
        load_config(config)
    with pytest.raises(TrustError, match=r"SSL_CERT_FILE=.*missing\.pem: no such file"):
        UpstreamPool()
    monkeypatch.delenv("SSL_CERT_FILE")
    monkeypatch.setenv("SSL_CERT_DIR", str(tmp_path / "nowhere"))
    with pytest.raises(ConfigError, match=r"SSL_CERT_DIR=.*nowhere"):
        load_config(config)
    with pytest.raises(TrustError, match=r"SSL_CERT_DIR=.*nowhere"):
        UpstreamPool()


# -- uvloop --------------------------------------------------------------------------------------


def test_the_tunnel_works_under_uvloop(trust: Trust) -> None:
    uvloop = pytest.importorskip("uvloop")

    async def scenario() -> None:
        upstream = Upstream("")
        server = TestServer(upstream_app(upstream))
        await server.start_server(ssl=trust.server)
        pool = UpstreamPool(ssl_context=trust.client())
        try:
            async with ForwardProxy() as running:
                url = str(server.make_url("/v1/echo"))
                endpoint = Endpoint(url, {}, proxy=running.url)
                assert await fetch(pool, endpoint) == b"echo:hi"
                assert await fetch(pool, endpoint) == b"echo:hi"
                assert running.connections == 1
                assert running.requests[0].method == "CONNECT"
        finally:
            await pool.close()
            await server.close()

    uvloop.run(scenario())


# -- the whole gateway ---------------------------------------------------------------------------


@pytest.fixture
def env_proxy(monkeypatch: pytest.MonkeyPatch, proxy: ForwardProxy) -> Iterator[ForwardProxy]:
    # HTTPS_PROXY only: the SDK's own http:// requests to the gateway are not proxied.
    monkeypatch.setenv("HTTPS_PROXY", proxy.url)
    yield proxy


async def test_the_gateway_reaches_an_https_upstream_through_the_proxy(
    make_gateway: MakeGateway,
    tls_upstream: Upstream,
    env_proxy: ForwardProxy,
    trust: Trust,
    caplog: pytest.LogCaptureFixture,
) -> None:
    deployment = {
        "provider": "openai",
        "model": "up-model",
        "api_base": tls_upstream.url,
        "api_key": "sk-upstream-key",
        "tls": {"ca_bundle": str(trust.ca_file)},
    }
    models = [{"name": "proxied", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    gateway = await make_gateway(models)
    client = gateway.client()
    whole = await client.chat.completions.create(
        model="proxied", messages=[{"role": "user", "content": "hi"}]
    )
    assert whole.choices[0].message.content == "".join(ANSWER)
    stream = await client.chat.completions.create(
        model="proxied", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    parts = [c.choices[0].delta.content async for c in stream if c.choices]
    assert "".join(p or "" for p in parts) == "".join(ANSWER)
    port = tls_upstream.url.split(":")[2].split("/")[0]
    assert {(r.method, r.target) for r in env_proxy.requests} == {("CONNECT", f"127.0.0.1:{port}")}
    assert [seen["path"] for seen in tls_upstream.seen] == ["/v1/chat/completions"] * 2
    assert tls_upstream.seen[0]["authorization"] == "Bearer sk-upstream-key"
    assert not [r for r in caplog.records if "tls.verify" in r.getMessage()]


async def test_verify_false_warns_at_start_naming_the_deployment(
    make_gateway: MakeGateway, tls_upstream: Upstream, caplog: pytest.LogCaptureFixture
) -> None:
    deployment = {
        "provider": "openai",
        "name": "lab-box",
        "api_base": tls_upstream.url,
        "tls": {"verify": False},
    }
    caplog.set_level(logging.WARNING, logger="gateway.upstream.tls")
    gateway = await make_gateway([{"name": "lab", "deployments": [deployment]}])
    warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.upstream.tls"]
    assert len(warnings) == 1
    assert warnings[0].startswith("deployment lab-box: tls.verify is false")
    answer = await gateway.client().chat.completions.create(
        model="lab", messages=[{"role": "user", "content": "hi"}]
    )
    assert answer.choices[0].message.content == "".join(ANSWER)
