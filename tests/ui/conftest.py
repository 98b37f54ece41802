"""The browser tests' fixtures: a gateway with two fake upstreams, and Chromium. Playwright is
imported only when a browser test runs (tests/ui/harness.py skips those without it)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import FakeUpstream


@pytest.fixture
async def scene(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]:
    """`a` fails or stalls on cue, `b` answers; both priced."""
    from tests.ui.harness import MASTER, deployment

    a, b = await make_upstream(), await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "deployments": [deployment(a, "a"), deployment(b, "b")],
                "retry": {"backoff_s": 0.01, "max_backoff_s": 0.05},
            }
        ],
        auth={"master_key": MASTER},
    )
    return gw, a, b


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    from tests.ui.harness import BROWSER_ARGS, CHROMIUM, playwright_api

    async with playwright_api.async_playwright() as p:
        launched = await p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=BROWSER_ARGS
        )
        yield launched
        await launched.close()
