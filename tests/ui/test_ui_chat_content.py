"""What was sent and answered, as it looked, in the admin UI's Chat view, in a real Chromium: the
images a user sent as thumbnails that open full size (a remote one loaded only when asked), audio
and files as labelled attachments, an answer's markdown table, task list and underlined links,
and a fallback said where the answer is."""

from __future__ import annotations

import base64
import struct
import zlib
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import GatewayUnderTest
from tests.fakes import FakeUpstream, chunk, frames, status
from tests.ui.harness import MASTER, VIEWPORTS, Shots, checked, expect, signed_in

pytestmark = pytest.mark.timeout(90)
Scene = tuple[GatewayUnderTest, FakeUpstream, FakeUpstream]

ANSWER = (
    "Here is the comparison:\n\n"
    "| Model | Latency | Cost |\n"
    "| :--- | ---: | :---: |\n"
    "| claude-haiku | 420 ms | $0.25 |\n"
    "| gpt-4o | 610 ms | $2.50 |\n\n"
    "- [x] compare latency\n"
    "- [ ] compare quality\n\n"
    "See [the pricing page](https://example.com/pricing) for more."
)
REMOTE = "https://images.example.invalid/cat.png"


def png(width: int, height: int) -> bytes:
    """A grey PNG of that size."""

    def part(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    rows = b"".join(b"\x00" + b"\x80" * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + part(b"IHDR", header)
        + part(b"IDAT", zlib.compress(rows))
        + part(b"IEND", b"")
    )


@pytest.mark.parametrize("width", [1440, 390])
async def test_the_chat_shows_what_was_sent_and_answered_as_it_looked(
    scene: Scene, browser: Any, tmp_path: Path, width: int
) -> None:
    gw, a, b = scene
    image = png(40, 30)
    data_url = "data:image/png;base64," + base64.b64encode(image).decode()
    a.push(status(529, {"error": {"message": "overloaded", "type": "overloaded_error"}}))
    pieces = [ANSWER[:60], ANSWER[60:]]
    b.push(frames(*(chunk(p) for p in pieces), chunk(finish="stop"), b"data: [DONE]\n\n"))
    raw = await gw.client(MASTER).chat.completions.with_raw_response.create(
        model="m",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is in these, and what does it say?"},
                    {"type": "image_url", "image_url": {"url": data_url, "detail": "low"}},
                    {"type": "image_url", "image_url": {"url": REMOTE, "detail": "high"}},
                    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                    {
                        "type": "file",
                        "file": {
                            "filename": "report.pdf",
                            "file_data": "data:application/pdf;base64,JVBERi0xLjQK",
                        },
                    },
                ],
            }
        ],  # type: ignore[list-item]
        stream=True,
    )
    async for _ in raw.parse():
        pass
    conversation_id = raw.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)

    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    remote_requests: list[str] = []
    page.on(
        "request", lambda r: remote_requests.append(r.url) if "example.invalid" in r.url else None
    )
    await page.goto(f"{gw.url}/ui/#/conversations/{conversation_id}")
    user = page.locator(".msg-user")
    await expect(user).to_contain_text("What is in these, and what does it say?")
    await expect(user).not_to_contain_text("[image_url]")

    # The data URL image: a thumbnail, with its type, size, pixels and detail.
    [inline, remote] = await user.get_by_test_id("image-attachment").all()
    thumb = inline.get_by_test_id("image-thumb")
    await expect(thumb).to_be_visible()
    facts = inline.get_by_test_id("image-facts")
    await expect(facts).to_have_text(f"PNG · {len(image)} B · 40\u00d730 · detail: low")
    assert await thumb.evaluate("(img) => img.complete && img.naturalWidth") == 40
    await thumb.click()
    full = page.get_by_test_id("image-full")
    await expect(full).to_be_visible()
    assert await full.locator("img").evaluate("(img) => img.naturalHeight") == 30
    await expect(full).to_contain_text("detail: low")
    await page.keyboard.press("Escape")
    await expect(full).to_have_count(0)

    # The remote one: named, linked, and not loaded until asked.
    await expect(remote.get_by_test_id("image-facts")).to_have_text(
        "images.example.invalid · detail: high"
    )
    await expect(remote.get_by_role("link", name="open full size")).to_have_attribute(
        "href", REMOTE
    )
    await expect(remote.get_by_test_id("load-remote-image")).to_be_visible()
    assert remote_requests == []

    # Audio and files, labelled.
    await expect(user.get_by_test_id("audio-attachment")).to_contain_text("wav")
    await expect(user.get_by_test_id("file-attachment")).to_contain_text("report.pdf")
    await expect(user.get_by_test_id("file-attachment")).to_contain_text("application/pdf")

    # The answer's markdown: a table, a task list, an underlined link.
    answer = page.get_by_test_id("assistant-text")
    table = answer.get_by_test_id("md-table")
    await expect(table.locator("th")).to_have_text(["Model", "Latency", "Cost"])
    await expect(table.locator("tbody tr")).to_have_count(2)
    await expect(table.locator("tbody tr").first.locator("td")).to_have_text(
        ["claude-haiku", "420 ms", "$0.25"]
    )
    assert await table.locator("td").nth(1).evaluate("(td) => getComputedStyle(td).textAlign") == (
        "right"
    )
    boxes = answer.locator("li input[type=checkbox]")
    await expect(boxes).to_have_count(2)
    await expect(boxes.first).to_be_checked()
    await expect(boxes.nth(1)).not_to_be_checked()
    link = answer.get_by_role("link", name="the pricing page")
    await expect(link).to_have_attribute("href", "https://example.com/pricing")
    decoration = await link.evaluate("(a) => getComputedStyle(a).textDecorationLine")
    assert "underline" in decoration

    # The fallback, said where the answer is, with the way to each attempt.
    note = page.get_by_test_id("fallback-note")
    await expect(note).to_contain_text("a failed with 529; answered by b.")
    await expect(note.get_by_role("link")).to_have_attribute(
        "href", f"#/conversations/{conversation_id}?view=trajectory"
    )
    await checked(page, shots, f"48-chat-content-{width}")
    await note.get_by_role("link").click()
    await expect(page.get_by_test_id("tab-trajectory")).to_have_attribute("aria-selected", "true")
    await page.context.close()
