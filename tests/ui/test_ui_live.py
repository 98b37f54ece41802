"""A streaming turn's answer on its conversation's page, in a real Chromium: it shows what the
client has been delivered while the turn runs, so an admin presses Stop on what the user sees."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from tests.conftest import GatewayUnderTest
from tests.fakes import FAKE, FakeUpstream, chunk, completion
from tests.ui.harness import MASTER, VIEWPORTS, Shots, checked, expect, signed_in

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_running_answer_grows_on_its_page(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, a, _b = scene
    first, more = ["Tea, ", "then "], ["toast, ", "then jam."]

    async def two_parts(request: web.Request) -> web.StreamResponse:
        """`first`, then `more` once the test lets it go on, then nothing until stopped."""
        fake = request.app[FAKE]
        response = await fake.start_sse(request)
        for part in first:
            await fake.write(response, chunk(part))
        await fake.release.wait()
        for part in more:
            await fake.write(response, chunk(part))
        await fake.stall()
        return response

    a.push(two_parts)
    raw = await gw.client(MASTER).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Breakfast, in order?"}], stream=True
    )
    conversation_id, turn_id = raw.headers["X-Conversation-Id"], raw.headers["X-Gateway-Turn-Id"]
    received: list[str] = []
    had_first, had_all = asyncio.Event(), asyncio.Event()

    async def read() -> None:
        async for part in raw.parse():
            if part.choices:
                received.append(part.choices[0].delta.content or "")
                if "".join(received) == "".join(first):
                    had_first.set()
                if "".join(received) == "".join(first + more):
                    had_all.set()

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(had_first.wait(), 10)
        await gw.gateway.store.flush()
        page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
        shots = Shots(page, tmp_path)
        await page.goto(f"{gw.url}/ui/#/conversations/{conversation_id}")
        live = page.get_by_test_id("live-answer")
        await expect(live).to_contain_text("".join(first))
        await checked(page, shots, f"48-live-answer-{width}")
        # The answer goes on: the box grows with what the client gets, the turn still open.
        a.release.set()
        await asyncio.wait_for(had_all.wait(), 10)
        await expect(live).to_contain_text("".join(first + more))
        assert turn_id in gw.gateway.cancels.by_turn
        async with page.expect_response(lambda r: r.url.endswith("/cancel")) as answer:
            await page.get_by_test_id("cancel-turn").click()
        assert (await answer.value).status == 200
        await expect(page.get_by_test_id("live-answer")).to_have_count(0)
        await expect(page.get_by_test_id("assistant-text")).to_have_text("".join(first + more))
        await checked(page, shots, f"49-live-answer-stopped-{width}")
        await page.context.close()
        await asyncio.wait_for(reader, 10)
    finally:
        reader.cancel()
    assert "".join(received) == "".join(first + more)


@pytest.mark.parametrize("width", [1440, 390])
async def test_the_list_refreshes_itself_once_asked(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, a, _b = scene
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    rows = page.locator("tr[data-conversation-id]")
    before = await rows.count()
    toggle = page.get_by_test_id("auto-refresh")
    await expect(toggle).not_to_be_checked()  # off until asked
    await toggle.check()
    await watch_for_loading(page)
    await ask(gw, a, "A new question")
    # Drawn again on its own, the toggle still on.
    await expect(rows).to_have_count(before + 1, timeout=15_000)
    await expect(page.get_by_test_id("auto-refresh")).to_be_checked()
    assert await page.evaluate("window.blinked") is False
    await checked(page, shots, f"50-auto-refresh-{width}")
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_the_usage_page_refreshes_itself_once_asked(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    """The Usage page's own toggle: its filters, scroll and focus kept, never blinking to
    "Loading…", on for the rest of the tab's session and for that page alone."""
    gw, a, _b = scene
    await ask(gw, a, "A first question")
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/usage?range=7d&group_by=deployment")
    requests = page.get_by_test_id("stat-requests")
    await expect(requests).to_contain_text("1 upstream attempt ")
    toggle = page.get_by_test_id("auto-refresh")
    await expect(toggle).not_to_be_checked()
    await toggle.check()
    await page.get_by_test_id("latency").scroll_into_view_if_needed()
    scrolled = await page.evaluate("window.scrollY")
    assert scrolled > 0
    await watch_for_loading(page)
    await ask(gw, a, "A second question")
    await expect(requests).to_contain_text("2 upstream attempts", timeout=15_000)
    assert await page.evaluate("window.blinked") is False
    assert await page.evaluate("window.scrollY") == scrolled
    await expect(page.get_by_test_id("usage-group-by")).to_have_value("deployment")
    await expect(page.locator('[data-testid=latency] tr[data-group="a"]')).to_be_visible()
    await expect(page.get_by_test_id("auto-refresh")).to_be_focused()
    await checked(page, shots, f"51-usage-auto-refresh-{width}")
    await page.reload()
    await expect(page.get_by_test_id("auto-refresh")).to_be_checked()
    await page.goto(f"{gw.url}/ui/#/conversations")  # the list keeps its own setting
    await expect(page.get_by_test_id("auto-refresh")).not_to_be_checked()
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_refresh_waits_while_a_field_has_the_keyboard(
    scene: Scene, browser: Any, width: int
) -> None:
    """A search being typed is not drawn away: the turn that comes while the box has the
    keyboard is skipped, and the next one, once it has not, draws the list again. The page's
    clock is Playwright's, moved on by the test."""
    gw, a, _b = scene
    await ask(gw, a, "A first question")
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows).to_have_count(1)
    await page.clock.install()
    drawn: list[str] = []  # each drawing of the list asks for the models first
    page.on("request", lambda r: drawn.append(r.url) if "/v1/models" in r.url else None)
    await page.get_by_test_id("auto-refresh").check()
    await ask(gw, a, "A second question")
    search = page.get_by_test_id("filter-q")
    await search.fill("half-typed")
    await page.clock.run_for(12_000)  # two turns, both while the box has the keyboard
    await expect(search).to_have_value("half-typed")
    await page.get_by_test_id("auto-refresh").focus()
    await page.clock.run_for(6_000)
    await expect(rows).to_have_count(2)
    assert len(drawn) == 1, drawn
    await expect(page.get_by_test_id("auto-refresh")).to_be_focused()
    await page.context.close()


