"""A conversation over time and latency by group, in a real Chromium: the Timeline tab puts each
turn and attempt on one time axis, in order, with its durations; the Usage page shows p50, p95
and p99 per group, and its chart hovers name keys; its exports are named for their range and
carry names, teams and a total."""

from __future__ import annotations

import csv
import io
import re
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.metering.usage import UsageRecord
from gateway.storage.records import Conversation, NewEvent, TurnStart
from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.ui.harness import VIEWPORTS, Shots, call, checked, expect, make_team, signed_in

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]
CID = "conv_timeline"
A = {"provider": "openai", "deployment": "a", "model": "a-model"}
B = {"provider": "openai", "deployment": "b", "model": "b-model"}


def usage(turn: str, attempt: int, route: dict[str, str], at: float, **extra: Any) -> UsageRecord:
    fields: dict[str, Any] = {
        "id": f"{turn}:{attempt}",
        "turn_id": turn,
        "conversation_id": CID,
        "team_id": "search",
        "key_id": extra.pop("key_id"),
        "user": None,
        "alias": "m",
        "deployment": route["deployment"],
        "provider": "openai",
        "model": route["model"],
        "created_at": at,
        "status": "completed",
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "completion_delivered": 20,
        "reasoning_tokens": 0,
        "cached_tokens": 0,
        "usage_source": "provider",
        "cost_usd": 0.002,
        "ttft_ms": None,
        "duration_ms": None,
    }
    return UsageRecord(**(fields | extra))


async def seed(gw: GatewayUnderTest, key_id: str) -> None:
    """Turn 1 at t0: `a` fails after 400 ms, `b` answers in 1.6 s with a tool call, the turn
    ends at +2.05 s; turn 2 at +5 s: `b` answers in 3 s, the turn ends at +8.1 s."""
    store = gw.gateway.store
    t0 = float(int(time.time()) - 600)
    store.create_conversation(Conversation(CID, t0, team_id="search", key_id=key_id))

    def add(turn: str, kind: str, at: float, payload: dict[str, Any]) -> None:
        store.append(NewEvent(CID, turn, kind, payload, created_at=t0 + at))

    owner = {"team_id": "search", "key_id": key_id}
    store.start_turn(TurnStart("tl1", CID, t0, {"model": "m"}, **owner))
    add("tl1", "user/message", 0, {"content": "Weather in Paris?"})
    failed = {"reason": "provider_error", "attempt": 1, "route": A, "stream": [], "usage": None}
    add("tl1", "assistant/attempt", 0.4, failed)
    add("tl1", "request/error", 0.4, {"attempt": 1, "route": A, "status": 529, "message": "busy"})
    tool = {"type": "tool_call", "id": "call_1", "name": "get_weather", "arguments": "{}"}
    answer = {"content": [{"type": "text", "text": "Checking."}, tool], "interrupted": False}
    add("tl1", "assistant/message", 2.0, {**answer, "route": B, "attempt": 2, "stream": []})
    add("tl1", "turn/end", 2.05, {"status": "completed", "reason": None})
    store.start_turn(TurnStart("tl2", CID, t0 + 5, {"model": "m"}, **owner))
    add("tl2", "user/message", 5, {"content": "And tomorrow?"})
    answer = {"content": [{"type": "text", "text": "Sunny."}], "interrupted": False}
    add("tl2", "assistant/message", 8.0, {**answer, "route": B, "attempt": 1, "stream": []})
    add("tl2", "turn/end", 8.1, {"status": "completed", "reason": None})
    for record in (
        usage(
            "tl1",
            1,
            A,
            t0 + 0.4,
            key_id=key_id,
            status="error",
            duration_ms=400.0,
            completion_tokens=0,
            completion_delivered=0,
            cost_usd=0.0,
        ),
        usage("tl1", 2, B, t0 + 2.0, key_id=key_id, ttft_ms=300.0, duration_ms=1600.0),
        usage(
            "tl2", 1, B, t0 + 8.0, key_id=key_id, ttft_ms=500.0, duration_ms=3000.0, cost_usd=0.004
        ),
    ):
        store.write("usage", record.row())
    await store.flush()


async def downloaded(page: Any, test_id: str) -> tuple[str, str]:
    async with page.expect_download() as info:
        await page.get_by_test_id(test_id).click()
    download = await info.value
    return download.suggested_filename, (await download.path()).read_text()


