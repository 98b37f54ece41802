"""An open gateway (no master key) answers only requests meant for this machine: a `Host` that
is a loopback name or one of `server.allowed_hosts` (DNS rebinding), and, for a change, no other
site's `Origin`. With a master key neither is checked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.config import ConfigError, parse_config
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "host-guard-master-key-0123456789"
CHAT = {"model": "demo", "messages": [{"role": "user", "content": "hi"}]}
TEAM = {"id": "rebound", "name": "Made by a rebinding page"}


async def send(
    gw: GatewayUnderTest,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    body: Any = None,
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gw.url + path, headers=headers, json=body) as response,
    ):
        raw = await response.read()
    try:
        return response.status, json.loads(raw)
    except ValueError:
        return response.status, raw


async def secured_gateway(make_gateway: MakeGateway, tmp_path: Path) -> GatewayUnderTest:
    """A second gateway beside the open one, with a master key and its own store."""
    store = {"url": f"sqlite:///{tmp_path}/secured.db", "spool_path": str(tmp_path / "spool2")}
    return await make_gateway(auth={"master_key": MASTER}, store=store)


async def test_an_open_gateway_refuses_a_rebound_host(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    gw = await make_gateway()
    for host in ("evil.example", "evil.example:4000", "127.0.0.1.evil.example", "localhost.evil"):
        status, body = await send(gw, "GET", "/v1/conversations", {"Host": host})
        assert status == 403, (host, body)
        assert body["error"]["code"] == "host_not_allowed"
        assert body["error"]["type"] == "permission_error" and body["error"]["param"] is None
        assert "server.allowed_hosts" in body["error"]["message"]
    status, body = await send(gw, "POST", "/v1/gateway/teams", {"Host": "evil.example"}, TEAM)
    assert status == 403 and body["error"]["code"] == "host_not_allowed"
    await gw.flush()
    assert gw.query("SELECT count(*) FROM teams") == [(0,)]
    # Probes and scrapers address a replica by IP or service name.
    for path in ("/health/live", "/health/ready", "/metrics"):
        status, _ = await send(gw, "GET", path, {"Host": "10.1.2.3:4000"})
        assert status == 200, path
    # With a master key a page cannot act without knowing it: any host is answered.
    secured = await secured_gateway(make_gateway, tmp_path)
    headers = {"Host": "gateway.example.com", "Authorization": f"Bearer {MASTER}"}
    status, body = await send(secured, "GET", "/v1/models", headers)
    assert status == 200, body


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:4000", "LocalHost.", "127.0.0.1", "127.0.0.1:80", "[::1]:4000"]
)
async def test_an_open_gateway_answers_loopback_names(make_gateway: MakeGateway, host: str) -> None:
    gw = await make_gateway()
    status, body = await send(gw, "GET", "/v1/models", {"Host": host})
    assert status == 200, body
    assert [m["id"] for m in body["data"]] == ["demo"]
    # The same request addressed to another name is refused.
    status, body = await send(gw, "GET", "/v1/models", {"Host": f"x{host.strip('[]')}.example"})
    assert status == 403, body


async def test_allowed_hosts_are_answered_too(make_gateway: MakeGateway) -> None:
    gw = await make_gateway(server={"allowed_hosts": ["gateway.lan", "192.168.1.20"]})
    for host in ("gateway.lan", "Gateway.LAN:4000", "192.168.1.20:4000"):
        status, body = await send(gw, "POST", "/v1/chat/completions", {"Host": host}, CHAT)
        assert status == 200, (host, body)
    status, body = await send(gw, "GET", "/v1/models", {"Host": "other.lan"})
    assert status == 403 and body["error"]["code"] == "host_not_allowed"


async def test_an_open_gateway_refuses_changes_from_another_sites_page(
    make_gateway: MakeGateway, tmp_path: Path
) -> None:
    gw = await make_gateway(server={"cors_origins": ["https://app.example.com"]})
    # No Sec-Fetch-Site: an older browser, or a page's form the header would not catch.
    for origin in ("https://evil.example", "http://evil.example:4000", "null"):
        for method, path, body in (
            ("POST", "/v1/chat/completions", CHAT),
            ("POST", "/v1/gateway/teams", TEAM),
            ("DELETE", "/v1/conversations/conv_x", None),
        ):
            status, answer = await send(gw, method, path, {"Origin": origin}, body)
            assert status == 403, (origin, path, answer)
            assert answer["error"]["code"] == "cross_site_request"
    await gw.flush()
    assert gw.query("SELECT count(*) FROM teams") == [(0,)]
    assert gw.query("SELECT count(*) FROM conversations") == [(0,)]
    # Reading is not a change; the user's own pages and a listed origin's may change things.
    status, _ = await send(gw, "GET", "/v1/models", {"Origin": "https://evil.example"})
    assert status == 200
    for origin in ("http://localhost:5173", "http://127.0.0.1:8080", "https://app.example.com"):
        status, answer = await send(gw, "POST", "/v1/chat/completions", {"Origin": origin}, CHAT)
        assert status == 200, (origin, answer)
    # With a master key, the key is what a page lacks: its Origin is not looked at.
    secured = await secured_gateway(make_gateway, tmp_path)
    headers = {"Origin": "https://evil.example", "Authorization": f"Bearer {MASTER}"}
    status, answer = await send(secured, "POST", "/v1/chat/completions", headers, CHAT)
    assert status == 200, answer


@pytest.mark.parametrize("name", ["http://gateway.lan", "gateway.lan:4000", "a b", ""])
def test_allowed_hosts_are_names_alone(name: str) -> None:
    with pytest.raises(ConfigError, match=r"server\.allowed_hosts: Value error"):
        parse_config({"server": {"allowed_hosts": [name]}})
