"""A credential the gateway cannot read is a 401 (or, when HTTP itself is broken, a 4xx), never
a 500, and its value is never echoed in an answer nor written to a log (docs/security.md,
"No key").

Over raw sockets, to the gateway served as `gateway serve` serves it: header values with bytes
that are not UTF-8 (aiohttp hands them on with lone surrogates, which no hash takes), control
characters (which aiohttp's parser refuses, quoting the line in its message), an over-long
header, and a header line without a colon.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest, MakeGateway

TAG = os.urandom(4).hex()
MASTER = f"cred-errors-master-{TAG}-0123456789"
MARK = f"CRED{TAG}"  # in every credential sent: found nowhere afterwards
BOUND_S = 10.0


@pytest.fixture(params=["keyed", "open"])
async def gw(request: pytest.FixtureRequest, make_gateway: MakeGateway) -> GatewayUnderTest:
    master = MASTER if request.param == "keyed" else None
    return await make_gateway(auth={"master_key": master})


async def exchange(gw: GatewayUnderTest, raw: bytes) -> tuple[int, bytes]:
    """Send `raw` on a new connection; the status and everything the server sent."""
    url = gw.server.make_url("")
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        writer.write(raw)
        await writer.drain()
        async with asyncio.timeout(BOUND_S):
            answer = await reader.read()  # to EOF: each request here says Connection: close
    finally:
        writer.close()
    return int(answer.split(b" ", 2)[1]), answer


def request(*headers: bytes, path: bytes = b"/v1/models") -> bytes:
    lines = [b"GET " + path + b" HTTP/1.1", b"Host: localhost", *headers, b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n"


UNDECODABLE = [
    b"Authorization: Bearer sk-" + MARK.encode() + b"\xff\xfe0123456789",
    b"Authorization: Bearer gw-" + MARK.encode() + b"\xe9" * 35,
    b"x-api-key: sk-" + MARK.encode() + b"\xc3\x280123456789",
    b"x-api-key: " + MARK.encode() + b"\x80\x81",
    b"Authorization: Bearer " + MARK.encode() + b"\xed\xa0\x80abcdef",  # an encoded surrogate
]


@pytest.mark.parametrize("header", UNDECODABLE, ids=range(len(UNDECODABLE)))
async def test_an_undecodable_credential_is_a_401_that_echoes_nothing(
    gw: GatewayUnderTest, header: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    status, answer = await exchange(gw, request(header))
    assert status == 401, answer
    body = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert body["error"]["code"] == "invalid_api_key"
    assert MARK.encode() not in answer
    assert MARK not in caplog.text
    # The Anthropic dialect answers in its own shape, the same way.
    status, answer = await exchange(gw, request(header, path=b"/v1/messages"))
    assert status in (401, 405), answer
    assert MARK.encode() not in answer


MALFORMED: list[tuple[bytes, int]] = [
    (b"Authorization: Bearer sk-" + MARK.encode() + b"0123456789\x01abc", 400),
    (b"Authorization: Bearer sk-" + MARK.encode() + b"0123456789\x7f", 400),
    (b"x-api-key: " + MARK.encode() + b"\x00abc", 400),
    (b"Authorization: Bearer sk-" + MARK.encode() + b"a" * 9000, 431),
    (b"Authorization Bearer sk-" + MARK.encode() + b"0123456789", 400),  # no colon
    (b"Authori\x01zation: Bearer sk-" + MARK.encode(), 400),  # a bad name
]


@pytest.mark.parametrize("header,expected", MALFORMED, ids=range(len(MALFORMED)))
async def test_a_malformed_credential_header_is_refused_without_echo(
    gw: GatewayUnderTest, header: bytes, expected: int, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    status, answer = await exchange(gw, request(header))
    assert status == expected, answer
    body: dict[str, Any] = json.loads(answer.partition(b"\r\n\r\n")[2])
    assert set(body["error"]) == {"message", "type", "code", "param"}
    assert MARK.encode() not in answer
    assert MARK not in caplog.text
    status, _ = await exchange(gw, request(path=b"/health/live"))
    assert status == 200


async def test_a_well_formed_wrong_key_is_still_a_plain_401(
    make_gateway: MakeGateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gw = await make_gateway(auth={"master_key": MASTER})
    for header in (
        b"Authorization: Bearer caf\xc3\xa9-" + MARK.encode(),  # UTF-8, just not a key
        b"Authorization: Bearer gw-" + MARK.encode().ljust(43, b"x"),
        b"x-api-key: sk-" + MARK.encode(),
    ):
        status, answer = await exchange(gw, request(header))
        assert status == 401, answer
        assert json.loads(answer.partition(b"\r\n\r\n")[2])["error"]["message"] == (
            "Incorrect API key provided."
        )
    assert MARK not in caplog.text
