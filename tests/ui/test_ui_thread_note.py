"""The admin UI links a conversation threading started apart (`conversation/note`,
`thread_ambiguous`) to the conversations its history matched, in headless Chromium."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gateway.storage.records import Conversation, NewEvent, TurnStart
from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream
from tests.ui.harness import VIEWPORTS, Shots, checked, expect, generated_id, signed_in

pytestmark = pytest.mark.timeout(90)


async def test_an_ambiguous_conversation_links_its_candidates(
    scene: tuple[GatewayUnderTest, FakeUpstream, FakeUpstream], browser: Any, tmp_path: Path
) -> None:
    gw, _a, _b = scene
    store = gw.gateway.store
    millis = 1_780_000_000_000
    alice, bob, apart = (generated_id("conv", millis, tail) for tail in ("a1", "b2", "c3"))
    for n, cid in enumerate((alice, bob, apart)):
        store.create_conversation(Conversation(cid, millis / 1000 + n))
        turn = f"turn_{n}"
        store.start_turn(TurnStart(turn, cid, millis / 1000 + n, {"model": "m"}))
        if cid == apart:
            note = {"note": "thread_ambiguous", "candidates": [bob, alice]}
            store.append(NewEvent(cid, turn, "conversation/note", note))
        store.append(NewEvent(cid, turn, "user/message", {"content": "Hi"}))
        store.append(NewEvent(cid, turn, "turn/end", {"status": "completed"}))
    await store.flush()

    page = await signed_in(browser, gw, viewport=VIEWPORTS[1440], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/conversations/{apart}")
    note = page.get_by_test_id("thread-ambiguous")
    await expect(note.locator("a")).to_have_count(2)
    links = [await a.get_attribute("href") for a in await note.locator("a").all()]
    assert [link.rsplit("/", 1)[-1] for link in links if link] == [bob, alice]
    await checked(page, shots, "thread-ambiguous-1440")
    await page.goto(f"{gw.url}/ui/#/conversations/{alice}")
    await expect(page.locator("h1.conv-title")).to_contain_text("Hi")
    await expect(page.get_by_test_id("thread-ambiguous")).to_have_count(0)
    await page.context.close()
