"""The "API calls" page, in a real Chromium: the request log of the calls that are no
conversation turn (`GET /v1/requests`), made here with the openai SDK through the gateway: an
embedding, a priced image call and one the upstream failed. Each row shows its endpoint, alias
and deployment, status and error, what it was billed by, its cost and its team and key by name;
the filters live in the URL; "Load more" goes on from the API's cursor; a team key sees its own
team's calls only."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.http.openai_api import OpenAIAPI
from tests.ui.harness import MASTER, VIEWPORTS, Shots, call, checked, deployment, expect, signed_in

pytestmark = pytest.mark.timeout(90)
MakeServer = Callable[..., Awaitable[TestServer]]


async def calls_made(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, aiohttp_server: MakeServer
) -> tuple[GatewayUnderTest, dict[str, Any], str, dict[str, dict[str, Any]]]:
    """Team Search's key `bot` makes an embedding, two images ($0.022) and an image call the
    upstream answers 500; the master key one embedding. Returns the gateway, the key, another
    team's key and the calls by name, as the API lists them."""
    a = await make_upstream()
    images = await OpenAIAPI().start(aiohttp_server)
    gw = await make_gateway(
        models=[
            {"name": "m", "deployments": [deployment(a, "a")]},
            {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]},
            {
                "name": "img",
                "deployments": [images.deployment("gpt-image-1")],
                "retry": {"max_attempts": 1},
            },
        ],
        auth={"master_key": MASTER},
    )
    for team, name in (("search", "Search"), ("ads", "Ads")):
        code, body = await call(gw, "POST", "/v1/gateway/teams", {"name": name, "id": team})
        assert code == 201, body
    code, key = await call(gw, "POST", "/v1/gateway/keys", {"team_id": "search", "name": "bot"})
    assert code == 201, key
    code, other = await call(gw, "POST", "/v1/gateway/keys", {"team_id": "ads", "name": "ad"})
    assert code == 201, other

    client = gw.client(key["key"])
    await client.embeddings.create(model="demo", input=["hello world", "good morning to you"])
    await client.images.generate(
        model="img", prompt="a lighthouse", n=2, size="1024x1024", quality="low"
    )
    images.failures = [500]
    with pytest.raises(openai.InternalServerError):
        await client.images.generate(model="img", prompt="a storm")
    await gw.client(MASTER).embeddings.create(model="demo", input="from the operator")
    await gw.flush()
    code, listed = await call(gw, "GET", "/v1/requests")
    assert code == 200, listed
    master, failed, image, embedding = listed["data"]  # newest first
    assert (image["endpoint"], image["cost_usd"]) == ("images.generations", pytest.approx(0.022))
    assert (failed["status"], failed["error"]) == ("error", "upstream_error: fake failure 500")
    assert (embedding["key_id"], master["key_id"]) == (key["id"], None)
    calls = {"master": master, "failed": failed, "image": image, "embedding": embedding}
    return gw, key, other["key"], calls


def row(page: Any, made: dict[str, Any]) -> Any:
    return page.locator(f'tr[data-request-id="{made["id"]}"]')


