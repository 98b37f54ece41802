"""Vertex AI through litellm, against fake Vertex endpoints (tests/providers/vertex.py): the
service account's token is fetched once, from its own `token_uri`, and carried by every
request, and nothing is reached but loopback. The streamed cases run in the adapter contract
suite (test_adapter_contract.py, `vertex-gemini` and `vertex-anthropic`)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from tests.conftest import MakeGateway
from tests.fakes import MakeServer
from tests.providers.test_adapter_contract import ANSWER, LITELLM_SKIP, start_gateway, stream_chat
from tests.providers.vertex import VertexAnthropicServer, VertexGeminiServer

pytestmark = pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")

FAKES = [
    pytest.param(VertexGeminiServer, id="gemini"),
    pytest.param(VertexAnthropicServer, id="anthropic"),
]


def _loopback(host: Any) -> bool:
    if host in ("localhost", None):
        return True
    try:
        return ipaddress.ip_address(str(host).split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture
def outside(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every name lookup and connection beyond loopback, refused and listed."""
    tried: list[str] = []
    lookup, connect = socket.getaddrinfo, socket.socket.connect

    def guarded_lookup(host: Any, *args: Any, **kwargs: Any) -> Any:
        if not _loopback(host):
            tried.append(f"lookup {host}")
            raise socket.gaierror(socket.EAI_NONAME, "no network in this test")
        return lookup(host, *args, **kwargs)

    def guarded_connect(sock: socket.socket, address: Any) -> None:
        if sock.family in (socket.AF_INET, socket.AF_INET6) and not _loopback(address[0]):
            tried.append(f"connect {address[0]}")
            raise ConnectionRefusedError("no network in this test")
        connect(sock, address)

    monkeypatch.setattr(socket, "getaddrinfo", guarded_lookup)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)
    return tried


@pytest.mark.parametrize("server", FAKES)
async def test_one_token_for_every_request_and_nothing_beyond_loopback(
    make_gateway: MakeGateway,
    aiohttp_server: MakeServer,
    outside: list[str],
    server: type[VertexGeminiServer | VertexAnthropicServer],
) -> None:
    """Two answers from one deployment: the service account signs in once at its `token_uri`
    (the fake), both requests carry that token, and no other host was looked up or reached."""
    fake = await server().start(aiohttp_server)
    gw = await start_gateway(make_gateway, fake)
    for _ in range(2):
        fake.text(ANSWER)
        view = await stream_chat(gw)
        assert view.error is None
        assert view.text == "".join(ANSWER)
    assert fake.token_requests == 1
    for request in fake.seen:
        assert request.headers["Authorization"] == f"Bearer {fake.tokens[0]}"
    assert outside == []