# Headless Chromium keeps every page visible (no window to hide or tab to leave), so the test
# puts the document in the state a hidden tab's has: `hidden` and `visibilityState` as the
# browser reports them, and the event it fires. Deleting the own properties gives the real
# getters back.
HIDE = """() => {
    Object.defineProperty(document, 'hidden', { configurable: true, get: () => true });
    Object.defineProperty(document, 'visibilityState', { configurable: true, get: () => 'hidden' });
    document.dispatchEvent(new Event('visibilitychange'));
}"""
SHOW = """() => {
    delete document.hidden;
    delete document.visibilityState;
    document.dispatchEvent(new Event('visibilitychange'));
}"""
# A modal dialog over the list, as the UI opens one (in the top layer, from document.body).
OPEN_DIALOG = """() => {
    const dialog = document.createElement('dialog');
    dialog.dataset.testid = 'some-dialog';
    dialog.setAttribute('aria-label', 'Some dialog');
    dialog.append(Object.assign(document.createElement('button'), { textContent: 'Close' }));
    dialog.querySelector('button').addEventListener('click', () => dialog.close());
    document.body.append(dialog);
    dialog.showModal();
}"""


@pytest.mark.parametrize("width", [1440, 390])
@pytest.mark.parametrize("reason", ["hidden-tab", "open-dialog"])
async def test_a_refresh_waits_while_the_tab_is_hidden_or_a_dialog_open(
    scene: Scene, browser: Any, width: int, reason: str
) -> None:
    """The turns that come while nobody can see the list (the tab hidden) or while a dialog
    covers it are skipped; the next one after draws the list again. The page's clock is
    Playwright's, moved on by the test."""
    gw, a, _b = scene
    await ask(gw, a, "A first question")
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows).to_have_count(1)
    await page.clock.install()
    drawn: list[str] = []  # each drawing of the list asks for the models first
    page.on("request", lambda r: drawn.append(r.url) if "/v1/models" in r.url else None)
    await page.get_by_test_id("auto-refresh").check()
    await ask(gw, a, "A second question")
    if reason == "hidden-tab":
        await page.evaluate(HIDE)
        assert await page.evaluate("document.visibilityState") == "hidden"
    else:
        await page.evaluate(OPEN_DIALOG)
        await expect(page.get_by_test_id("some-dialog")).to_be_visible()
    await page.clock.run_for(12_000)  # two turns, both while nobody sees the list
    await expect(rows).to_have_count(1)
    if reason == "hidden-tab":
        await page.evaluate(SHOW)
        assert await page.evaluate("document.visibilityState") == "visible"
    else:
        await page.get_by_test_id("some-dialog").get_by_role("button", name="Close").click()
        await expect(page.get_by_test_id("some-dialog")).to_be_hidden()
    await page.clock.run_for(6_000)
    await expect(rows).to_have_count(2)
    assert len(drawn) == 1, drawn
    await page.context.close()


async def ask(gw: GatewayUnderTest, a: FakeUpstream, question: str) -> None:
    """One answered turn (by `a`), in the store."""
    a.push(completion("Fresh."))
    await gw.client(MASTER).chat.completions.create(
        model="m", messages=[{"role": "user", "content": question}]
    )
    await gw.gateway.store.flush()


async def watch_for_loading(page: Any) -> None:
    """`window.blinked` turns true if the page shows "Loading…" from now on."""
    await page.evaluate(
        """() => {
            window.blinked = false;
            new MutationObserver((records) => {
                for (const record of records) for (const node of record.addedNodes) {
                    const loading = node.nodeType === 1
                        && (node.matches('.loading') || node.querySelector('.loading'));
                    if (loading) window.blinked = true;
                }
            }).observe(document.getElementById('app'), { childList: true, subtree: true });
        }"""
    )