@pytest.mark.parametrize("width", [1440, 390])
async def test_the_api_calls_page(
    make_gateway: MakeGateway,
    make_upstream: MakeUpstream,
    aiohttp_server: MakeServer,
    browser: Any,
    tmp_path: Path,
    width: int,
) -> None:
    gw, key, other_key, calls = await calls_made(make_gateway, make_upstream, aiohttp_server)
    tokens = calls["embedding"]["prompt_tokens"]
    assert tokens > 0

    # The master key: every team's calls, its own too, newest first.
    page = await signed_in(browser, gw, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    link = page.locator(".nav-link", has_text="API calls")
    await expect(page.locator(".nav-link")).to_have_text(
        ["Conversations", "API calls", "Usage", "Keys & teams", "Deployments"]
    )
    await link.click()
    await expect(page).to_have_url(re.compile(r"#/requests$"))
    await expect(link).to_have_attribute("aria-current", "page")
    await expect(page.locator("h1")).to_have_text("API calls")
    rows = page.locator("tr[data-request-id]")
    await expect(rows).to_have_count(4)
    ids = await rows.evaluate_all("rs => rs.map(r => r.dataset.requestId)")
    assert ids == [calls[n]["id"] for n in ("master", "failed", "image", "embedding")]

    image = row(page, calls["image"])
    await expect(image.locator("[data-col=endpoint]")).to_have_text("images.generations")
    await expect(image.locator("[data-col=model]")).to_have_text("img")
    await expect(image.locator("[data-col=deployment]")).to_have_text(
        f"{calls['image']['deployment']} · gpt-image-1"
    )
    await expect(image.locator("[data-status]")).to_have_text("completed")
    await expect(image.get_by_test_id("call-error")).to_have_count(0)
    await expect(image.locator("[data-col=units]")).to_have_text("2 images · 1024x1024 · low")
    await expect(image.locator("[data-col=cost]")).to_have_text("$0.022")
    await expect(image.locator("[data-col=latency]")).to_have_text(re.compile(r"^[\d.]+ m?s$"))
    await expect(image.locator("[data-col=team]")).to_have_text("Search")
    await expect(image.locator("[data-col=team]")).to_have_attribute("title", "search")
    await expect(image.locator("[data-col=key]")).to_have_text("bot")

    failed = row(page, calls["failed"])
    await expect(failed.locator("[data-status]")).to_have_text("error")
    await expect(failed.get_by_test_id("call-error")).to_have_text(
        "upstream_error: fake failure 500"
    )
    await expect(failed.locator("[data-col=units]")).to_have_text("—")

    embedding = row(page, calls["embedding"])
    await expect(embedding.locator("[data-col=endpoint]")).to_have_text("embeddings")
    await expect(embedding.locator("[data-col=units]")).to_have_text(
        f"{tokens:,} token{'' if tokens == 1 else 's'}"
    )
    if calls["embedding"]["cost_usd"] is None:  # the demo deployment has no price
        await expect(embedding.locator("[data-col=cost]")).to_have_text("unpriced")
    estimated = calls["embedding"]["usage_source"] == "estimated"
    await expect(embedding.get_by_test_id("estimated")).to_have_count(1 if estimated else 0)
    await expect(row(page, calls["master"]).locator("[data-col=key]")).to_have_text("master key")
    await expect(row(page, calls["master"]).locator("[data-col=team]")).to_have_text("none")
    await expect(page.get_by_test_id("calls-summary")).to_have_text("4 calls shown")
    await expect(page.get_by_test_id("load-more")).to_be_hidden()
    await checked(page, shots, f"60-api-calls-{width}")

    # The failed one alone: the filter goes in the URL, under the API's name.
    async with page.expect_request(lambda r: "/v1/requests?" in r.url) as made:
        await page.get_by_test_id("filter-status").select_option("error")
    assert "status=error" in (await made.value).url
    await expect(page).to_have_url(re.compile(r"status=error"))
    await expect(rows).to_have_count(1)
    await expect(rows.first).to_have_attribute("data-request-id", calls["failed"]["id"])
    await expect(page.get_by_test_id("filter-status")).to_have_value("error")
    await checked(page, shots, f"61-api-calls-errors-{width}")

    # A team with no call: the empty state, saying the filters found none.
    await page.goto(f"{gw.url}/ui/#/requests?team_id=ads")
    await expect(page.get_by_test_id("filter-team")).to_have_value("ads")
    await expect(page.get_by_text("No API call matches these filters.")).to_be_visible()

    # Two a page: "Load more" adds the next two below, from the API's cursor.
    await page.goto(f"{gw.url}/ui/#/requests?limit=2")
    await expect(rows).to_have_count(2)
    await expect(page.get_by_test_id("calls-summary")).to_have_text("2 calls shown, more to load")
    async with page.expect_request(lambda r: "after=" in r.url) as made:
        await page.get_by_test_id("load-more").click()
    assert "limit=2" in (await made.value).url
    await expect(rows).to_have_count(4)
    ids = await rows.evaluate_all("rs => rs.map(r => r.dataset.requestId)")
    assert ids == [calls[n]["id"] for n in ("master", "failed", "image", "embedding")]
    await expect(page.get_by_test_id("load-more")).to_be_hidden()
    await expect(page.get_by_test_id("calls-summary")).to_have_text("4 calls shown")
    await expect(page.locator(".table-wrap")).to_be_focused()  # where the button was
    await checked(page, shots, f"61b-api-calls-loaded-more-{width}")
    await page.context.close()

    # Its team's key: the team's three calls, its team and itself by name, no team filter.
    page = await signed_in(browser, gw, key["key"], viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.locator(".nav-link", has_text="API calls").click()
    await expect(page.locator(".page-header")).to_contain_text("Team Search's")
    rows = page.locator("tr[data-request-id]")
    await expect(rows).to_have_count(3)
    await expect(row(page, calls["master"])).to_have_count(0)
    await expect(row(page, calls["image"]).locator("[data-col=team]")).to_have_text("Search")
    await expect(row(page, calls["image"]).locator("[data-col=key]")).to_have_text("bot")
    await expect(row(page, calls["image"]).locator("[data-col=cost]")).to_have_text("$0.022")
    await expect(page.get_by_test_id("filter-team")).to_have_count(0)
    await checked(page, shots, f"62-api-calls-team-key-{width}")
    await page.context.close()

    # Another team's key: none of them.
    page = await signed_in(browser, gw, other_key, viewport=VIEWPORTS[width], bypass_csp=True)
    shots = Shots(page, tmp_path)
    await page.locator(".nav-link", has_text="API calls").click()
    await expect(page.get_by_text("No API calls yet")).to_be_visible()
    await expect(page.locator("tr[data-request-id]")).to_have_count(0)
    await checked(page, shots, f"63-api-calls-empty-{width}")
    await page.context.close()
