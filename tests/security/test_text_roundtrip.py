"""Any Unicode a client sends, NUL included, is stored losslessly on both backends and never
breaks a query (docs/security.md, "PostgreSQL-safe text")."""

from __future__ import annotations

import random
from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayUnderTest, MakeGateway


@pytest.fixture(params=["sqlite", "postgresql"])
async def gw(request: pytest.FixtureRequest, make_gateway: MakeGateway) -> GatewayUnderTest:
    store = {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}
    return await make_gateway(store=store)


def awkward_texts(count: int, seed: int = 33) -> list[str]:
    """Strings of any code points JSON can carry (all but surrogates), controls and NUL
    included, from every plane; the same ones every run."""
    rng = random.Random(seed)
    pick = [
        lambda: rng.randrange(0, 0x20),  # controls, NUL among them
        lambda: rng.randrange(0x20, 0x800),
        lambda: rng.choice([0x2028, 0x2029, 0xFEFF, 0xFFFD, 0xFFFF]),
        lambda: rng.randrange(0xE000, 0x10000),
        lambda: rng.randrange(0x10000, 0x110000),
    ]
    return [
        "".join(chr(rng.choice(pick)()) for _ in range(rng.randrange(1, 24))) for _ in range(count)
    ]


async def search(gw: GatewayUnderTest, text: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/v1/conversations", params={"q": text}) as response:
            return response.status, await response.json()


async def roundtrip(gw: GatewayUnderTest, text: str) -> None:
    item = {"type": "message", "role": "user", "content": text}
    status, made = await gw.post("/v1/conversations", {"items": [item], "metadata": {"n": text}})
    assert status == 200, made
    status, body = await gw.get(f"/v1/conversations/{made['id']}/messages")
    assert status == 200 and body["data"][0]["content"] == text, body
    status, body = await gw.get(f"/v1/conversations/{made['id']}")
    assert status == 200 and body["metadata"] == {"n": text}, body
    await searched(gw, text)


async def searched(gw: GatewayUnderTest, text: str) -> None:
    """A search for it answers; a NUL in a URL is a clean 400 (no URL carries one)."""
    status, listed = await search(gw, text)
    assert status == (400 if "\x00" in text else 200), listed


@pytest.mark.parametrize("text", ["a\x00b", "\x00", "naïve \u2028 \ufeff 🙂 \U0010ffff", "%_\\'"])
async def test_awkward_text_is_stored_searched_and_answered(
    gw: GatewayUnderTest, text: str
) -> None:
    await roundtrip(gw, text)
    chat = {"model": "demo", "messages": [{"role": "user", "content": text}]}
    status, body = await gw.post("/v1/chat/completions", chat)
    assert status == 200, body
    await searched(gw, text)


async def test_any_text_reads_back_equal(gw: GatewayUnderTest) -> None:
    for text in awkward_texts(60):
        await roundtrip(gw, text)
