"""The admin UI end to end, in a real headless Chromium driven by Playwright.

The gateway runs in-process on loopback with two fake upstreams: `a` fails or stalls on cue,
`b` answers. The browser logs in with the master key, reads a conversation with a fallback and
an interrupted turn in both views, makes a branch and continues it from the page, creates and
revokes a key, and sees usage charts with data; then a team key gets its read-only view. Each
test runs at desktop (1440 x 900) and phone (390 x 844) width, and every page is screenshotted
(under the test's tmp dir and build/ui-screenshots/), must log no console error, pass the
axe-core check and, at phone width, be no wider than the screen.
"""

from __future__ import annotations

import re
import shutil
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from gateway.metering.usage import UsageRecord
from gateway.storage.records import Conversation, NewEvent, TurnStart
from tests.conftest import GatewayUnderTest
from tests.fakes import DONE, USAGE, FakeUpstream, chunk, frames, status
from tests.ui.harness import (
    AXE,
    MASTER,
    QUESTION,
    REVIEW_DIR,
    TEXT,
    VIEWPORTS,
    Page,
    Shots,
    call,
    checked,
    expect,
    generated_id,
    interrupted_conversation,
    make_team,
    no_horizontal_overflow,
    playwright_api,
    serious_violations,
    signed_in,
    stream_all,
)

BRANCH_ANSWER = ["Branching ", "works ", "from the page."]
pytestmark = pytest.mark.timeout(90)


async def opened(browser: Any, width: int) -> Any:
    """A page not signed in yet, at `width`; its CSP bypassed for the accessibility check."""
    context = await browser.new_context(viewport=VIEWPORTS[width], bypass_csp=True)
    page = await context.new_page()
    page.set_default_timeout(10_000)
    return page


def provoked(shots: Shots, status: int) -> None:
    """Chromium logs every refused fetch as a console error: the one this test asked for is
    expected (and must be there); any other error still fails the screenshot."""
    logged = f"console: Failed to load resource: the server responded with a status of {status} "
    assert any(e.startswith(logged) for e in shots.errors), shots.errors
    shots.errors = [e for e in shots.errors if not e.startswith(logged)]


@pytest.mark.parametrize("width", [1440, 390])
async def test_the_admin_ui_end_to_end(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, a, _b = scene
    conversation_id, delivered = await interrupted_conversation(gw, a)
    # A team with a budget, and its key's own conversation, for the usage and read-only views.
    status_code, _ = await call(
        gw,
        "POST",
        "/v1/gateway/teams",
        {"name": "Search", "id": "search", "limits": {"budget": {"usd": 0.05, "mode": "soft"}}},
    )
    assert status_code == 201
    status_code, team_key = await call(
        gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "search-bot"}
    )
    assert status_code == 201
    _, headers = await stream_all(gw, team_key["key"], "A team question")
    team_conversation = headers["X-Conversation-Id"]
    await gw.wait_turn_end(team_conversation)

    shots_dir = tmp_path / "ui-screenshots"
    shots_dir.mkdir()
    page = await opened(browser, width)
    shots = Shots(page, shots_dir)
    try:
        await walk_through(
            gw, a, page, shots, conversation_id, delivered, team_key["key"], team_conversation
        )
    except BaseException:
        # What the page showed when it went wrong, for the report.
        await page.screenshot(path=str(shots_dir / f"failure-{width}.png"), full_page=True)
        print("console errors:", shots.errors)
        raise
    finally:
        await page.context.close()
        REVIEW_DIR.mkdir(parents=True, exist_ok=True)
        for shot in shots_dir.iterdir():
            shutil.copy(shot, REVIEW_DIR / shot.name)


