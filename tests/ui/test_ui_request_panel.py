"""The request a turn was made with, folded under it in the admin UI, in a real Chromium: the
endpoint and dialect, request and response ids, deployment, system prompt, parameters and tools
offered."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, status
from tests.ui.harness import MASTER, TEXT, VIEWPORTS, Shots, checked, expect, signed_in

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]

SYSTEM = "You answer in one sentence."
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup_capital",
            "description": "The capital of a country.",
            "parameters": {"type": "object", "properties": {"country": {"type": "string"}}},
        },
    }
]


@pytest.mark.parametrize("width", [1440, 390])
async def test_each_turn_shows_its_request(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, a, _b = scene
    a.push(status(500, {"error": {"message": "upstream exploded", "type": "server_error"}}))
    raw = await gw.client(MASTER).chat.completions.with_raw_response.create(
        model="m",
        messages=[
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": "Which capital is on the Thames?"},
        ],
        tools=TOOLS,  # type: ignore[arg-type]
        temperature=0.25,
        user="alice",
        stream=True,
    )
    answer_ids = {chunk.id async for chunk in raw.parse()}
    conversation_id, request_id = raw.headers["X-Conversation-Id"], raw.headers["X-Request-Id"]
    await gw.wait_turn_end(conversation_id)

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/conversations/{conversation_id}")
    await expect(page.get_by_test_id("assistant-text")).to_have_text(TEXT)
    panel = page.locator(".turn").get_by_test_id("request-panel")
    await expect(panel).to_have_count(1)
    await expect(panel.get_by_test_id("request-params")).to_be_hidden()  # folded
    await expect(panel.locator("summary")).to_contain_text("POST /v1/chat/completions")
    await panel.locator("summary").click()
    await expect(panel.get_by_test_id("request-id")).to_have_text(request_id)
    [answer_id] = answer_ids  # the chat completion's id, as the SDK saw it
    await expect(panel.get_by_test_id("response-id")).to_have_text(answer_id)
    await expect(panel.get_by_test_id("request-dialect")).to_have_text("openai.chat")
    await expect(panel.get_by_test_id("request-deployment")).to_have_text("a → b")  # a fell back
    await expect(panel.get_by_test_id("request-system")).to_contain_text(SYSTEM)
    await expect(panel).to_contain_text("alice")
    params = await panel.get_by_test_id("request-params").text_content()
    assert params is not None and '\n  "temperature": 0.25' in params  # pretty-printed
    assert json.loads(params)["stream"] is True and "tools" not in json.loads(params)
    tools = await panel.get_by_test_id("request-tools").text_content()
    assert tools is not None and json.loads(tools) == TOOLS and '\n    "type": "function"' in tools
    await expect(panel.get_by_test_id("request-tool-names")).to_have_text("lookup_capital")
    headers = panel.get_by_test_id("request-headers")  # the ones that say who called
    await expect(headers).to_contain_text("user-agent")
    await expect(headers).to_contain_text("AsyncOpenAI/Python")
    await expect(headers).not_to_contain_text(MASTER)
    await checked(page, shots, f"45-request-panel-{width}")

    # The upstream's answer id (OpenAI's, letters and digits) finds the conversation in the list.
    assert answer_id.startswith("chatcmpl-") and not re.fullmatch(r"chatcmpl-[0-9a-f]+", answer_id)
    await page.goto(f"{gw.url}/ui/#/conversations")
    box = page.locator("[data-page=conversations]").get_by_test_id("filter-q")
    await box.fill(answer_id)
    await box.press("Enter")
    await expect(page.get_by_test_id("list-summary")).to_contain_text("looked up by id")
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows).to_have_count(1)
    await expect(rows).to_have_attribute("data-conversation-id", conversation_id)
    await page.context.close()
