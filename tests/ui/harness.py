"""The browser tests' helpers: Debian's Chromium driven by Playwright (the module skips without
either), signing in, screenshots of every page (kept under build/ui-screenshots/ for review) that
fail on any console error, the axe-core accessibility check, and the recorded conversations
several tests start from."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, chunk, frames, status

playwright_api = pytest.importorskip("playwright.async_api", reason="pip install playwright")
Page = playwright_api.Page
expect = playwright_api.expect

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip("needs Debian's chromium: apt-get install -y chromium", allow_module_level=True)

MASTER = "sk-ui-master-key-0123456789"
REVIEW_DIR = Path(__file__).resolve().parents[2] / "build" / "ui-screenshots"
QUESTION = "Which capital is on the Thames?"
FOLLOW_UP = "List three fruits, slowly."
TEXT = "The capital of the UK is London."  # the captured stream `b` replays
PIECES = ["1. Apples", " are red.\n", "2. Pears", " are green.\n", "3. Plums"]
BROWSER_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def deployment(fake: FakeUpstream, name: str) -> dict[str, Any]:
    return {
        "provider": "openai",
        "api_base": fake.url,
        "name": name,
        "model": f"{name}-model",
        "input_cost_per_mtok": 150.0,
        "output_cost_per_mtok": 600.0,
    }


async def call(
    gw: GatewayUnderTest, method: str, path: str, body: Any = None, key: str = MASTER
) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session:
        async with session.request(
            method, gw.url + path, json=body, headers={"Authorization": f"Bearer {key}"}
        ) as response:
            return response.status, await response.json()


class Shots:
    """Screenshots of every page, and the console errors each page logged."""

    def __init__(self, page: Page, directory: Path) -> None:
        self.page = page
        self.directory = directory
        self.errors: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda error: self.errors.append(f"pageerror: {error}"))

    def _console(self, message: Any) -> None:
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    async def take(self, name: str) -> None:
        # The whole page in one viewport as tall as it is, so the fixed sidebar spans it (a
        # full_page capture keeps fixed elements at the viewport's size and scroll position).
        viewport = self.page.viewport_size
        height = await self.page.evaluate("document.documentElement.scrollHeight")
        await self.page.set_viewport_size({"width": viewport["width"], "height": height})
        await self.page.screenshot(path=str(self.directory / f"{name}.png"))
        await self.page.set_viewport_size(viewport)
        REVIEW_DIR.mkdir(parents=True, exist_ok=True)  # kept for review, whichever test took it
        shutil.copy(self.directory / f"{name}.png", REVIEW_DIR)
        assert self.errors == [], f"console errors on {name}: {self.errors}"


async def signed_in(browser: Any, gw: GatewayUnderTest, key: str = MASTER, **context: Any) -> Any:
    """A page signed in with `key`, on the conversation list."""
    options = {"viewport": {"width": 1440, "height": 900}, **context}
    page = await (await browser.new_context(**options)).new_page()
    page.set_default_timeout(10_000)
    await page.goto(gw.url + "/ui/")
    await page.get_by_test_id("login-key").fill(key)
    await page.get_by_test_id("login-submit").click()
    await expect(page.locator("[data-page=conversations] [data-testid=filter-q]")).to_be_visible()
    return page


async def no_horizontal_overflow(page: Any) -> None:
    width = await page.evaluate("document.documentElement.scrollWidth")
    assert width <= 390, f"the page is {width} px wide at 390 px"


async def make_team(gw: GatewayUnderTest) -> None:
    code, body = await call(gw, "POST", "/v1/gateway/teams", {"name": "Search", "id": "search"})
    assert code == 201, body


def generated_id(prefix: str, millis: int, tail: str) -> str:
    return f"{prefix}_{millis:012x}{tail:0>20}"


AXE = Path(__file__).resolve().parent / "node_modules" / "axe-core" / "axe.min.js"


async def serious_violations(page: Any) -> list[str]:
    """axe-core's serious and critical findings on the page as it is now."""
    if not await page.evaluate("() => Boolean(window.axe)"):
        await page.add_script_tag(path=str(AXE))
    found = await page.evaluate(
        """async () => (await axe.run(document, {resultTypes: ['violations']})).violations
            .filter(v => v.impact === 'serious' || v.impact === 'critical')
            .map(v => `${v.id}: ${v.help} (${v.nodes.map(n => n.target.join(' ')).join(', ')})`)"""
    )
    return list(found)


VIEWPORTS = {1440: {"width": 1440, "height": 900}, 390: {"width": 390, "height": 844}}


async def checked(page: Any, shots: Shots, name: str) -> None:
    """The page as it is now: screenshotted with no console error, no serious accessibility
    finding, and nothing wider than a phone's screen at phone width."""
    await shots.take(name)
    if AXE.exists():
        assert await serious_violations(page) == [], name
    if page.viewport_size["width"] <= 390:
        await no_horizontal_overflow(page)


async def stream_all(gw: GatewayUnderTest, key: str, question: str) -> tuple[str, Any]:
    """A whole streamed answer (the fake upstreams replay a captured stream by default)."""
    response = await gw.client(key).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": question}], stream=True
    )
    parts = [c.choices[0].delta.content or "" async for c in response.parse() if c.choices]
    return "".join(parts), response.headers


async def interrupted_conversation(gw: GatewayUnderTest, a: FakeUpstream) -> tuple[str, str]:
    """Turn 1 falls back from `a` (500) to `b`; turn 2 is cut by its client mid-stream.
    Returns the conversation id and the delivered text the store recorded."""
    a.push(status(500, {"error": {"message": "upstream exploded", "type": "server_error"}}))
    client = gw.client(MASTER)
    text, headers = await stream_all(gw, MASTER, QUESTION)
    conversation_id = headers["X-Conversation-Id"]
    assert headers["X-Gateway-Deployment"] == "b"
    assert text == TEXT

    a.push(frames(*(chunk(p) for p in PIECES[:3]), then="stall"))
    history = [
        {"role": "user", "content": QUESTION},
        {"role": "assistant", "content": TEXT},
        {"role": "user", "content": FOLLOW_UP},
    ]
    second = await client.chat.completions.with_raw_response.create(
        model="m",
        messages=history,  # type: ignore[arg-type]
        stream=True,
        extra_headers={"X-Conversation-Id": conversation_id},
    )
    stream = second.parse()
    got = 0
    async for _ in stream:
        got += 1
        if got == 3:
            break
    await stream.close()
    events = await gw.wait_turn_end(conversation_id, count=2)
    message = [e for e in events if e["type"] == "assistant/message"][-1]["payload"]
    assert message["interrupted"] is True
    delivered = "".join(b["text"] for b in message["content"] if b["type"] == "text")
    assert delivered == "".join(PIECES[:3])
    return conversation_id, delivered
