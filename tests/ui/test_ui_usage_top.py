"""The Usage page's tables of groups at a scale of many users, in a real Chromium: the top
spenders' rows until the rest are asked for, the totals and the export counting every user,
and the table's state kept while the page refreshes itself."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.metering.usage import UsageRecord
from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.ui.harness import VIEWPORTS, Shots, checked, expect, signed_in

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]
USERS = 26  # more than the 20 rows a table shows until asked


async def seed(gw: GatewayUnderTest) -> None:
    """One request by each user in the last hour; user `u{n}` spends n cents."""
    now = datetime.now(UTC).timestamp()
    for n in range(1, USERS + 1):
        record = UsageRecord(
            id=f"turn_{n}:1",
            turn_id=f"turn_{n}",
            conversation_id=f"conv_{n}",
            team_id=None,
            key_id=None,
            user=f"u{n:02d}",
            alias="m",
            deployment="a",
            provider="openai",
            model="a-model",
            created_at=now - 600 - n,
            status="completed",
            prompt_tokens=10,
            completion_tokens=10,
            completion_delivered=10,
            reasoning_tokens=0,
            cached_tokens=0,
            usage_source="provider",
            cost_usd=n / 100,
            ttft_ms=100.0 + n,
            duration_ms=1000.0 + n,
        )
        gw.gateway.store.write("usage", record.row())
    await gw.gateway.store.flush()


@pytest.mark.parametrize("width", [1440, 390])
async def test_the_usage_tables_show_the_top_users_until_asked(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, _a, _b = scene
    await seed(gw)
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/usage?range=24h&group_by=user")
    not_latency = ":not([data-testid=latency] tr)"
    rates = page.locator(f"tr[data-group]{not_latency}")
    latency = page.get_by_test_id("latency").locator("tr[data-group]")
    await expect(rates).to_have_count(20)
    await expect(latency).to_have_count(20)
    # By spend: the biggest first, the six smallest left out of the table but not the totals.
    await expect(rates.first).to_have_attribute("data-group", f"u{USERS}")
    await expect(page.locator(f'tr[data-group="u06"]{not_latency}')).to_have_count(0)
    await expect(page.get_by_test_id("stat-requests")).to_contain_text(f"{USERS} upstream attempts")
    spend = sum(range(1, USERS + 1)) / 100
    await expect(page.get_by_test_id("usage-totals")).to_contain_text(f"${spend:.2f}")
    show = page.get_by_test_id("rates-show-all")
    await expect(show).to_have_text(f"Show all {USERS}")
    await expect(show).to_have_attribute("aria-expanded", "false")
    await checked(page, shots, f"52-usage-top-users-{width}")

    async with page.expect_download() as info:
        await page.get_by_test_id("usage-csv").click()
    exported = list(csv.DictReader(io.StringIO((await (await info.value).path()).read_text())))
    assert {r["group"] for r in exported if r["period_start"] != "total"} == {
        f"u{n:02d}" for n in range(1, USERS + 1)
    }

    await show.click()
    await expect(rates).to_have_count(USERS)
    await expect(latency).to_have_count(20)  # each table is asked for its own rest
    await expect(show).to_have_text("Show the top 20")
    await expect(show).to_be_focused()
    # A refresh of the page draws the table as it was left.
    await page.clock.install()
    await page.get_by_test_id("auto-refresh").check()
    async with page.expect_response(lambda r: "/v1/usage/latency" in r.url):
        await page.clock.run_for(6_000)
    await expect(page.get_by_test_id("rates-show-all")).to_have_text("Show the top 20")
    await expect(rates).to_have_count(USERS)
    await checked(page, shots, f"53-usage-all-users-{width}")
    await page.get_by_test_id("rates-show-all").click()
    await expect(rates).to_have_count(20)
    await page.context.close()