async def walk_through(
    gw: GatewayUnderTest,
    a: FakeUpstream,
    page: Page,
    shots: Shots,
    conversation_id: str,
    delivered: str,
    team_secret: str,
    team_conversation: str,
) -> None:
    width = page.viewport_size["width"]

    # -- log in
    await page.goto(gw.url + "/ui")
    await expect(page.get_by_test_id("login-key")).to_be_visible()
    await checked(page, shots, f"01-login-{width}")
    await page.get_by_test_id("login-key").fill(MASTER)
    await page.get_by_test_id("login-submit").click()

    # -- the list
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows).to_have_count(2)
    row = page.locator(f'tr[data-conversation-id="{conversation_id}"]')
    await expect(row.locator("[data-status]")).to_have_text("interrupted")
    await expect(row).to_contain_text(QUESTION)
    await checked(page, shots, f"02-conversations-{width}")
    await page.get_by_test_id("filter-q").fill("team question")
    await page.get_by_test_id("filter-q").press("Enter")
    await expect(rows).to_have_count(1)
    await expect(page.locator(f'tr[data-conversation-id="{team_conversation}"]')).to_be_visible()
    await page.goto(gw.url + "/ui/#/conversations")

    # -- chat: the interrupted answer exactly as delivered, marked Stopped
    await page.locator(f'tr[data-conversation-id="{conversation_id}"] a.conv-preview').click()
    stopped = page.get_by_test_id("stopped-marker")
    await expect(stopped).to_be_visible()
    await expect(stopped).to_contain_text("Stopped")
    interrupted = page.locator(".msg-assistant.interrupted [data-testid=assistant-text]")
    assert await interrupted.text_content() == delivered
    await expect(page.get_by_test_id("assistant-text").first).to_have_text(TEXT)
    await checked(page, shots, f"03-chat-{width}")

    # -- trajectory: the failed attempt on `a`, then the fallback's success on `b`
    await page.get_by_test_id("tab-trajectory").click()
    failed = page.locator('[data-testid=attempt][data-outcome=error][data-deployment="a"]')
    await expect(failed).to_have_count(1)
    await expect(failed.get_by_test_id("attempt-error")).to_contain_text("500")
    await expect(failed.get_by_test_id("attempt-error")).to_contain_text("upstream exploded")
    fallback = page.locator('[data-testid=attempt][data-outcome=completed][data-deployment="b"]')
    await expect(fallback).to_have_count(1)
    await expect(fallback).to_contain_text("Time to first token")
    cut = page.locator("[data-testid=attempt][data-outcome=cancelled]")
    await cut.get_by_test_id("replay-button").click()
    await expect(cut.locator("[data-testid=replay][data-done=true]")).to_have_count(1)
    assert await cut.get_by_test_id("replay-text").text_content() == delivered
    await checked(page, shots, f"04-trajectory-{width}")

    # -- branch at the first (finished) turn, then continue the branch from the composer
    await page.get_by_test_id("tab-chat").click()
    await page.get_by_test_id("branch-here").first.click()
    await expect(page).not_to_have_url(re.compile(re.escape(conversation_id)))
    branch_id = page.url.rsplit("/", 1)[-1].split("?")[0]
    await expect(page.locator(".divider").first).to_contain_text("Inherited")
    await expect(page.get_by_test_id("stopped-marker")).to_have_count(0)  # cut before turn 2
    a.push(
        frames(
            *(chunk(p) for p in BRANCH_ANSWER),
            chunk(finish="stop"),
            chunk(no_choices=True, usage=USAGE),
            DONE,
        )
    )
    await page.get_by_test_id("composer-input").fill("Does branching work?")
    await page.get_by_test_id("composer-send").click()
    answer = page.locator(".turn:not(.inherited) [data-testid=assistant-text]")
    await expect(answer).to_have_text("".join(BRANCH_ANSWER))
    events = [e["type"] for e in await gw.wait_turn_end(branch_id)]
    assert events == ["user/message", "assistant/message", "turn/end"]
    assert [m["content"] for m in await gw_messages(gw, branch_id)] == [
        QUESTION,
        TEXT,
        "Does branching work?",
        "".join(BRANCH_ANSWER),
    ]
    await checked(page, shots, f"05-branch-{width}")
    await page.goto(f"{gw.url}/ui/#/conversations/{conversation_id}")
    await expect(page.locator(f'[data-branch-id="{branch_id}"]')).to_be_visible()

    # -- keys: create one (its secret shown once), then revoke it
    await page.locator(".nav-link", has_text="Keys").click()
    await page.get_by_test_id("key-name").fill("ui-made")
    await page.get_by_test_id("create-key").click()
    secret = await page.get_by_test_id("new-secret").text_content()
    assert secret is not None and secret.startswith("gw-")
    assert (await call(gw, "GET", "/v1/models", key=secret))[0] == 200
    made = page.locator("tr[data-key-id]", has_text="ui-made")
    await expect(made.get_by_test_id("key-state")).to_have_text("active")
    # Each key's prefix and id whole on one line, at either width (the table scrolls sideways).
    lines = await page.locator("tr[data-key-id] code").evaluate_all(LINES)
    assert lines and set(lines) == {1}, f"ids broken over {lines} lines"
    await checked(page, shots, f"06-keys-created-{width}")
    await made.get_by_test_id("revoke").click()
    await made.get_by_test_id("revoke-confirm").click()
    await expect(page.get_by_test_id("new-secret")).to_have_count(0)  # never shown again
    await expect(
        page.locator("tr[data-key-id]", has_text="ui-made").get_by_test_id("key-state")
    ).to_have_text("revoked")
    assert (await call(gw, "GET", "/v1/models", key=secret))[0] == 401
    # Limits and a budget for the team, from the page.
    team_row = page.locator('tr[data-team-id="search"]')
    await team_row.get_by_test_id("edit-limits").click()
    await team_row.locator("input[name=rpm]").fill("120")
    await team_row.locator("input[name=budget_usd]").fill("0.06")
    await team_row.locator("select[name=budget_mode]").select_option("soft")
    await team_row.get_by_role("button", name="Save limits").click()
    await expect(page.locator('tr[data-team-id="search"]')).to_contain_text("120 rpm")
    assert (await call(gw, "GET", "/v1/gateway/teams"))[1]["data"][0]["limits"] == {
        "rpm": 120,
        "budget": {"usd": 0.06, "period": "month", "mode": "soft"},
    }
    await checked(page, shots, f"07-keys-revoked-{width}")

    # -- usage: charts drawn from real data
    await page.locator(".nav-link", has_text="Usage").click()
    for chart in ("spend", "tokens"):
        bars = page.locator(f'svg.chart[data-chart="{chart}"] rect.bar')
        await expect(bars.first).to_be_visible()
        values = [float(v) for v in await bars.evaluate_all("rs => rs.map(r => r.dataset.value)")]
        assert values and all(v > 0 for v in values)
        heights = await bars.evaluate_all("rs => rs.map(r => r.getBBox().height)")
        assert all(height > 0 for height in heights)
        await legible_axes(page, chart)
    await expect(page.get_by_test_id("budget")).to_contain_text("of $0.06")
    await checked(page, shots, f"08-usage-{width}")
    async with page.expect_download() as download_info:
        await page.get_by_test_id("usage-csv").click()
    download = await download_info.value
    csv = (await download.path()).read_text()
    assert csv.startswith("period_start,group,group_name,team_id,team_name,requests")
    assert ",m," in csv and "\ntotal," in csv
    await page.get_by_test_id("usage-group-by").select_option("deployment")
    for name in ("a", "b"):
        bar = page.locator(f'svg.chart[data-chart="tokens"] rect.bar[data-group="{name}"]')
        await expect(bar).to_be_visible()
    await checked(page, shots, f"08-usage-by-deployment-{width}")

    # -- deployments
    await page.locator(".nav-link", has_text="Deployments").click()
    await expect(page.locator('tr[data-deployment="a"]')).to_contain_text("1 failed")
    await expect(page.locator('tr[data-deployment="b"] [data-status]')).to_have_text("healthy")
    await checked(page, shots, f"09-deployments-{width}")

    # -- a team key: its own team's conversations only, no admin sections
    await page.get_by_test_id("sign-out").click()
    await page.get_by_test_id("login-key").fill(team_secret)
    await page.get_by_test_id("login-submit").click()
    await expect(page.locator(f'tr[data-conversation-id="{team_conversation}"]')).to_be_visible()
    await expect(page.locator("tr[data-conversation-id]")).to_have_count(1)
    await expect(page.locator(".nav-link", has_text="Keys")).to_have_count(0)
    await expect(page.locator(".sidebar")).to_contain_text("read-only")
    await checked(page, shots, f"10-team-view-{width}")
    await page.locator(f'tr[data-conversation-id="{team_conversation}"] a.conv-preview').click()
    await expect(page.get_by_test_id("assistant-text")).to_have_text(TEXT)
    await expect(page.get_by_test_id("composer")).to_have_count(0)
    await expect(page.get_by_test_id("branch-here")).to_have_count(0)
    await checked(page, shots, f"11-team-conversation-{width}")


