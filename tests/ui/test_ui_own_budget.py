"""A team key's Usage view, in a real Chromium: its own budget and its team's, each with what it
has spent this period (`GET /v1/me`), beside its other limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.ui.harness import (
    QUESTION,
    VIEWPORTS,
    Shots,
    call,
    checked,
    expect,
    signed_in,
    stream_all,
)

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_team_key_sees_its_own_budget_and_its_teams(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, _a, _b = scene
    team_limits = {"rpm": 120, "budget": {"usd": 0.05, "period": "month", "mode": "soft"}}
    code, body = await call(
        gw, "POST", "/v1/gateway/teams", {"name": "Search", "id": "search", "limits": team_limits}
    )
    assert code == 201, body
    key_limits = {"budget": {"usd": 0.02, "period": "day", "mode": "soft"}}
    code, key = await call(
        gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "bot", "limits": key_limits}
    )
    assert code == 201, key
    _, headers = await stream_all(gw, key["key"], QUESTION)
    await gw.wait_turn_end(headers["X-Conversation-Id"])
    code, me = await call(gw, "GET", "/v1/me", key=key["key"])
    assert code == 200, me
    spent = me["budget"]["key"]["spent_usd"]
    assert spent > 0 and me["budget"]["team"]["spent_usd"] == spent

    page = await signed_in(browser, gw, key["key"], viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.locator(".nav-link", has_text="Usage").click()
    budgets = page.get_by_test_id("own-budgets")
    own = budgets.locator("[data-testid=budget][data-kind=key]")
    team = budgets.locator("[data-testid=budget][data-kind=team]")
    await expect(own).to_contain_text("This key (bot)")
    await expect(own).to_contain_text(f"of $0.02 · {100 * spent / 0.02:.1f}%")
    await expect(own).to_contain_text("per day (UTC) · soft")
    await expect(team).to_contain_text("Team Search")  # by its name
    await expect(team).to_contain_text(f"of $0.05 · {100 * spent / 0.05:.1f}%")
    await expect(team).to_contain_text("120 rpm")
    await expect(own.locator(".budget-fill")).to_have_class("budget-fill budget-warn")  # past 80%
    await checked(page, shots, f"48-own-budget-{width}")
    await page.context.close()
