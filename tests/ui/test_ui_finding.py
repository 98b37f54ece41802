"""Finding conversations in the admin UI, in a real Chromium: the User filter by a part of a
name, the search box by the end of an id the list itself shows, a To date before From said to
be so, and a link to each search that opens it again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.ui.harness import MASTER, VIEWPORTS, Shots, checked, expect, signed_in

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]


async def ask(gw: GatewayUnderTest, user: str, question: str) -> str:
    raw = await gw.client(MASTER).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": question}], user=user, stream=True
    )
    async for _ in raw.parse():
        pass
    conversation_id = raw.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    return conversation_id


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_part_of_a_user_and_the_end_of_an_id_find_conversations(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, _a, _b = scene
    carol = await ask(gw, "carol@acme.io", "Which capital is on the Thames?")
    bob = await ask(gw, "bob@example.com", "Which capital is on the Seine?")
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows).to_have_count(2)

    # The user filter: a part of the name is enough.
    user = page.get_by_test_id("filter-user")
    await user.fill("carol")
    await user.press("Enter")
    await expect(rows).to_have_count(1)
    await expect(rows).to_have_attribute("data-conversation-id", carol)
    assert "user=carol" in page.url
    await checked(page, shots, f"48-user-part-{width}")

    # A link to this search opens it again, filters and all.
    link = await page.get_by_test_id("search-link").get_attribute("href")
    assert link is not None and "user=carol" in link
    await page.goto(gw.url + "/ui/#/usage")
    await expect(page.locator("[data-page=usage]")).to_be_visible()
    await page.goto(link)
    await expect(page.get_by_test_id("filter-user")).to_have_value("carol")
    await expect(rows).to_have_count(1)
    await expect(rows).to_have_attribute("data-conversation-id", carol)

    # The end of an id as the list shows it finds its conversation.
    await page.goto(gw.url + "/ui/#/conversations")
    await expect(rows).to_have_count(2)
    shown = await page.locator(f"tr[data-conversation-id='{bob}'] code.id").first.text_content()
    assert shown is not None and "…" in shown and shown.endswith(bob[-8:])
    box = page.locator("[data-page=conversations]").get_by_test_id("filter-q")
    for fragment in (shown, bob[-8:]):
        await box.fill(fragment)
        await box.press("Enter")
        await expect(page.get_by_test_id("list-summary")).to_contain_text("the end of an id")
        await expect(rows).to_have_count(1)
        await expect(rows).to_have_attribute("data-conversation-id", bob)
    await checked(page, shots, f"48-id-tail-{width}")


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_to_date_before_from_is_explained(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, _a, _b = scene
    await ask(gw, "carol@acme.io", "Which capital is on the Thames?")
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    # From a link: the page says why nothing can be listed.
    await page.goto(gw.url + "/ui/#/conversations?since=2026-02-01&until=2026-01-01")
    error = page.get_by_test_id("date-range-error")
    await expect(error).to_contain_text('"To" (2026-01-01) is before "From" (2026-02-01)')
    await expect(page.locator("tr[data-conversation-id]")).to_have_count(0)
    await checked(page, shots, f"48-date-range-{width}")
    # In the form: the To field refuses it, saying why, and the search is not run.
    await page.goto(gw.url + "/ui/#/conversations")
    await expect(page.locator("tr[data-conversation-id]")).to_have_count(1)
    await page.get_by_test_id("filter-since").fill("2026-02-01")
    until = page.get_by_test_id("filter-until")
    await until.fill("2026-01-01")
    await page.get_by_role("button", name="Apply").click()
    message = await until.evaluate("(e) => e.validationMessage")
    assert '"To" must be on or after "From" (2026-02-01)' in message
    assert "until=" not in page.url