# The lines each element's text takes: its line boxes' tops, a new line where one is more than
# 4 px below the last (a glyph from a fallback font, such as the ellipsis, sits a pixel apart).
LINES = """els => els.map(el => {
    const range = document.createRange();
    range.selectNodeContents(el);
    const tops = [...range.getClientRects()].map(r => r.top).sort((a, b) => a - b);
    return tops.filter((top, i) => i === 0 || top - tops[i - 1] > 4).length;
})"""
LABEL_SIZES = """chart => [
    ...document.querySelectorAll(`svg.chart[data-chart="${chart}"] text.axis-label`)
].map(t => parseFloat(getComputedStyle(t).fontSize) * t.getScreenCTM().a)"""


async def legible_axes(page: Page, chart: str) -> None:
    """No axis label of the chart drawn smaller than 9 px on screen, at either width (drawn to a
    fixed width and scaled down, they were 5 px on a phone). Waits for the chart to be drawn at
    its shown width, which it is once laid out."""
    try:
        await page.wait_for_function(
            f"chart => {{ const sizes = ({LABEL_SIZES})(chart); "
            "return sizes.length > 0 && Math.min(...sizes) >= 9 }",
            arg=chart,
            timeout=5_000,
        )
    except playwright_api.TimeoutError:
        sizes = await page.evaluate(LABEL_SIZES, chart)
        raise AssertionError(f"{chart} axis labels drawn at {sorted(set(sizes))} px") from None


