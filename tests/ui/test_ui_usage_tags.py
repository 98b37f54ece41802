"""The Usage page grouped by a metadata tag (`GET /v1/usage?group_by=tag:<key>`), in Chromium at
desktop and phone width: the key is named in the page, kept in its URL, and each tag value's
spend is its own group, the requests without the tag one more."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.metering.usage import UsageRecord
from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.ui.harness import VIEWPORTS, Shots, checked, expect, signed_in

pytestmark = pytest.mark.timeout(90)
# Top spenders by the tag `project`: each value's and the untagged requests' spend and tokens.
SPENT = ["zeus" + "$2.00" + "20", "apollo" + "$1.75" + "40", "(none)" + "$0.25" + "20"]


def record(n: int, tags: str | None, cost: float) -> UsageRecord:
    return UsageRecord(
        id=f"turn_{n}:1",
        turn_id=f"turn_{n}",
        conversation_id=f"conv_{n}",
        team_id=None,
        key_id=None,
        user=None,
        alias="m",
        deployment="a",
        provider="openai",
        model="a-model",
        created_at=time.time() - 60 * (n + 1),
        status="completed",
        prompt_tokens=10,
        completion_tokens=10,
        completion_delivered=10,
        reasoning_tokens=0,
        cached_tokens=0,
        usage_source="provider",
        cost_usd=cost,
        ttft_ms=None,
        duration_ms=None,
        tags=tags,
    )


@pytest.mark.parametrize("width", [1440, 390])
async def test_usage_grouped_by_a_metadata_tag(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, _a, _b = scene
    for n, (tags, cost) in enumerate(
        [('{"project":"apollo"}', 1.25), ('{"project":"apollo"}', 0.5),
         ('{"project":"zeus"}', 2.0), (None, 0.25)]
    ):  # fmt: skip
        gw.gateway.store.write("usage", record(n, tags, cost).row())
    await gw.gateway.store.flush()

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/usage?range=24h")
    await page.get_by_test_id("usage-group-by").select_option("tag")
    # No key named yet: the page asks for one rather than for a report it cannot have.
    await expect(page.get_by_test_id("usage-tag-wanted")).to_be_visible()
    await page.get_by_test_id("usage-tag-key").fill("project")
    await page.get_by_test_id("usage-tag-key").press("Enter")
    await expect(page).to_have_url(re.compile(r"group_by=tag%3Aproject"))
    legend = page.locator(".legend").first
    await expect(legend.locator(".legend-item")).to_have_count(3)
    spenders = page.locator(".panel", has_text="Top spenders").locator("tbody tr")
    await expect(spenders).to_have_text(SPENT)
    await expect(page.locator('tr[data-group="apollo"]')).to_contain_text("apollo2")  # requests
    await expect(page.get_by_test_id("usage-group-by")).to_have_value("tag")
    await checked(page, shots, f"usage-by-tag-{width}")
    # The URL holds the grouping: opened again, the page is the same.
    await page.reload()
    await expect(page.get_by_test_id("usage-tag-key")).to_have_value("project")
    await expect(spenders).to_have_text(SPENT)
    await page.context.close()
