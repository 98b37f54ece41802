"""`server.cors_origins`: a listed origin's preflight is answered without a key and its answers,
streams and errors included, carry `Access-Control-Allow-Origin`; any other origin, and every
origin when the setting is unset, gets no CORS header at all."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from gateway.config import ConfigError, parse_config
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "cors-master-key-0123456789abcdef"
APP = "http://localhost:5173"
OTHER = "https://evil.example"
CHAT = {"model": "demo", "stream": True, "messages": [{"role": "user", "content": "hi"}]}


def preflight(origin: str) -> dict[str, str]:
    return {
        "Origin": origin,
        "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type",
        "Sec-Fetch-Mode": "cors",
        "Sec-Fetch-Site": "same-site",
    }


def page(origin: str, key: str | None = MASTER) -> dict[str, str]:
    """What a browser sends with a page's fetch to the gateway."""
    headers = {"Origin": origin, "Sec-Fetch-Mode": "cors", "Sec-Fetch-Site": "same-site"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return headers


async def send(
    gw: GatewayUnderTest, method: str, path: str, headers: dict[str, str], json: Any = None
) -> tuple[int, CIMultiDictProxy[str], bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, gw.url + path, headers=headers, json=json) as response,
    ):
        return response.status, response.headers, await response.read()


async def gateway(make_gateway: MakeGateway, origins: Any) -> GatewayUnderTest:
    server = {"cors_origins": origins} if origins is not None else {}
    return await make_gateway(auth={"master_key": MASTER}, server=server)


async def test_a_listed_origin_gets_its_preflight_without_a_key(
    make_gateway: MakeGateway,
) -> None:
    gw = await gateway(make_gateway, [APP])
    status, headers, _ = await send(gw, "OPTIONS", "/v1/chat/completions", preflight(APP))
    assert status == 204
    assert headers["Access-Control-Allow-Origin"] == APP
    assert "POST" in headers["Access-Control-Allow-Methods"]
    assert headers["Access-Control-Allow-Headers"] == "authorization, content-type"
    assert "Origin" in headers["Vary"]
    assert "Access-Control-Allow-Credentials" not in headers


async def test_a_listed_origin_reads_a_stream_and_an_error(make_gateway: MakeGateway) -> None:
    gw = await gateway(make_gateway, [APP])
    status, headers, body = await send(gw, "POST", "/v1/chat/completions", page(APP), CHAT)
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")
    assert headers["Access-Control-Allow-Origin"] == APP
    assert "X-Conversation-Id" in headers["Access-Control-Expose-Headers"]
    # A wrong key's 401 is readable by the page too, so it can say what went wrong.
    status, headers, _ = await send(gw, "POST", "/v1/chat/completions", page(APP, "nope"), CHAT)
    assert status == 401
    assert headers["Access-Control-Allow-Origin"] == APP


async def test_another_origin_gets_no_cors_header(make_gateway: MakeGateway) -> None:
    gw = await gateway(make_gateway, [APP])
    status, headers, _ = await send(gw, "OPTIONS", "/v1/chat/completions", preflight(OTHER))
    assert status == 403  # another site's request, as without the setting
    assert not [h for h in headers if h.lower().startswith("access-control-")]
    # Its page's request, were a browser to send it anyway, is refused as before.
    status, headers, body = await send(gw, "POST", "/v1/chat/completions", page(OTHER), CHAT)
    assert status == 403 and b"cross_site_request" in body
    assert "Access-Control-Allow-Origin" not in headers


async def test_the_operator_endpoints_stay_same_origin(make_gateway: MakeGateway) -> None:
    gw = await gateway(make_gateway, [APP])
    status, _, body = await send(gw, "GET", "/v1/gateway/keys", page(APP))
    assert status == 403 and b"cross_site_request" in body


async def test_any_origin_with_a_star(make_gateway: MakeGateway) -> None:
    gw = await gateway(make_gateway, "*")
    status, headers, _ = await send(gw, "OPTIONS", "/v1/embeddings", preflight(OTHER))
    assert status == 204 and headers["Access-Control-Allow-Origin"] == "*"
    status, headers, _ = await send(gw, "GET", "/v1/models", page(OTHER))
    assert status == 200 and headers["Access-Control-Allow-Origin"] == "*"


async def test_unset_sends_no_cors_header(make_gateway: MakeGateway) -> None:
    gw = await gateway(make_gateway, None)
    for method, path, headers in [
        ("OPTIONS", "/v1/chat/completions", preflight(APP)),
        ("GET", "/v1/models", page(APP)),
        ("GET", "/v1/models", {"Origin": APP, "Authorization": f"Bearer {MASTER}"}),
    ]:
        status, answered, _ = await send(gw, method, path, headers)
        assert status in (200, 403)
        assert not [h for h in answered if h.lower().startswith("access-control-")]


@pytest.mark.parametrize("origin", ["http://localhost:5173/", "localhost:5173", "https://a/b"])
def test_an_origin_with_a_path_or_no_scheme_is_a_config_error(origin: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_config({"server": {"cors_origins": [origin]}})
    assert "server.cors_origins" in str(raised.value)
    assert "not an origin" in str(raised.value)
