"""The admin UI's files: public, served with strict security and cache headers, nothing else
made public, and every asset the page references present."""

from __future__ import annotations

import json
import re

import aiohttp
import pytest
from multidict import CIMultiDict

from gateway.http.ui import ASSETS
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "sk-ui-static-master-0123456789"


@pytest.fixture
async def gw(make_gateway: MakeGateway) -> GatewayUnderTest:
    return await make_gateway(auth={"master_key": MASTER})


async def fetch(
    gw: GatewayUnderTest, path: str, headers: dict[str, str] | None = None
) -> tuple[int, CIMultiDict[str], bytes]:
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + path, headers=headers, allow_redirects=False) as response:
            return response.status, CIMultiDict(response.headers), await response.read()


def assert_secure(headers: CIMultiDict[str]) -> None:
    csp = headers["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in csp.split(";"))
    assert directives["default-src"] == "'self'"
    assert directives["script-src"] == "'self'"  # no inline script, no eval, nothing external
    assert directives["frame-ancestors"] == "'none'"
    assert "unsafe" not in csp
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"
    assert headers["Cache-Control"] == "no-cache"


async def test_the_page_and_its_assets_need_no_key(gw: GatewayUnderTest) -> None:
    status, headers, body = await fetch(gw, "/ui/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    assert_secure(headers)
    page = body.decode()
    assert "<script" in page and not re.search(r"<script(?![^>]*\bsrc=)", page)  # no inline
    assert "style=" not in page
    referenced = re.findall(r'(?:src|href)="([^"]+)"', page)
    assert set(referenced) == {"favicon.svg", "app.css", "app.js"}
    kinds = {"app.js": "text/javascript", "app.css": "text/css", "favicon.svg": "image/svg+xml"}
    for name in referenced:
        status, headers, body = await fetch(gw, f"/ui/{name}")
        assert status == 200, name
        assert headers["Content-Type"].startswith(kinds[name])
        assert_secure(headers)
        assert body == (ASSETS / name).read_bytes()


async def test_every_module_the_page_imports_is_served(gw: GatewayUnderTest) -> None:
    seen: set[str] = set()
    todo = ["app.js"]
    while todo:
        name = todo.pop()
        status, headers, body = await fetch(gw, f"/ui/{name}")
        assert status == 200, name
        assert headers["Content-Type"].startswith("text/javascript")
        assert_secure(headers)
        seen.add(name)
        for imported in re.findall(r"^import [^;]+ from '\./([\w.-]+)';$", body.decode(), re.M):
            if imported not in seen:
                todo.append(imported)
    assert seen == {p.name for p in ASSETS.glob("*.js")}  # each module in use, each served


async def test_ui_redirects_to_its_directory(gw: GatewayUnderTest) -> None:
    status, headers, _ = await fetch(gw, "/ui")
    assert status == 308
    assert headers["Location"] == "ui/"  # relative: works behind a path prefix too


async def test_revalidation_answers_304(gw: GatewayUnderTest) -> None:
    _, headers, _ = await fetch(gw, "/ui/app.js")
    status, again, body = await fetch(gw, "/ui/app.js", {"If-None-Match": headers["ETag"]})
    assert status == 304 and body == b""
    assert again["ETag"] == headers["ETag"]


@pytest.mark.parametrize(
    "path", ["/ui/missing.js", "/ui/..%2Fhttp%2Fui.py", "/ui/.hidden.js", "/ui/README.md"]
)
async def test_only_the_ui_files_are_served(gw: GatewayUnderTest, path: str) -> None:
    status, _, body = await fetch(gw, path)
    assert status == 404
    assert b'"error"' in body


@pytest.mark.parametrize(
    "path", ["/uix", "/ui-data", "/v1/conversations", "/v1/me", "/v1/usage", "/v1/gateway/keys"]
)
async def test_nothing_else_became_public(gw: GatewayUnderTest, path: str) -> None:
    status, _, _ = await fetch(gw, path)
    assert status in (401, 404)
    if path.startswith("/v1/"):
        assert status == 401


async def test_me_says_who_a_key_acts_as(gw: GatewayUnderTest) -> None:
    bearer = {"Authorization": f"Bearer {MASTER}"}
    status, _, body = await fetch(gw, "/v1/me", bearer)
    assert status == 200
    me = json.loads(body)
    assert (me["kind"], me["is_admin"], me["team_name"], me["key_name"]) == (
        "admin",
        True,
        None,
        None,
    )
    # A virtual key: its team and itself, by id and by name.
    async with aiohttp.ClientSession(headers=bearer) as session:
        async with session.post(
            gw.url + "/v1/gateway/teams", json={"id": "search", "name": "Search"}
        ) as response:
            assert response.status == 201
        async with session.post(
            gw.url + "/v1/gateway/keys", json={"team_id": "search", "name": "bot"}
        ) as response:
            key = await response.json()
    status, _, body = await fetch(gw, "/v1/me", {"Authorization": f"Bearer {key['key']}"})
    me = json.loads(body)
    assert (me["kind"], me["team_id"], me["team_name"]) == ("key", "search", "Search")
    assert (me["key_id"], me["key_name"]) == (key["id"], "bot")