@pytest.mark.parametrize("width", [1440, 390])
async def test_timeline_percentiles_and_named_exports(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, _a, _b = scene
    await make_team(gw)
    code, key = await call(gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "bot"})
    assert code == 201, key
    await seed(gw, key["id"])

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    try:
        await page.goto(f"{gw.url}/ui/#/conversations/{CID}")
        await page.get_by_test_id("tab-timeline").click()
        timeline = page.get_by_test_id("session-timeline")
        await expect(timeline).to_be_visible()
        rows = timeline.locator("[data-testid=tl-turn], [data-testid=tl-attempt]")
        await expect(rows).to_have_count(5)
        # In time order, each where and as long as it was (ms from the first turn's start).
        got = [
            (
                await row.get_attribute("data-testid"),
                await row.get_attribute("data-deployment"),
                int(await row.get_attribute("data-start-ms") or -1),
                await row.get_by_test_id("tl-duration").inner_text(),
            )
            for row in await rows.all()
        ]
        assert got == [
            ("tl-turn", None, 0, "2.05 s"),
            ("tl-attempt", "a", 0, "400 ms"),
            ("tl-attempt", "b", 400, "1.60 s"),
            ("tl-turn", None, 5000, "3.10 s"),
            ("tl-attempt", "b", 5000, "3.00 s"),
        ]
        attempts = timeline.get_by_test_id("tl-attempt")
        await expect(attempts.nth(0)).to_have_attribute("data-outcome", "error")
        await expect(attempts.nth(1).get_by_test_id("tl-ttft")).to_have_text("TTFT 300 ms")
        await expect(attempts.nth(1).get_by_test_id("tl-tools")).to_contain_text("get_weather")
        await expect(attempts.nth(2).get_by_test_id("tl-cost")).to_have_text("$0.004")
        await expect(page.get_by_test_id("timeline-summary")).to_contain_text(
            "2 turns · 3 attempts over 8.10 s"
        )
        # The bars on one axis: placed and sized by their times.
        boxes = [await bar.bounding_box() for bar in await rows.locator(".tl-bar").all()]
        track = await timeline.locator(".tl-track").first.bounding_box()
        scale = track["width"] / 8100  # px per ms
        for box, (_, _, start, _) in zip(boxes, got, strict=True):
            assert box["x"] - track["x"] == pytest.approx(start * scale, abs=2)
        for box, ms in zip(boxes, [2050, 400, 1600, 3100, 3000], strict=True):
            assert box["width"] == pytest.approx(ms * scale, abs=2)
        await checked(page, shots, f"70-timeline-{width}")

        # Latency percentiles on the Usage page, by deployment.
        await page.goto(f"{gw.url}/ui/#/usage?range=24h&group_by=deployment")
        latency = page.get_by_test_id("latency")
        b = latency.locator('tr[data-group="b"]')
        await expect(b.locator("[data-col=ttft-p50]")).to_have_text("300 ms")
        await expect(b.locator("[data-col=ttft-p99]")).to_have_text("500 ms")
        await expect(b.locator("[data-col=duration-p50]")).to_have_text("1.60 s")
        await expect(b.locator("[data-col=duration-p95]")).to_have_text("3.00 s")
        a = latency.locator('tr[data-group="a"]')
        await expect(a.locator("[data-col=duration-p99]")).to_have_text("400 ms")
        await expect(a.locator("[data-col=ttft-p50]")).to_have_text("—")
        await checked(page, shots, f"71-usage-latency-{width}")

        # The report's CSV by key: the key's name and team, a total, the range in its name.
        await page.get_by_test_id("usage-group-by").select_option("key")
        await expect(latency.locator("th", has_text="Key")).to_be_visible()
        await expect(page.get_by_test_id("latency").locator("tr[data-group]")).to_contain_text(
            ["bot"]
        )
        # A bar's hover names its key too.
        bar = page.locator('svg.chart[data-chart="spend"] rect.bar').last
        await expect(bar.locator("title")).to_contain_text("bot (key_")
        name, text = await downloaded(page, "usage-csv")
        stamp = r"\d{4}-\d\d-\d\dT\d{4}Z"
        assert re.fullmatch(rf"usage-by-key-{stamp}_{stamp}\.csv", name), name
        table = list(csv.DictReader(io.StringIO(text)))
        *rows_by_hour, total = table
        assert {
            (r["group"], r["group_name"], r["team_id"], r["team_name"]) for r in rows_by_hour
        } == {(key["id"], "bot", "search", "Search")}
        assert (total["period_start"], total["requests"], total["attempts"]) == ("total", "2", "3")
        assert float(total["cost_usd"]) == pytest.approx(0.006)
        # Every request of the range, one by one, from its own button.
        name, text = await downloaded(page, "requests-csv")
        assert re.fullmatch(rf"usage-requests-{stamp}_{stamp}\.csv", name), name
        requests = list(csv.DictReader(io.StringIO(text)))
        assert [(r["id"], r["key_name"], r["team_name"]) for r in requests] == [
            ("tl1:1", "bot", "Search"),
            ("tl1:2", "bot", "Search"),
            ("tl2:1", "bot", "Search"),
        ]
    except BaseException:
        await page.screenshot(path=str(tmp_path / f"failure-{width}.png"), full_page=True)
        raise
    finally:
        await page.context.close()


