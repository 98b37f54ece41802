"""What a daily user of the admin UI notices, in a real Chromium: a tab opened from a signed-in
one is signed in (and signing out signs every tab out); a key rotated from the Keys page; dialogs
that name what they edit; one rule for costs and one word for each state; a page not found
without internal ids; and no serious or critical accessibility finding on any view, at a desk's
width and a phone's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, chunk, frames
from tests.ui.harness import (
    MASTER,
    VIEWPORTS,
    Shots,
    call,
    checked,
    expect,
    interrupted_conversation,
    signed_in,
)

pytestmark = pytest.mark.timeout(120)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]


async def team_and_key(gw: GatewayUnderTest) -> dict[str, Any]:
    code, body = await call(gw, "POST", "/v1/gateway/teams", {"name": "Search", "id": "search"})
    assert code == 201, body
    code, key = await call(gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "ci"})
    assert code == 201, key
    return dict(key)


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_tab_opened_from_a_signed_in_one_is_signed_in(
    scene: Scene, browser: Any, width: int
) -> None:
    gw, _a, _b = scene
    first = await signed_in(browser, gw, viewport=VIEWPORTS[width])  # not remembered
    context = first.context
    link = first.locator("nav.nav a", has_text="Usage")
    if width == 390:
        await expect(link).to_be_visible()
    async with context.expect_page() as opened:
        await link.click(modifiers=["Control"])  # a new tab, as Ctrl-click opens one
    second = await opened.value
    await expect(second.locator("[data-page=usage]")).to_be_visible()
    await expect(second.get_by_test_id("login-key")).to_have_count(0)
    # Another browser session (nothing shared) still has to sign in.
    stranger = await (await browser.new_context(viewport=VIEWPORTS[width])).new_page()
    await stranger.goto(gw.url + "/ui/#/usage")
    await expect(stranger.get_by_test_id("login-key")).to_be_visible()
    await stranger.context.close()
    # Signing out in one tab signs the others out.
    await second.get_by_test_id("sign-out").click()
    await expect(second.get_by_test_id("login-key")).to_be_visible()
    await expect(first.get_by_test_id("login-key")).to_be_visible()
    await expect(first.locator(".login")).to_contain_text("signed out in another tab")
    await context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_key_is_rotated_from_the_keys_page_and_dialogs_name_what_they_edit(
    scene: Scene, browser: Any, width: int
) -> None:
    gw, _a, _b = scene
    old = await team_and_key(gw)
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width])
    await page.goto(gw.url + "/ui/#/keys")
    row = page.locator(f"tr[data-key-id='{old['id']}']")
    await row.get_by_test_id("edit-limits").click()
    dialog = page.get_by_test_id("limits-dialog")
    title = 'Limits and budget of key "ci" of team Search'
    await expect(dialog.get_by_role("heading")).to_have_text(title)
    await expect(dialog).to_have_attribute("aria-label", title)
    await dialog.get_by_role("button", name="Cancel").click()
    team_row = page.locator("tr[data-team-id=search]")
    await team_row.get_by_test_id("edit-limits").click()
    await expect(dialog.get_by_role("heading")).to_have_text("Limits and budget of team Search")
    await page.keyboard.press("Escape")

    await row.get_by_test_id("rotate").click()
    rotate = page.get_by_test_id("rotate-dialog")
    await expect(rotate.get_by_role("heading")).to_have_text('Rotate key "ci" of team Search')
    await rotate.get_by_test_id("rotate-overlap").select_option("3600")
    await rotate.get_by_test_id("rotate-confirm").click()
    secret = page.get_by_test_id("new-secret")
    await expect(secret).to_be_visible()
    told = page.get_by_test_id("secret-box")
    await expect(told).to_contain_text('Key "ci" rotated for team search')
    await expect(told).to_contain_text("The old key")
    new_key = await secret.text_content()
    assert new_key and new_key != old["key"]
    code, me = await call(gw, "GET", "/v1/me", key=new_key)
    assert code == 200 and me["team_id"] == "search"
    code, _ = await call(gw, "GET", "/v1/me", key=old["key"])
    assert code == 200  # for the overlap chosen
    await expect(page.locator("tr[data-key-id]")).to_have_count(2)
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_page_not_found_shows_no_internal_id(
    scene: Scene, browser: Any, width: int
) -> None:
    gw, _a, _b = scene
    key = await team_and_key(gw)
    page = await signed_in(browser, gw, key=key["key"], viewport=VIEWPORTS[width])
    await page.goto(gw.url + "/ui/#/conversations/not-here")
    found = page.get_by_test_id("not-found")
    await expect(found).to_contain_text("There is no conversation not-here that this key can see.")
    text = await page.locator("main").text_content()
    assert text is not None and "~" not in text
    await page.goto(gw.url + "/ui/#/nowhere")
    await expect(found).to_contain_text("There is no page /nowhere")
    await expect(found.get_by_role("link", name="Back to the conversations")).to_be_visible()
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_one_rule_for_costs_and_one_word_for_a_state_in_progress(
    scene: Scene, browser: Any, width: int
) -> None:
    gw, a, _b = scene
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width])
    shown = await page.evaluate(
        """async () => {
            const { fmtUsd, fmtUsdExact } = await import('./format.js');
            return [12.345, 1, 0.25, 0.022, 0.000165, 0.0000004, 0].map(fmtUsd)
                .concat([fmtUsdExact === fmtUsd]);
        }"""
    )
    assert shown == ["$12.35", "$1.00", "$0.25", "$0.022", "$0.000165", "$0.00", "$0.00", True]
    # A turn in progress reads "in progress" in the list, as the filter and the chat say it.
    a.push(frames(chunk("Still "), then="stall"))
    raw = await gw.client(MASTER).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Go on and on."}], stream=True
    )
    stream = raw.parse()
    async for _ in stream:
        break
    await page.goto(gw.url + "/ui/#/conversations?status=active")
    row = page.locator("tr[data-conversation-id]")
    await expect(row.locator("[data-status=active]")).to_have_text("in progress")
    await expect(page.get_by_test_id("filter-status").locator("option[value=active]")).to_have_text(
        "In progress"
    )
    await row.locator("a.conv-preview").click()
    await expect(page.locator(".meta [data-status=active]")).to_have_text("in progress")
    await expect(page.locator(".turn-head")).to_contain_text("in progress")
    await stream.close()
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_every_view_has_no_serious_accessibility_finding(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, a, _b = scene
    await team_and_key(gw)
    conversation_id, _ = await interrupted_conversation(gw, a)
    context = await browser.new_context(viewport=VIEWPORTS[width], bypass_csp=True)
    page = await context.new_page()
    page.set_default_timeout(10_000)
    shots = Shots(page, tmp_path)
    await page.goto(gw.url + "/ui/")
    await expect(page.get_by_test_id("login-key")).to_be_visible()
    await expect(page.get_by_role("main")).to_have_count(1)
    await expect(page.get_by_role("heading", level=1)).to_have_count(1)
    await checked(page, shots, f"48-axe-signin-{width}")
    await page.close()
    await context.close()

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    views = {
        "list": ("#/conversations", "[data-page=conversations] tr[data-conversation-id]"),
        "chat": (f"#/conversations/{conversation_id}", "[data-testid=fallback-note]"),
        "trajectory": (f"#/conversations/{conversation_id}?view=trajectory", ".page .panel"),
        "timeline": (f"#/conversations/{conversation_id}?view=timeline", ".tl-attempt"),
        "calls": ("#/requests", "[data-page=requests] .panel"),
        "usage": ("#/usage", "[data-page=usage] .panel"),
        "keys": ("#/keys", "tr[data-key-id]"),
        "deployments": ("#/deployments", "tr[data-deployment]"),
        "not-found": ("#/nowhere", "[data-testid=not-found]"),
    }
    for name, (route, ready) in views.items():
        await page.goto(f"{gw.url}/ui/{route}")
        await expect(page.locator(ready).first).to_be_visible()
        await expect(page.locator(".loading")).to_have_count(0)
        await checked(page, shots, f"48-axe-{name}-{width}")
    # The dialogs, open.
    await page.goto(f"{gw.url}/ui/#/keys")
    await page.locator("tr[data-key-id]").get_by_test_id("edit-limits").click()
    await expect(page.get_by_test_id("limits-dialog")).to_be_visible()
    await checked(page, shots, f"48-axe-limits-dialog-{width}")
    await page.keyboard.press("Escape")
    await page.locator("tr[data-key-id]").get_by_test_id("rotate").click()
    await expect(page.get_by_test_id("rotate-dialog")).to_be_visible()
    await checked(page, shots, f"48-axe-rotate-dialog-{width}")
    await page.context.close()
