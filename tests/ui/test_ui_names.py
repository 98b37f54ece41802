"""Teams and keys by their names on a conversation's page, in the keys table and in the team
key's own views, in a real Chromium: the master key sees every team's and key's name, a team
key its own team's and its own; the ids stay a hover away."""

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


def meta(page: Any, label: str) -> Any:
    return page.locator(".meta-item", has=page.locator("dt", has_text=label)).locator("dd")


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_conversation_names_its_team_and_key(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, _a, _b = scene
    code, body = await call(gw, "POST", "/v1/gateway/teams", {"name": "Search", "id": "search"})
    assert code == 201, body
    code, key = await call(gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "bot"})
    assert code == 201, key
    code, other = await call(gw, "POST", "/v1/gateway/keys", {"team_id": "search"})
    assert code == 201, other
    _, headers = await stream_all(gw, key["key"], QUESTION)
    conversation = headers["X-Conversation-Id"]
    _, unnamed_headers = await stream_all(gw, other["key"], QUESTION)
    unnamed = unnamed_headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation)
    await gw.wait_turn_end(unnamed)

    admin = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(admin, tmp_path)
    await admin.goto(f"{gw.url}/ui/#/conversations/{conversation}")
    await expect(meta(admin, "Team")).to_have_text("Search")
    await expect(meta(admin, "Team").locator("span")).to_have_attribute("title", "search")
    await expect(meta(admin, "Key")).to_have_text("bot")
    await expect(meta(admin, "Key").locator("span")).to_have_attribute("title", key["id"])
    await checked(admin, shots, f"49-names-admin-{width}")
    await admin.goto(f"{gw.url}/ui/#/conversations/{unnamed}")  # a key without a name
    await expect(meta(admin, "Key")).to_have_text(f"{other['key_prefix']}…")
    await admin.locator(".nav-link", has_text="Keys").click()  # each key's team, by name
    await expect(admin.get_by_test_id("key-team")).to_have_text(["Search", "Search"])
    await expect(admin.get_by_test_id("key-team").first).to_have_attribute("title", "search")
    await admin.context.close()

    team = await signed_in(browser, gw, key["key"], viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(team, tmp_path)
    await expect(team.locator(".who-detail")).to_have_text("team Search")
    await expect(team.locator(".page-header")).to_contain_text("The conversations of team Search")
    await team.goto(f"{gw.url}/ui/#/conversations/{conversation}")
    await expect(meta(team, "Team")).to_have_text("Search")
    await expect(meta(team, "Key")).to_have_text("bot")
    await checked(team, shots, f"50-names-team-key-{width}")
    await team.goto(f"{gw.url}/ui/#/conversations/{unnamed}")  # a team mate's key: its id
    await expect(meta(team, "Key").locator("code")).to_be_visible()
    await team.context.close()
