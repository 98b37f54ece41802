"""The admin UI and the API it calls against clickjacking, CSRF and cross-origin reads.

- Clickjacking: every response under /ui (page, assets, its redirect, a 304) forbids framing,
  with `X-Frame-Options: DENY` and a CSP `frame-ancestors 'none'`.
- CSRF: the API authenticates by the `Authorization` / `x-api-key` header alone. No route sets a
  cookie and a cookie is never a credential, so a browser has nothing to attach to a forged
  request. On a gateway that runs open (no master key: every caller is admin) that is not
  enough: a form post or a no-cors fetch from another site's page would act. Browsers label
  such requests `Sec-Fetch-Site: cross-site` (or `same-site`), and the gateway refuses them
  (403 `cross_site_request`) before anything runs.
- Cross-origin reads: unless `server.cors_origins` lists an origin (tests/http/test_cors.py), the
  gateway sends no CORS headers at all, for a preflight or a request: no
  `Access-Control-Allow-Origin` (let alone `*` with credentials), no reflected Origin.
"""

from __future__ import annotations

import json
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "csrf-master-key-0123456789abcdef"
EVIL = "https://evil.example"
HELLO = [{"role": "user", "content": "hi"}]
CHAT = {"model": "demo", "messages": HELLO}
# What a browser adds to a form post or a no-cors fetch made by a page of another site.
FORGED = {"Origin": EVIL, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "navigate"}

Answer = tuple[int, CIMultiDictProxy[str], bytes]


async def send(
    gw: GatewayUnderTest,
    method: str,
    path: str,
    *,
    headers: dict[str, str] | None = None,
    json: Any = None,
    data: Any = None,
    cookies: dict[str, str] | None = None,
) -> Answer:
    async with aiohttp.ClientSession(cookies=cookies) as session:
        async with session.request(
            method,
            gw.url + path,
            headers=headers,
            json=json,
            data=data,
            allow_redirects=False,
        ) as response:
            return response.status, response.headers, await response.read()


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture
async def secured(make_gateway: MakeGateway) -> GatewayUnderTest:
    return await make_gateway(auth={"master_key": MASTER})


@pytest.fixture
async def open_gateway(make_gateway: MakeGateway) -> GatewayUnderTest:
    return await make_gateway()  # no master key: every caller is admin


async def test_no_ui_response_can_be_framed(secured: GatewayUnderTest) -> None:
    _, first, _ = await send(secured, "GET", "/ui/")
    answers = [
        await send(secured, "GET", "/ui"),  # the redirect
        await send(secured, "GET", "/ui/"),
        await send(secured, "GET", "/ui/", headers={"If-None-Match": first["ETag"]}),  # 304
        await send(secured, "GET", "/ui/app.js"),
        await send(secured, "GET", "/ui/app.css"),
        await send(secured, "GET", "/ui/favicon.svg"),
    ]
    assert [a[0] for a in answers] == [308, 200, 304, 200, 200, 200]
    for _, headers, _ in answers:
        assert headers["X-Frame-Options"] == "DENY"
        directives = [d.strip() for d in headers["Content-Security-Policy"].split(";")]
        assert "frame-ancestors 'none'" in directives
        assert "form-action 'none'" in directives  # the page posts no form anywhere


async def test_no_route_sets_a_cookie(secured: GatewayUnderTest) -> None:
    key = await make_key(secured)
    answers = [
        await send(secured, "GET", path)
        for path in ("/ui", "/ui/", "/ui/app.js", "/health/live", "/health/ready", "/metrics",
                     "/openapi.json", "/v1/me")
    ]  # fmt: skip
    answers.append(await send(secured, "GET", "/v1/nowhere", headers=bearer(MASTER)))
    for k in (key, MASTER):
        answers += [
            await send(secured, "GET", "/v1/me", headers=bearer(k)),
            await send(secured, "GET", "/v1/models", headers=bearer(k)),
            await send(secured, "GET", "/v1/conversations", headers=bearer(k)),
            await send(secured, "GET", "/v1/usage", headers=bearer(k)),
            await send(secured, "POST", "/v1/chat/completions", headers=bearer(k), json=CHAT),
            await send(secured, "POST", "/v1/chat/completions", headers=bearer(k),
                       json={**CHAT, "stream": True}),
            await send(secured, "POST", "/v1/responses", headers=bearer(k),
                       json={"model": "demo", "input": "hi"}),
            await send(secured, "POST", "/v1/conversations", headers=bearer(k), json={}),
            await send(secured, "GET", "/v1/gateway/keys", headers=bearer(k)),
            await send(secured, "PUT", "/v1/me", headers=bearer(k)),  # 405
        ]  # fmt: skip
    answers.append(await send(secured, "GET", "/v1/me", headers=bearer("gw-" + "x" * 43)))
    assert {a[0] for a in answers} >= {200, 308, 401, 403, 404, 405}
    for status, headers, _ in answers:
        assert "Set-Cookie" not in headers, status


