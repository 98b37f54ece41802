"""The Cancel button of a turn in the admin UI, in a real Chromium: it stops a request still in
flight, and the page shows the turn interrupted with what its client had received."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, chunk, frames
from tests.ui.harness import MASTER, VIEWPORTS, Shots, checked, expect, signed_in

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]


@pytest.mark.parametrize("width", [1440, 390])
async def test_cancel_stops_a_request_in_flight(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, a, _b = scene
    sent = ["One, ", "two, ", "three, "]
    a.push(frames(*(chunk(p) for p in sent), then="stall"))
    raw = await gw.client(MASTER).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Count slowly."}], stream=True
    )
    conversation_id = raw.headers["X-Conversation-Id"]
    received: list[str] = []
    finishes: list[str | None] = []
    all_sent = asyncio.Event()

    async def read() -> None:
        async for part in raw.parse():
            if part.choices:
                received.append(part.choices[0].delta.content or "")
                finishes.append(part.choices[0].finish_reason)
                if "".join(received) == "".join(sent):
                    all_sent.set()

    reader = asyncio.create_task(read())
    try:
        await asyncio.wait_for(all_sent.wait(), 10)  # the client has it all: the stream stalls
        await gw.gateway.store.flush()
        page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
        shots = Shots(page, tmp_path)
        await page.goto(f"{gw.url}/ui/#/conversations/{conversation_id}")
        await expect(page.get_by_test_id("live")).to_be_visible()
        turn = page.locator(".turn")
        await expect(turn.locator(".badge", has_text="in progress")).to_have_count(1)
        cancel = turn.get_by_test_id("cancel-turn")
        await expect(cancel).to_be_visible()
        await checked(page, shots, f"46-cancel-button-{width}")

        async with page.expect_response(lambda r: r.url.endswith("/cancel")) as answer:
            await cancel.click()
        assert (await answer.value).status == 200
        await expect(turn.locator("[data-status=interrupted]")).to_have_count(1)
        await expect(turn.get_by_test_id("stopped-marker")).to_be_visible()
        await expect(turn.get_by_test_id("assistant-text")).to_have_text("".join(sent))
        await expect(page.get_by_test_id("cancel-turn")).to_have_count(0)
        await expect(page.get_by_test_id("live")).to_have_count(0)
        await checked(page, shots, f"47-cancelled-{width}")
        await page.context.close()
        await asyncio.wait_for(reader, 10)
    finally:
        reader.cancel()
    # The client's stream ended after what it had, with the cancelled finish.
    assert "".join(received) == "".join(sent)
    assert finishes[-1] == "cancelled"