async def seed_sessions(gw: GatewayUnderTest) -> float:
    """carol's two conversations and dave's one. conv_s1: a turn at t0 of 2 s, completed, and
    one at +10 s of 3 s, stopped; conv_s2: a turn at +5 s of 1 s that failed; conv_s3 (dave's)
    at +4 s."""
    store = gw.gateway.store
    t0 = float(int(time.time()) - 600)
    turns = [
        ("conv_s1", "s1a", "carol@acme.io", 0, 2, "completed"),
        ("conv_s1", "s1b", "carol@acme.io", 10, 13, "aborted"),
        ("conv_s2", "s2a", "carol@acme.io", 5, 6, "error"),
        ("conv_s3", "s3a", "dave@acme.io", 4, 5, "completed"),
    ]
    for cid in ("conv_s1", "conv_s2", "conv_s3"):
        first = min(start for c, _, _, start, _, _ in turns if c == cid)
        store.create_conversation(Conversation(cid, t0 + first))
    for cid, turn, user, start, end, status in turns:
        store.start_turn(TurnStart(turn, cid, t0 + start, {"model": "m", "user": user}))
        store.append(NewEvent(cid, turn, "user/message", {"content": f"Ask {turn}"}, t0 + start))
        store.append(NewEvent(cid, turn, "turn/end", {"status": status}, created_at=t0 + end))
    await store.flush()
    return t0


@pytest.mark.parametrize("width", [1440, 390])
async def test_a_users_conversations_on_one_time_axis(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, _a, _b = scene
    await seed_sessions(gw)
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    try:
        await page.get_by_test_id("filter-user").fill("carol")
        await page.get_by_test_id("filter-user").press("Enter")
        await expect(page.locator("tr[data-conversation-id]")).to_have_count(2)
        await page.get_by_test_id("list-view-timeline").click()
        await expect(page).to_have_url(re.compile(r"user=carol.*view=timeline|view=.*user=carol"))
        timeline = page.get_by_test_id("list-timeline")
        rows = timeline.get_by_test_id("tl-conversation")
        await expect(rows).to_have_count(2)
        # By their first turn, each turn where and as long as it was (ms from the first).
        got = [
            (
                await row.get_attribute("data-conversation-id"),
                [
                    (
                        await bar.get_attribute("data-status"),
                        int(await bar.get_attribute("data-start-ms") or -1),
                        int(await bar.get_attribute("data-duration-ms") or -1),
                    )
                    for bar in await row.get_by_test_id("tl-bar").all()
                ],
            )
            for row in await rows.all()
        ]
        assert got == [
            ("conv_s1", [("completed", 0, 2000), ("aborted", 10000, 3000)]),
            ("conv_s2", [("error", 5000, 1000)]),
        ]
        await expect(rows.nth(1).get_by_test_id("tl-offset")).to_have_text("+5.00 s")
        await expect(rows.nth(0).get_by_test_id("tl-turns")).to_have_text("2 turns over 13.0 s")
        await expect(page.get_by_test_id("list-timeline-summary")).to_contain_text(
            "2 conversations · 3 turns over 13.0 s"
        )
        # The bars on one axis: placed and sized by their times.
        track = await rows.first.locator(".tl-track").bounding_box()
        scale = track["width"] / 13000  # px per ms
        bars = [(row, bar) for row, (_, bars) in enumerate(got) for bar in bars]
        for (row, (_, start, ms)), box in zip(
            bars,
            [await bar.bounding_box() for bar in await timeline.locator(".tl-bar").all()],
            strict=True,
        ):
            assert box["x"] - track["x"] == pytest.approx(start * scale, abs=2), row
            assert box["width"] == pytest.approx(ms * scale, abs=2), row
        await checked(page, shots, f"72-list-timeline-{width}")
        # The way back to the table keeps the filter; a conversation opens from its row.
        await page.get_by_test_id("list-view-table").click()
        await expect(page.locator("tr[data-conversation-id]")).to_have_count(2)
        await expect(page.get_by_test_id("filter-user")).to_have_value("carol")
        await page.go_back()
        await timeline.get_by_role("link", name="Ask s2a").click()
        await expect(page).to_have_url(re.compile(r"#/conversations/conv_s2$"))
    except BaseException:
        await page.screenshot(path=str(tmp_path / f"failure-{width}.png"), full_page=True)
        raise
    finally:
        await page.context.close()