async def make_key(gw: GatewayUnderTest) -> str:
    status, _, _ = await send(
        gw, "POST", "/v1/gateway/teams", headers=bearer(MASTER), json={"id": "t", "name": "T"}
    )
    assert status == 201
    status, _, body = await send(
        gw, "POST", "/v1/gateway/keys", headers=bearer(MASTER), json={"team_id": "t"}
    )
    assert status == 201
    return str(json.loads(body)["key"])


@pytest.mark.parametrize("name", ["Authorization", "api_key", "x-api-key", "key", "session"])
async def test_a_cookie_is_never_a_credential(secured: GatewayUnderTest, name: str) -> None:
    key = await make_key(secured)
    for value in (key, f"Bearer {key}", MASTER, f"Bearer {MASTER}"):
        cookies = {name: value}
        for method, path, kwargs in (
            ("GET", "/v1/me", {}),
            ("GET", "/v1/conversations", {}),
            ("POST", "/v1/chat/completions", {"json": CHAT}),
            ("POST", "/v1/gateway/keys", {"data": {"team_id": "t"}}),
        ):
            status, _, body = await send(secured, method, path, cookies=cookies, **kwargs)
            assert status == 401, (name, path, body)
            assert b"missing_api_key" in body


FORMS: list[tuple[str, str, dict[str, Any]]] = [
    # enctype=text/plain makes a body that parses as JSON (the gateway reads any content type)
    ("POST", "/v1/chat/completions", {"data": '{"model": "demo", "x": "=", "messages": '
                                              '[{"role": "user", "content": "spend"}]}',
                                      "headers": {"Content-Type": "text/plain"}}),
    ("POST", "/v1/chat/completions", {"data": {"model": "demo"}}),  # urlencoded
    ("POST", "/v1/gateway/teams", {"data": '{"id": "evil", "name": "x", "y": "="}',
                                   "headers": {"Content-Type": "text/plain"}}),
    ("POST", "/v1/gateway/keys", {"data": '{"team_id": "evil", "y": "="}',
                                  "headers": {"Content-Type": "text/plain"}}),
    ("POST", "/v1/conversations", {"data": "{}", "headers": {"Content-Type": "text/plain"}}),
    ("POST", "/v1/responses", {"data": '{"model": "demo", "input": "x"}',
                               "headers": {"Content-Type": "text/plain"}}),
    ("POST", "/v1/embeddings", {"data": '{"model": "demo", "input": "x"}',
                                "headers": {"Content-Type": "text/plain"}}),
    ("GET", "/v1/conversations", {}),  # a cross-site <img> or link: refused as well
]  # fmt: skip


@pytest.mark.parametrize("site", ["cross-site", "same-site"])
async def test_a_cross_site_request_cannot_act_even_on_an_open_gateway(
    open_gateway: GatewayUnderTest, site: str
) -> None:
    gw = open_gateway
    for method, path, kwargs in FORMS:
        headers = {**FORGED, "Sec-Fetch-Site": site, **kwargs.get("headers", {})}
        status, _, body = await send(gw, method, path, headers=headers, data=kwargs.get("data"))
        assert status == 403, (path, body)
        assert b"cross_site_request" in body
    await gw.flush()
    assert gw.query("SELECT count(*) FROM conversations") == [(0,)]
    assert gw.query("SELECT count(*) FROM teams") == [(0,)]
    # The same requests from the gateway's own page, or typed by the user, go through.
    for fetch_site in ("same-origin", "none"):
        headers = {"Sec-Fetch-Site": fetch_site, "Sec-Fetch-Mode": "cors"}
        status, _, _ = await send(gw, "POST", "/v1/chat/completions", headers=headers, json=CHAT)
        assert status == 200
    # Without a master key a browser-less client needs no key at all: the header is what
    # tells a browser's forged request apart.
    status, _, _ = await send(gw, "POST", "/v1/chat/completions", json=CHAT)
    assert status == 200


async def test_no_cors_grant_for_another_origin(secured: GatewayUnderTest) -> None:
    key = await make_key(secured)
    preflight = {
        "Origin": EVIL,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
    }
    answers: list[Answer] = []
    for path in (
        "/v1/chat/completions",
        "/v1/conversations",
        "/v1/gateway/keys",
        "/v1/me",
        "/ui/",
        "/metrics",
    ):
        answers.append(await send(secured, "OPTIONS", path, headers=preflight))
        browser = {**preflight, "Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "cors"}
        answers.append(await send(secured, "OPTIONS", path, headers=browser))
    for status, _, _ in answers:
        assert status >= 400  # no preflight is granted
    # A request that carries a key and an Origin (a server-side client, say) is answered, but
    # never with a grant for that origin: a browser would not let the page read it.
    answers.append(await send(secured, "GET", "/v1/me", headers={**bearer(key), "Origin": EVIL}))
    answers.append(
        await send(secured, "POST", "/v1/chat/completions", json=CHAT,
                   headers={**bearer(key), "Origin": EVIL})
    )  # fmt: skip
    assert [a[0] for a in answers[-2:]] == [200, 200]
    for _, headers, _ in answers:
        assert not [h for h in headers if h.lower().startswith("access-control-")], headers
        assert EVIL not in str(dict(headers))
