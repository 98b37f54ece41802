"""The conversation list as a request log, in a real Chromium: one search box that looks an id up
exactly and searches everything else as message text, sortable columns whose order the server
keeps from page to page, and the cost, duration, time-to-first-token, user and metadata
filters, all kept in the URL (so the breadcrumb back from a conversation keeps them too)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from gateway.metering.usage import UsageRecord
from gateway.storage.records import Conversation, NewEvent, TurnStart
from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.ui.harness import (
    FOLLOW_UP,
    MASTER,
    QUESTION,
    TEXT,
    VIEWPORTS,
    Shots,
    call,
    checked,
    expect,
    interrupted_conversation,
    signed_in,
    stream_all,
)

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]


async def shown(page: Any) -> list[str]:
    rows = page.locator("tr[data-conversation-id]")
    return list(await rows.evaluate_all("rs => rs.map(r => r.dataset.conversationId)"))


async def listing_call(page: Any, action: Any) -> dict[str, list[str]]:
    """The query of the list call the page makes on `action`."""
    async with page.expect_request(lambda r: "/v1/conversations?" in r.url) as made:
        await action()
    return parse_qs(urlsplit((await made.value).url).query)


@pytest.mark.parametrize("width", [1440, 390])
async def test_the_list_as_a_request_log(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    """Each row: cost, tokens, time to first token, duration, attempts; a conversation stopped
    at an earlier turn and one with a failed attempt are marked; the columns sort."""
    gw, a, _b = scene
    conversation_id, delivered = await interrupted_conversation(gw, a)
    history = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": TEXT},
        {"role": "user", "content": FOLLOW_UP},
        {"role": "assistant", "content": delivered},
        {"role": "user", "content": "Go on."},
    ]
    third = await gw.client(MASTER).chat.completions.create(
        model="m",
        messages=history,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"X-Conversation-Id": conversation_id},
    )
    async for _ in third:
        pass
    await gw.wait_turn_end(conversation_id, count=3)
    _, headers = await stream_all(gw, MASTER, "A plain question")
    plain = headers["X-Conversation-Id"]
    await gw.wait_turn_end(plain)

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    # The search box two filters wide: a phone's whole row, where one column clipped its hint.
    search = await page.get_by_test_id("filter-q").bounding_box()
    status = await page.get_by_test_id("filter-status").bounding_box()
    assert search and status and search["width"] > 2 * status["width"], (search, status)
    hint_fits = await page.get_by_test_id("filter-q").evaluate(
        """box => {
            const style = getComputedStyle(box);
            const context = document.createElement('canvas').getContext('2d');
            context.font = style.font;
            const padding = parseFloat(style.paddingLeft) + parseFloat(style.paddingRight);
            const room = box.clientWidth - padding;
            return context.measureText(box.placeholder).width <= room;
        }"""
    )
    assert hint_fits, "the search box's hint is cut"
    row = page.locator(f'tr[data-conversation-id="{conversation_id}"]')
    await expect(row.locator("[data-status]")).to_have_text("completed")  # its last turn
    await expect(row.get_by_test_id("had-stopped")).to_be_visible()
    await expect(row.get_by_test_id("had-failed")).to_have_text("1 failed attempt")
    await expect(row.locator("[data-col=attempts]")).to_have_text("4")
    await expect(row.locator("[data-col=cost]")).to_contain_text("$")
    await expect(row.locator("[data-col=ttft]")).to_contain_text("ms")
    await expect(row.locator("[data-col=duration]")).not_to_have_text("—")
    other = page.locator(f'tr[data-conversation-id="{plain}"]')
    await expect(other.locator("[data-col=attempts]")).to_have_text("1")
    await expect(other.get_by_test_id("had-failed")).to_have_count(0)
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows.first).to_have_attribute("data-conversation-id", plain)  # newest first
    sent = await listing_call(page, page.locator("button[data-sort=Attempts]").click)
    assert (sent["sort"], sent["order"]) == (["attempts"], ["desc"])
    await expect(page.locator("th[aria-sort=descending]")).to_have_text(re.compile("Attempts"))
    await expect(rows.first).to_have_attribute("data-conversation-id", conversation_id)
    await expect(page.locator("button[data-sort=Attempts]")).to_be_focused()
    await page.locator("button[data-sort=Attempts]").click()
    await expect(page).to_have_url(re.compile(r"sort=attempts&order=asc"))
    await expect(page.locator("th[aria-sort=ascending]")).to_have_text(re.compile("Attempts"))
    await expect(rows.first).to_have_attribute("data-conversation-id", plain)
    await checked(page, shots, f"21-request-log-{width}")

    # Stopped at an earlier turn: found by its own filter; the way back keeps the filters.
    await page.get_by_test_id("filter-stopped").check()
    await expect(page).to_have_url(re.compile(r"stopped=true"))
    await expect(rows).to_have_count(1)
    await expect(page.get_by_test_id("filter-stopped")).to_be_focused()
    await page.get_by_test_id("filter-failed").check()
    await expect(page).to_have_url(re.compile(r"failed=true"))
    await expect(rows).to_have_count(1)
    await row.locator("a.conv-preview").click()
    await expect(page.get_by_test_id("chat")).to_be_visible()
    await page.get_by_test_id("crumb-list").click()
    await expect(page).to_have_url(re.compile(r"stopped=true.*failed=true|failed=true.*stopped"))
    await expect(page).to_have_url(re.compile(r"sort=attempts"))  # and the sort
    await expect(rows).to_have_count(1)
    await expect(page.get_by_test_id("filter-stopped")).to_be_checked()
    await checked(page, shots, f"21b-request-log-filtered-{width}")
    await page.context.close()


@pytest.mark.parametrize("width", [1440, 390])
async def test_one_box_looks_ids_up_and_searches_the_text(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, a, _b = scene
    conversation_id, _ = await interrupted_conversation(gw, a)
    _, headers = await stream_all(gw, MASTER, "A plain question")
    plain, request_id = headers["X-Conversation-Id"], headers["X-Request-Id"]
    await gw.wait_turn_end(plain)
    code, events = await call(gw, "GET", f"/v1/conversations/{conversation_id}/events")
    assert code == 200, events
    second_turn = events["data"][-1]["turn_id"]
    response_id = ""
    async for event in await gw.client(MASTER).responses.create(
        model="m", input="Hi there", stream=True
    ):
        if event.type == "response.completed":
            response_id = event.response.id
    assert response_id.startswith("resp_")

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    box = page.get_by_test_id("filter-q")
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows).to_have_count(3)

    # Words of the second turn's question: found in the text of any message, not the first only.
    await box.fill("three fruits")
    sent = await listing_call(page, lambda: box.press("Enter"))
    assert sent["q"] == ["three fruits"] and "id" not in sent
    await expect(page.get_by_test_id("list-summary")).to_contain_text("messages' text")
    assert await shown(page) == [conversation_id]
    await checked(page, shots, f"40-search-text-{width}")

    # A turn's, a request's and a response's id: each looked up exactly.
    for value, found in (
        (second_turn, conversation_id),
        (request_id, plain),
        (response_id, None),
    ):
        await box.fill(value)
        sent = await listing_call(page, lambda: box.press("Enter"))
        assert sent["id"] == [value] and "q" not in sent
        await expect(page.get_by_test_id("list-summary")).to_contain_text("looked up by id")
        await expect(rows).to_have_count(1)
        if found is not None:
            assert await shown(page) == [found]
        else:
            assert (await shown(page))[0] not in (conversation_id, plain)
    await checked(page, shots, f"41-search-id-{width}")

    # The search stays in the URL: the way back from the conversation keeps it.
    await rows.first.locator("a.conv-preview").click()
    await expect(page.get_by_test_id("chat")).to_be_visible()
    await page.get_by_test_id("crumb-list").click()
    await expect(page.get_by_test_id("filter-q")).to_have_value(response_id)
    await expect(rows).to_have_count(1)
    await page.context.close()


T0 = time.time() - 3 * 3600
CHEAP, MID, DEAR = "conv_cheap", "conv_mid", "conv_dear"


def attempt(
    cid: str, n: int, cost: float, duration: float, ttft: float, tokens: int
) -> dict[str, Any]:
    return UsageRecord(
        id=f"{cid}-t:{n}",
        turn_id=f"{cid}-t",
        conversation_id=cid,
        team_id=None,
        key_id=None,
        user=None,
        alias="m",
        deployment="b",
        provider="openai",
        model="b-model",
        created_at=T0 + n,
        status="error" if cid == MID and n == 1 else "completed",
        prompt_tokens=tokens,
        completion_tokens=tokens // 2,
        completion_delivered=tokens // 2,
        reasoning_tokens=0,
        cached_tokens=0,
        usage_source="provider",
        cost_usd=cost,
        ttft_ms=ttft,
        duration_ms=duration,
    ).row()


async def three_requests(gw: GatewayUnderTest) -> None:
    """cheap: $0.001, 3 s, TTFT 50 ms, 15 tokens, 1 attempt, alice, tier=gold;
    mid: $0.01, 100 ms, TTFT 900 ms, 1,500 tokens, 2 attempts, bob, tier=free;
    dear: $0.6, 1.5 s, TTFT 300 ms, 225 tokens, 3 attempts, alice."""
    store = gw.gateway.store
    plans = {
        CHEAP: (1, 0.001, 3000.0, 50.0, 10, "alice", {"tier": "gold"}),
        MID: (2, 0.005, 50.0, 900.0, 500, "bob", {"tier": "free"}),
        DEAR: (3, 0.2, 500.0, 300.0, 50, "alice", None),
    }
    for n, (cid, (attempts, cost, duration, ttft, tokens, user, metadata)) in enumerate(
        plans.items()
    ):
        store.create_conversation(Conversation(cid, T0 + n, metadata=metadata))
        store.start_turn(TurnStart(f"{cid}-t", cid, T0 + n, {"model": "m", "user": user}))
        store.append(NewEvent(cid, f"{cid}-t", "user/message", {"content": f"Question {cid}"}))
        store.append(NewEvent(cid, f"{cid}-t", "turn/end", {"status": "completed"}))
        for number in range(1, attempts + 1):
            store.write("usage", attempt(cid, number, cost, duration, ttft, tokens))
    await store.flush()


@pytest.mark.parametrize("width", [1440, 390])
async def test_sorts_page_in_their_order_and_filter_by_range_user_and_metadata(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, _a, _b = scene
    await three_requests(gw)
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows).to_have_count(3)

    for label, descending in (
        ("Cost", [DEAR, MID, CHEAP]),
        ("Duration", [CHEAP, DEAR, MID]),
        ("TTFT", [MID, DEAR, CHEAP]),
        ("Tokens in / out / delivered", [MID, DEAR, CHEAP]),
        ("Attempts", [DEAR, MID, CHEAP]),
    ):
        await page.locator(f'button[data-sort="{label}"]').click()
        await expect(page.locator("th[aria-sort=descending]")).to_contain_text(label)
        assert await shown(page) == descending, label
    await page.locator('button[data-sort="Cost"]').click()
    await expect(page.locator("th[aria-sort=descending]")).to_contain_text("Cost")
    await page.locator('button[data-sort="Cost"]').click()
    await expect(page.locator("th[aria-sort=ascending]")).to_contain_text("Cost")
    assert await shown(page) == [CHEAP, MID, DEAR]
    await checked(page, shots, f"42-sorted-by-cost-{width}")

    # A page of two, then the next page: the cursor goes on in the same order.
    await page.goto(f"{gw.url}/ui/#/conversations?sort=cost&order=asc&limit=2")
    await expect(rows).to_have_count(2)
    assert await shown(page) == [CHEAP, MID]
    sent = await listing_call(page, page.get_by_test_id("next-page").click)
    assert sent["sort"] == ["cost"] and sent["order"] == ["asc"] and sent["after"]
    await expect(rows).to_have_count(1)
    assert await shown(page) == [DEAR]

    # The range filters, the user and metadata: in the URL under the API's names.
    await page.goto(f"{gw.url}/ui/#/conversations?sort=cost&order=desc")
    await expect(rows).to_have_count(3)
    more = page.get_by_test_id("more-filters")
    await more.locator("summary").click()
    await page.get_by_test_id("filter-min_cost").fill("0.005")
    max_ttft = page.get_by_test_id("filter-max_ttft_ms")
    await max_ttft.fill("500")
    sent = await listing_call(page, lambda: max_ttft.press("Enter"))
    assert sent["min_cost"] == ["0.005"] and sent["max_ttft_ms"] == ["500"]
    assert sent["sort"] == ["cost"]  # the sort stays
    await expect(rows).to_have_count(1)
    assert await shown(page) == [DEAR]
    await expect(page.get_by_test_id("more-filters")).to_have_attribute("open", "")
    await checked(page, shots, f"43-range-filters-{width}")

    await page.goto(f"{gw.url}/ui/#/conversations")
    await page.get_by_test_id("filter-user").fill("alice")
    await page.get_by_test_id("filter-user").press("Enter")
    await expect(page).to_have_url(re.compile(r"user=alice"))
    await expect(rows).to_have_count(2)
    assert sorted(await shown(page)) == sorted([CHEAP, DEAR])
    await page.get_by_test_id("more-filters").locator("summary").click()
    metadata = page.get_by_test_id("filter-metadata")
    await metadata.fill("tier")  # not a pair: the form says so and is not sent
    await metadata.press("Enter")
    assert await metadata.evaluate("input => input.validity.patternMismatch")
    assert "metadata" not in page.url
    await metadata.fill("tier=gold")
    sent = await listing_call(page, lambda: page.get_by_test_id("filter-metadata").press("Enter"))
    assert sent["metadata.tier"] == ["gold"] and sent["user"] == ["alice"]
    await expect(page).to_have_url(re.compile(r"metadata\.tier=gold"))
    await expect(rows).to_have_count(1)
    assert await shown(page) == [CHEAP]

    # The way back from the conversation keeps every filter.
    await rows.first.locator("a.conv-preview").click()
    await expect(page.get_by_test_id("chat")).to_be_visible()
    await page.get_by_test_id("crumb-list").click()
    await expect(page.get_by_test_id("filter-metadata")).to_have_value("tier=gold")
    await expect(page.get_by_test_id("filter-user")).to_have_value("alice")
    await expect(rows).to_have_count(1)
    await checked(page, shots, f"44-user-and-metadata-{width}")
    await page.context.close()