async def gw_messages(gw: GatewayUnderTest, conversation_id: str) -> list[dict[str, Any]]:
    code, body = await call(gw, "GET", f"/v1/conversations/{conversation_id}/messages")
    assert code == 200, body
    return body["data"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_wrong_key_is_refused_on_the_login_page(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, _a, _b = scene
    page = await opened(browser, width)
    shots = Shots(page, tmp_path)
    await page.goto(gw.url + "/ui/")
    await page.get_by_test_id("login-key").fill("sk-not-the-master-key")
    await page.get_by_test_id("login-submit").click()
    await expect(page.locator(".login-error")).to_contain_text("refused")
    await expect(page.get_by_test_id("login-key")).to_be_visible()
    provoked(shots, 401)
    await checked(page, shots, f"01b-login-refused-{width}")
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_chat_shows_reasoning_tools_and_failures(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    """Reasoning collapsed, tool calls and results (a synthetic one marked), an error turn."""
    gw, _a, _b = scene
    store = gw.gateway.store
    cid = "conv_tools"
    store.create_conversation(Conversation(cid, 1_780_000_000.0))
    route = {"provider": "openai", "deployment": "a", "model": "a-model"}

    def add(turn: str, kind: str, payload: dict[str, Any]) -> None:
        store.append(NewEvent(cid, turn, kind, payload))

    store.start_turn(TurnStart("t1", cid, 1_780_000_001.0, {"model": "m"}))
    add("t1", "user/message", {"content": "Weather in Paris and Rome?"})
    call_blocks = [
        {"type": "reasoning", "text": "Two cities: two calls."},
        {"type": "text", "text": "Checking both."},
        {"type": "tool_call", "id": "call_paris", "name": "weather", "arguments": '{"q":"Paris"}'},
        {"type": "tool_call", "id": "call_rome", "name": "weather", "arguments": '{"q":"Rome"}'},
    ]
    add(
        "t1",
        "assistant/message",
        {"content": call_blocks, "interrupted": False, "route": route, "attempt": 1, "stream": []},
    )
    add("t1", "turn/end", {"status": "completed", "reason": None})
    store.start_turn(TurnStart("t2", cid, 1_780_000_002.0, {"model": "m"}))
    add("t2", "tool/result", {"tool_call_id": "call_paris", "content": "18C", "synthetic": False})
    add("t2", "user/message", {"content": "And tomorrow?"})  # Rome's result never came
    add(
        "t2",
        "assistant/attempt",
        {"reason": "provider_error", "attempt": 1, "route": route, "stream": [], "usage": None},
    )
    add(
        "t2",
        "request/error",
        {
            "attempt": 1,
            "route": route,
            "status": 503,
            "code": "upstream_error",
            "message": "overloaded",
            "retryable": True,
        },
    )
    add("t2", "turn/end", {"status": "error", "reason": "provider_error"})
    await store.flush()

    # Signed in once the list shows: the login's own redirect to it would otherwise land after
    # the navigation below and take its place.
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/conversations/{cid}")
    reasoning = page.locator("details.reasoning")
    await expect(reasoning).to_have_count(1)
    await expect(reasoning.locator(".reasoning-text")).to_be_hidden()  # collapsed
    await reasoning.locator("summary").click()
    await expect(reasoning.locator(".reasoning-text")).to_have_text("Two cities: two calls.")
    await expect(page.locator(".tool-call")).to_have_count(2)
    await expect(page.locator(".msg-tool:not(.synthetic)")).to_contain_text("18C")
    synthetic = page.get_by_test_id("synthetic-result")
    await expect(synthetic).to_have_count(1)
    await expect(synthetic).to_contain_text("call_rome")
    await expect(page.locator(".msg-error")).to_contain_text("503 upstream_error: overloaded")
    await checked(page, shots, f"12-tools-and-errors-{width}")
    await page.context.close()


# -- issue 35: the defects found driving the UI day to day, and what it now shows ---------------


@pytest.mark.parametrize("width", [1440, 390])
async def test_deep_link_skip_link_keyboard_filters_and_limits_dialog(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, _a, _b = scene
    await make_team(gw)
    page = await opened(browser, width)
    shots = Shots(page, tmp_path)

    # Sign-in keeps the page that was opened.
    await page.goto(gw.url + "/ui/#/usage?range=7d")
    await page.get_by_test_id("login-key").fill(MASTER)
    await page.get_by_test_id("login-submit").click()
    await expect(page.locator("[data-page=usage]")).to_be_visible()
    assert page.url.endswith("#/usage?range=7d")

    # A skip link first in the tab order, to the main content.
    await page.goto(gw.url + "/ui/#/conversations")
    await expect(page.get_by_test_id("filter-status")).to_be_visible()
    await page.keyboard.press("Tab")
    await expect(page.get_by_test_id("skip-link")).to_be_focused()
    await page.keyboard.press("Enter")
    await expect(page.locator("main#main")).to_be_focused()
    assert page.url.endswith("#/conversations")

    # Arrowing through a filter select applies where it stops and keeps the focus there.
    status = page.get_by_test_id("filter-status")
    await status.focus()
    await page.keyboard.press("ArrowDown")
    await page.keyboard.press("ArrowDown")
    await expect(page).to_have_url(re.compile(r"status=interrupted"))
    await expect(page.get_by_test_id("filter-status")).to_be_focused()
    await expect(page.get_by_test_id("filter-status")).to_have_value("interrupted")
    assert "status=completed" not in page.url
    await checked(page, shots, f"13-keyboard-filters-{width}")

    # The Limits editor is not clipped by the table it opens from.
    await page.locator(".nav-link", has_text="Keys").click()
    await page.locator('tr[data-team-id="search"]').get_by_test_id("edit-limits").click()
    dialog = page.get_by_test_id("limits-dialog")
    await expect(dialog).to_be_visible()
    visible = await dialog.evaluate(
        """d => [...d.querySelectorAll('input, select, button')].every(el => {
            const r = el.getBoundingClientRect();
            const hit = document.elementFromPoint(r.x + r.width / 2, r.y + r.height / 2);
            return r.bottom <= innerHeight && (hit === el || el.contains(hit));
        })"""
    )
    assert visible, "part of the Limits editor is hidden"
    await checked(page, shots, f"14-limits-dialog-{width}")
    await page.keyboard.press("Escape")
    await expect(dialog).to_have_count(0)
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_errors_stop_the_spinner_and_say_what_failed(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, _a, _b = scene
    store = gw.gateway.store
    store.create_conversation(Conversation("conv_admin_only", 1_780_000_000.0))
    await store.flush()
    await make_team(gw)
    _, key = await call(gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "bot"})

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    for route, shown, name in (
        ("#/conversations/conv_no_such_one", "404", "24-error-not-found"),
        ("#/conversations?status=bogus", "400", "24b-error-bad-filter"),
    ):
        await page.goto(f"{gw.url}/ui/{route}")
        if shown == "404":  # a page of its own, naming the conversation as it was asked for
            found = page.get_by_test_id("not-found")
            await expect(found).to_contain_text("There is no conversation conv_no_such_one")
        else:
            await expect(page.get_by_test_id("api-error")).to_contain_text(shown)
        await expect(page.locator(".loading")).to_have_count(0)
        # Every read the page made has been answered (a view may make more than one, each
        # refused alike), so none is logged after the refusals are counted.
        await page.wait_for_load_state("networkidle")
        provoked(shots, int(shown))
        await checked(page, shots, f"{name}-{width}")
    team_page = await signed_in(browser, gw, key["key"], viewport=VIEWPORTS[width], bypass_csp=True)
    team_shots = Shots(team_page, tmp_path)
    await team_page.goto(f"{gw.url}/ui/#/conversations/conv_admin_only")
    await expect(team_page.get_by_test_id("not-found")).to_contain_text("conv_admin_only")
    assert "~" not in (await team_page.locator("main").text_content() or "")
    await expect(team_page.locator(".loading")).to_have_count(0)
    await team_page.wait_for_load_state("networkidle")
    provoked(team_shots, 404)  # another team's conversation: not found, as if it were not there
    await checked(team_page, team_shots, f"24c-error-not-the-teams-{width}")
    await team_page.context.close()
    await page.context.close()


# One width per page, not parametrized: it compares the desktop list with the phone's itself.
async def test_short_ids_and_phone_width(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream], browser: Any, tmp_path: Path
) -> None:
    gw, _a, _b = scene
    store = gw.gateway.store
    millis = 1_780_000_000_000
    long_title = "Please summarise " + " ".join(["the-quarterly-infrastructure-report"] * 12)
    ids = [generated_id("conv", millis, "aaaa1111"), generated_id("conv", millis, "bbbb2222")]
    for n, cid in enumerate(ids):
        store.create_conversation(Conversation(cid, millis / 1000 + n))
        store.start_turn(TurnStart(f"turn_{n}", cid, millis / 1000 + n, {"model": "m"}))
        store.append(NewEvent(cid, f"turn_{n}", "user/message", {"content": long_title}))
        store.append(NewEvent(cid, f"turn_{n}", "turn/end", {"status": "completed"}))
    await store.flush()

    page = await signed_in(browser, gw, viewport=VIEWPORTS[1440], bypass_csp=True)
    desk_shots = Shots(page, tmp_path)
    shown = [
        await page.locator(f'tr[data-conversation-id="{cid}"] code.id').first.text_content()
        for cid in ids
    ]
    assert shown[0] != shown[1], f"two ids look alike: {shown}"
    assert shown == ["conv_…aaaa1111", "conv_…bbbb2222"]
    await checked(page, desk_shots, "15-long-titles-1440")

    phone = await signed_in(browser, gw, viewport=VIEWPORTS[390], bypass_csp=True)
    shots = Shots(phone, tmp_path)
    await expect(phone.locator("tr[data-conversation-id]")).to_have_count(2)
    await checked(phone, shots, "15-long-titles-390")  # no horizontal overflow, among others
    await phone.goto(f"{gw.url}/ui/#/conversations/{ids[0]}")
    await expect(phone.locator("h1.conv-title")).to_contain_text("quarterly")
    await checked(phone, shots, "16-long-title-conversation-390")
    await phone.context.close()
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_chat_shows_delivered_failures_truncates_and_finished_inherited_turns(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, _a, _b = scene
    store = gw.gateway.store
    cid = "conv_delivered"
    route = {"provider": "openai", "deployment": "a", "model": "a-model"}
    store.create_conversation(Conversation(cid, 1_780_000_000.0))

    def add(turn: str, kind: str, payload: dict[str, Any]) -> None:
        store.append(NewEvent(cid, turn, kind, payload))

    store.start_turn(TurnStart("t1", cid, 1_780_000_001.0, {"model": "m"}))
    add("t1", "user/message", {"content": "Hi"})
    answer = {"content": [{"type": "text", "text": "Hello!"}], "interrupted": False}
    add("t1", "assistant/message", {**answer, "route": route, "attempt": 1, "stream": []})
    add("t1", "turn/end", {"status": "completed", "reason": None})
    store.start_turn(TurnStart("t2", cid, 1_780_000_002.0, {"model": "m"}))
    add("t2", "user/message", {"content": "Tell me a story"})
    delivered = {"content": [{"type": "text", "text": "Once upon a"}], "frames": 3}
    add(
        "t2",
        "assistant/attempt",
        {
            "reason": "provider_error",
            "attempt": 1,
            "route": route,
            "stream": [],
            "usage": None,
            "delivered": {**delivered, "delivery": "acked"},
        },
    )
    add("t2", "request/error", {"attempt": 1, "route": route, "status": 502, "message": "reset"})
    add("t2", "turn/end", {"status": "error", "reason": "provider_error"})
    store.start_turn(TurnStart("t3", cid, 1_780_000_003.0, {"model": "m"}))
    add("t3", "user/message", {"content": "Count to ten"})
    cut = {"content": [{"type": "text", "text": "one two three"}], "interrupted": True}
    add("t3", "assistant/message", {**cut, "delivery": "acked", "route": route, "attempt": 1})
    add("t3", "turn/end", {"status": "aborted", "reason": "client_disconnected"})
    await store.flush()
    events = (await call(gw, "GET", f"/v1/conversations/{cid}/events"))[1]["data"]
    cut_seq = [e["seq"] for e in events if e["type"] == "assistant/message"][-1]
    add("t3", "assistant/truncate", {"message_seq": cut_seq, "content_chars": 7})
    await store.flush()
    first_answer = next(e["seq"] for e in events if e["type"] == "assistant/message")
    code, branch = await call(
        gw, "POST", f"/v1/conversations/{cid}/branches", {"at_seq": first_answer}
    )
    assert code == 201, branch

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/conversations/{cid}")
    failed = page.get_by_test_id("delivered-attempt")
    await expect(failed.get_by_test_id("assistant-text")).to_have_text("Once upon a")
    await expect(failed.get_by_test_id("not-in-history")).to_contain_text("not in the model's")
    await expect(page.locator(".msg-error")).to_contain_text("502")
    truncated = page.locator(f'[data-seq="{cut_seq}"]')
    await expect(truncated.get_by_test_id("assistant-text")).to_have_text("one two")
    await expect(truncated.get_by_test_id("truncated-marker")).to_contain_text("7 characters")
    await expect(page.get_by_label("Message")).to_have_count(1)  # the composer's label
    await checked(page, shots, f"17-delivered-and-truncated-{width}")

    await page.goto(f"{gw.url}/ui/#/conversations/{branch['id']}")
    await expect(page.locator(".turn.inherited")).to_have_count(1)
    await expect(page.get_by_test_id("inherited-turn")).to_have_count(1)
    await expect(page.locator(".badge", has_text="in progress")).to_have_count(0)
    await page.get_by_test_id("tab-trajectory").click()
    await expect(page.get_by_test_id("trajectory")).to_be_visible()
    await expect(page.locator(".badge", has_text="in progress")).to_have_count(0)
    await checked(page, shots, f"18-branch-inside-a-turn-{width}")
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_usage_counts_names_presets_and_utc_days(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, a, _b = scene
    await make_team(gw)
    _, key = await call(gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "bot"})
    a.push(status(500, {"error": {"message": "upstream exploded", "type": "server_error"}}))
    _, headers = await stream_all(gw, key["key"], QUESTION)  # `a` fails, `b` answers
    await gw.wait_turn_end(headers["X-Conversation-Id"])

    # West of UTC, a UTC day starts on the browser's previous day.
    page = await signed_in(
        browser, gw, viewport=VIEWPORTS[width], bypass_csp=True, timezone_id="America/Los_Angeles"
    )
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/usage?range=7d")
    requests = page.get_by_test_id("stat-requests")
    await expect(requests).to_contain_text("2 upstream attempts")
    await expect(page.get_by_test_id("stat-failed-attempts")).to_contain_text("50.0%")
    await expect(page.get_by_test_id("stat-errors")).to_contain_text("0.0%")
    row = page.locator('tr[data-group="m"]')
    await expect(row.get_by_test_id("rate-failed-attempts")).to_have_text("1 (50.0%)")
    await expect(row.get_by_test_id("rate-errors")).to_have_text("0 (0.0%)")
    today = datetime.now(UTC).strftime("%m-%d")
    bar = page.locator('svg.chart[data-chart="tokens"] rect.bar').last
    await expect(bar.locator("title")).to_contain_text(today)
    await expect(page.locator(".panel-title", has_text="Tokens by model")).to_contain_text("UTC")
    await page.goto(f"{gw.url}/ui/#/conversations")  # times elsewhere: the browser's zone, named
    await expect(page.locator("th", has_text="Created")).to_have_text(
        re.compile("America/Los_Angeles")
    )
    await page.goto(f"{gw.url}/ui/#/usage?range=7d")
    await expect(page.locator('tr[data-group="m"]').get_by_test_id("rate-errors")).to_be_visible()
    await checked(page, shots, f"19-usage-counts-{width}")

    await page.get_by_test_id("usage-group-by").select_option("key")
    await expect(page.locator(".legend").first).to_contain_text("bot")
    await page.get_by_test_id("usage-group-by").select_option("team")
    await expect(page.locator(".legend").first).to_contain_text("Search (search)")
    await page.locator("select[name=range]").select_option("month")
    await expect(page).to_have_url(re.compile(r"range=month"))
    await expect(page.get_by_test_id("stat-requests")).to_contain_text("2 upstream attempts")
    await page.locator("select[name=range]").select_option("last-month")
    await expect(page).to_have_url(re.compile(r"range=last-month"))
    await expect(page.get_by_test_id("usage-totals")).to_contain_text("Last month (UTC)")
    await checked(page, shots, f"20-usage-last-month-{width}")

    # Each key's last use and spend this month.
    await page.locator(".nav-link", has_text="Keys").click()
    used = page.locator(f'tr[data-key-id="{key["id"]}"]')
    await expect(used.locator("[data-col=last-used]")).to_have_text("this hour")
    await expect(used.locator("[data-col=spend]")).to_have_text(re.compile(r"^\$0\.0*[1-9]"))
    await checked(page, shots, f"20b-keys-last-used-{width}")
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_turn_in_progress_is_followed_live(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, _a, _b = scene
    store = gw.gateway.store
    cid = "conv_live"
    store.create_conversation(Conversation(cid, 1_780_000_000.0))
    store.start_turn(TurnStart("t1", cid, 1_780_000_001.0, {"model": "m"}))
    store.append(NewEvent(cid, "t1", "user/message", {"content": "Are you there?"}))
    await store.flush()

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/conversations/{cid}")
    await expect(page.get_by_test_id("live")).to_be_visible()
    await expect(page.locator(".turn .badge", has_text="in progress")).to_have_count(1)
    await page.get_by_test_id("composer-input").fill("half-typed")
    route = {"provider": "openai", "deployment": "b", "model": "b-model"}
    answer = {"content": [{"type": "text", "text": "Yes."}], "interrupted": False}
    store.append(NewEvent(cid, "t1", "assistant/message", {**answer, "route": route}))
    store.append(NewEvent(cid, "t1", "turn/end", {"status": "completed", "reason": None}))
    await store.flush()
    await expect(page.get_by_test_id("assistant-text")).to_have_text("Yes.")
    await expect(page.locator(".turn [data-status=completed]")).to_have_count(1)
    await expect(page.get_by_test_id("live")).to_have_count(0)  # nothing left to follow
    await expect(page.get_by_test_id("composer-input")).to_have_value("half-typed")
    await checked(page, shots, f"22-live-{width}")
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_remember_on_this_device_until_sign_out(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, _a, _b = scene
    context = await browser.new_context(viewport=VIEWPORTS[width], bypass_csp=True)
    first = await context.new_page()
    first_shots = Shots(first, tmp_path)
    await first.goto(gw.url + "/ui/")
    await first.get_by_test_id("login-key").fill(MASTER)
    await first.get_by_test_id("login-remember").check()
    await first.get_by_test_id("login-submit").click()
    await expect(first.get_by_test_id("filter-q")).to_be_visible()
    await checked(first, first_shots, f"25-remembered-{width}")
    # Another tab (its own sessionStorage) on a deep link: signed in already, on that page.
    second = await context.new_page()
    second_shots = Shots(second, tmp_path)
    await second.goto(gw.url + "/ui/#/usage")
    await expect(second.locator("[data-page=usage]")).to_be_visible()
    await checked(second, second_shots, f"25b-remembered-deep-link-{width}")
    await second.get_by_test_id("sign-out").click()
    await expect(second.get_by_test_id("login-key")).to_be_visible()
    third = await context.new_page()
    third_shots = Shots(third, tmp_path)
    await third.goto(gw.url + "/ui/")
    await expect(third.get_by_test_id("login-key")).to_be_visible()  # forgotten
    await checked(third, third_shots, f"25c-forgotten-{width}")
    await context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_answers_render_as_markdown_and_json_is_pretty(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, _a, _b = scene
    store = gw.gateway.store
    cid = "conv_markdown"
    store.create_conversation(Conversation(cid, 1_780_000_000.0))
    route = {"provider": "openai", "deployment": "a", "model": "a-model"}
    text = (
        "## Plan\n\nUse **bold** and `code`, see [docs](https://example.com/x).\n\n"
        '- one\n- two\n\n```json\n{"a":1}\n```\n\n<img src=x onerror=alert(1)>'
    )
    store.start_turn(TurnStart("t1", cid, 1_780_000_001.0, {"model": "m"}))
    store.append(NewEvent(cid, "t1", "user/message", {"content": "Plan it"}))
    blocks = [
        {"type": "text", "text": text},
        {"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": '{"q":"x"}'},
    ]
    answer = {"content": blocks, "interrupted": False, "route": route}
    store.append(NewEvent(cid, "t1", "assistant/message", answer))
    store.append(NewEvent(cid, "t1", "turn/end", {"status": "completed", "reason": None}))
    store.start_turn(TurnStart("t2", cid, 1_780_000_002.0, {"model": "m"}))
    result = {"tool_call_id": "call_1", "content": '{"rows":[1,2],"long":"' + "z" * 3000 + '"}'}
    store.append(NewEvent(cid, "t2", "tool/result", result))
    store.append(NewEvent(cid, "t2", "turn/end", {"status": "completed", "reason": None}))
    await store.flush()

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/conversations/{cid}")
    rendered = page.get_by_test_id("assistant-text")
    await expect(rendered.locator("h4")).to_have_text("Plan")
    await expect(rendered.locator("strong")).to_have_text("bold")
    await expect(rendered.locator("li")).to_have_count(2)
    await expect(rendered.locator('a[href="https://example.com/x"]')).to_have_text("docs")
    await expect(rendered.locator("pre")).to_have_text('{\n  "a": 1\n}')
    await expect(rendered.locator("img")).to_have_count(0)  # shown as text, never as HTML
    await expect(rendered).to_contain_text("<img src=x onerror=alert(1)>")
    await page.get_by_role("button", name="Raw").click()
    await expect(page.get_by_test_id("assistant-raw")).to_have_text(text)
    tool = page.locator(".msg-tool pre.code")
    await expect(tool).to_contain_text('"rows": [\n    1,')
    await expect(tool).to_have_class(re.compile("folded"))
    await page.get_by_test_id("unfold").click()
    await expect(tool).not_to_have_class(re.compile("folded"))
    await checked(page, shots, f"23-markdown-{width}")
    await page.context.close()


# Already at both widths; it gathers every view's findings before failing, so keeps its own loop.
@pytest.mark.skipif(not AXE.exists(), reason="cd tests/ui && npm ci (axe-core)")
@pytest.mark.parametrize("width", [1440, 390])
async def test_every_view_passes_the_accessibility_check(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, a, _b = scene
    conversation_id, _ = await interrupted_conversation(gw, a)
    await make_team(gw)
    await call(gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "bot"})
    # The page's CSP allows no script but its own: the check is put in past it.
    context = await browser.new_context(viewport={"width": width, "height": 900}, bypass_csp=True)
    page = await context.new_page()
    page.set_default_timeout(10_000)
    await page.goto(gw.url + "/ui/")
    await expect(page.get_by_test_id("login-key")).to_be_visible()
    problems = {"login": await serious_violations(page)}
    await page.get_by_test_id("login-key").fill(MASTER)
    await page.get_by_test_id("login-submit").click()
    # Signed in only once the list shows: navigating sooner races the sign-in request.
    await expect(page.locator("[data-page=conversations] [data-testid=filter-q]")).to_be_visible()
    views = {
        "conversations": ("#/conversations", "tr[data-conversation-id]"),
        "chat": (f"#/conversations/{conversation_id}", "[data-testid=chat]"),
        "trajectory": (
            f"#/conversations/{conversation_id}?view=trajectory",
            "[data-testid=trajectory]",
        ),
        "usage": ("#/usage", "svg.chart"),
        "keys": ("#/keys", "tr[data-key-id]"),
        "deployments": ("#/deployments", "tr[data-deployment]"),
    }
    shots = Shots(page, tmp_path)
    for name, (route, ready) in views.items():
        await page.goto(f"{gw.url}/ui/{route}")
        await expect(page.locator(ready).first).to_be_visible()
        problems[name] = await serious_violations(page)
        await shots.take(f"30-{name}-{width}")
        if width == 390:
            await no_horizontal_overflow(page)
    await context.close()
    failing = [f"{view}: {finding}" for view, found in problems.items() for finding in found]
    assert not failing, "\n".join(failing)


@pytest.mark.parametrize("width", [1440, 390])
async def test_usage_groups_keep_their_colour_from_range_to_range(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream],
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    """Coloured by name, not by rank: `a` spends most over 30 days, `b` over the last day."""
    gw, _a, _b = scene
    now = datetime.now(UTC).timestamp()
    for n, (deployment, cost, when) in enumerate(
        [("a", 5.0, now - 20 * 86400), ("b", 0.5, now - 600), ("a", 0.1, now - 900)]
    ):
        record = UsageRecord(
            id=f"turn_{n}:1",
            turn_id=f"turn_{n}",
            conversation_id=f"conv_{n}",
            team_id=None,
            key_id=None,
            user=None,
            alias="m",
            deployment=deployment,
            provider="openai",
            model=f"{deployment}-model",
            created_at=when,
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
        )
        gw.gateway.store.write("usage", record.row())
    await gw.gateway.store.flush()

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    colours: dict[str, dict[str, str]] = {}
    for range_ in ("24h", "30d"):
        await page.goto(f"{gw.url}/ui/#/usage?group_by=deployment&range={range_}")
        legend = page.locator(".legend").first
        await expect(legend.locator(".legend-item")).to_have_count(2)
        colours[range_] = {}
        for name in ("a", "b"):
            item = legend.locator(".legend-item", has_text=re.compile(f"^{name}$"))
            colours[range_][name] = await item.locator(".swatch").evaluate(
                "s => s.style.background"
            )
        await checked(page, shots, f"26-usage-colours-{range_}-{width}")
    first = page.locator("tr[data-group]").first  # the rates table, by spend: `a` over 30 days
    await expect(first).to_have_attribute("data-group", "a")
    assert colours["24h"] == colours["30d"]
    assert colours["24h"]["a"] != colours["24h"]["b"]
    await page.context.close()
