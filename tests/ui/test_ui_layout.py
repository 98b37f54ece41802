"""The list and usage tables, in a real Chromium: at desktop width no table scrolls sideways in
its panel, and at any width a model's name or a figure stays on one line (a long name cut,
whole in its title)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.conftest import MakeGateway, MakeUpstream
from tests.fakes import status
from tests.ui.harness import MASTER, VIEWPORTS, Shots, checked, deployment, expect, signed_in

pytestmark = pytest.mark.timeout(90)
ALIAS = "gpt-4o-mini-2024-07-18"
LONG = "Please summarise the quarterly infrastructure report for the platform team"
# The lines each one-line element takes: its text's line boxes, by their distinct bottoms.
LINES = """() => {
    const lines = (el) => {
        const range = document.createRange();
        range.selectNodeContents(el);
        // Boxes whose bottoms lie within a few pixels share a line (a swatch beside a name).
        const bottoms = [...range.getClientRects()].map((r) => r.bottom).sort((a, b) => a - b);
        return bottoms.filter((b, i) => i === 0 || b - bottoms[i - 1] > 6).length;
    };
    return {
        scrolling: [...document.querySelectorAll('.table-wrap')]
            .filter((w) => w.scrollWidth > w.clientWidth + 1).length,
        wrapped: [...document.querySelectorAll('.clip, .table td.num')]
            .filter((el) => lines(el) > 1).map((el) => el.textContent),
        // The usage tables' group names (a model's, a team's, a key's), each a line.
        groups: [...document.querySelectorAll('[data-page=usage] .table td:first-child')]
            .filter((el) => lines(el) > 1).map((el) => el.textContent),
    };
}"""


@pytest.mark.parametrize("width", [1440, 390])
async def test_tables_fit_their_panels_and_names_stay_on_one_line(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, browser: Any, tmp_path: Path, width: int
) -> None:
    a, b = await make_upstream(), await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": ALIAS,
                "deployments": [deployment(a, "a"), deployment(b, "b")],
                "retry": {"backoff_s": 0.01, "max_backoff_s": 0.05},
            }
        ],
        auth={"master_key": MASTER},
    )
    for n in range(3):  # each falls back from a to b: a failed attempt in every row
        a.push(status(503, {"error": {"message": "overloaded", "type": "server_error"}}))
        stream = await gw.client(MASTER).chat.completions.create(
            model=ALIAS, messages=[{"role": "user", "content": f"{LONG} {n}"}], stream=True
        )
        async for _ in stream:
            pass
    await gw.flush()
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    for view in ("conversations", "usage"):
        await page.goto(f"{gw.url}/ui/#/{view}")
        name = page.locator(".clip", has_text=ALIAS).first
        await expect(name).to_be_visible()
        await expect(name).to_have_attribute("title", ALIAS)  # whole, a hover away
        layout = await page.evaluate(LINES)
        assert (layout["wrapped"], layout["groups"]) == ([], []), view
        if width == 1440:  # on a phone a table scrolls sideways in its panel, by design
            assert layout["scrolling"] == 0, view
        if view == "conversations":  # the preview takes the room the other columns leave
            preview = page.locator(".conv-preview").first
            assert (await preview.bounding_box())["width"] > 100
        await checked(page, shots, f"51-layout-{view}-{width}")
    await page.context.close()
