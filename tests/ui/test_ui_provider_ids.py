"""The provider's own id for an answer in the admin UI, in a real Chromium: the request panel
shows it beside the id the client was sent, and the list's search finds the conversation by it,
for a chat client on an Anthropic deployment (`msg_…` behind `chatcmpl-…`) and on an
OpenAI-compatible one (one id, the same both ways)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream
from tests.http.test_provider_ids import MESSAGE_ID, Claude
from tests.ui.harness import MASTER, VIEWPORTS, Shots, checked, expect, signed_in

pytestmark = pytest.mark.timeout(90)
COMPLETION_ID = "chatcmpl-Dx0Xq5Xx9rHB2ehcHZCRDsnuymUXc"  # OpenAI's shape


class OpenAI(FakeUpstream):
    def chunk_object(self, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> Any:
        return {**super().chunk_object(delta, finish, **extra), "id": COMPLETION_ID}


@pytest.mark.parametrize("width", [1440, 390])
@pytest.mark.parametrize("upstream", ["anthropic", "openai"])
async def test_the_providers_id_is_shown_and_finds_the_conversation(
    make_gateway: MakeGateway,
    aiohttp_server: Any,
    browser: Any,
    tmp_path: Path,
    upstream: str,
    width: int,
) -> None:
    if upstream == "anthropic":
        fake: Any = await Claude().start(aiohttp_server)
    else:
        fake = await OpenAI().start(aiohttp_server)
    gw = await make_gateway(
        models=[{"name": "m", "deployments": [fake.deployment()]}], auth={"master_key": MASTER}
    )
    fake.text(["The capital", " is London."])
    raw = await gw.client(MASTER).chat.completions.with_raw_response.create(
        model="m", messages=[{"role": "user", "content": "Which capital?"}], stream=True
    )
    [sent] = {chunk.id async for chunk in raw.parse()}
    conversation_id = raw.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    provider_id = MESSAGE_ID if upstream == "anthropic" else COMPLETION_ID
    assert (sent == provider_id) is (upstream == "openai")

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.goto(f"{gw.url}/ui/#/conversations")
    box = page.locator("[data-page=conversations]").get_by_test_id("filter-q")
    await box.fill(provider_id)
    await box.press("Enter")
    await expect(page.get_by_test_id("list-summary")).to_contain_text("looked up by id")
    rows = page.locator("tr[data-conversation-id]")
    await expect(rows).to_have_count(1)
    await expect(rows).to_have_attribute("data-conversation-id", conversation_id)

    await rows.locator("a.conv-preview").click()
    panel = page.get_by_test_id("request-panel")
    await panel.locator("summary").click()
    await expect(panel.get_by_test_id("response-id")).to_have_text(sent)
    await expect(panel.get_by_test_id("upstream-id")).to_have_text(provider_id)
    if upstream == "openai":
        await expect(panel).to_contain_text("(the same)")
    await checked(page, shots, f"48-provider-id-{upstream}-{width}")
    await page.context.close()
