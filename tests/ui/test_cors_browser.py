"""A browser app on another origin (a dev server on its own port) calls the gateway: with its
origin in `server.cors_origins`, Chromium's preflight passes and the page reads a streamed answer
chunk by chunk; from an origin not listed, the browser refuses to hand it the answer."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import MakeGateway
from tests.ui.harness import MASTER

PAGE = "<!doctype html><title>app</title><p>an app on its own origin</p>"

# The page's own code: a streamed chat completion read with the Fetch API, as a browser app does.
READ_STREAM = """async ([url, key]) => {
  try {
    const response = await fetch(url + '/v1/chat/completions', {
      method: 'POST',
      headers: {'Authorization': 'Bearer ' + key, 'Content-Type': 'application/json'},
      body: JSON.stringify({model: 'demo', stream: true,
                            messages: [{role: 'user', content: 'hi'}]}),
    });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let text = '', reads = 0;
    for (;;) {
      const {done, value} = await reader.read();
      if (done) break;
      reads += 1;
      text += decoder.decode(value, {stream: true});
    }
    return {status: response.status, reads, text,
            conversation: response.headers.get('X-Conversation-Id')};
  } catch (error) {
    return {error: String(error)};
  }
}"""


async def app_origin(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> str:
    app = web.Application()
    app.router.add_get("/", lambda _: web.Response(text=PAGE, content_type="text/html"))
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


async def test_a_listed_origin_streams_and_another_is_refused(
    make_gateway: MakeGateway,
    aiohttp_server: Callable[..., Awaitable[TestServer]],
    browser: Any,
) -> None:
    listed, unlisted = await app_origin(aiohttp_server), await app_origin(aiohttp_server)
    gw = await make_gateway(auth={"master_key": MASTER}, server={"cors_origins": [listed]})
    page = await browser.new_page()
    await page.goto(listed + "/")
    seen = await page.evaluate(READ_STREAM, [gw.url, MASTER])
    assert seen.get("status") == 200, seen
    assert seen["text"].endswith("data: [DONE]\n\n")
    assert '"content"' in seen["text"]
    assert seen["conversation"].startswith("conv_")  # an exposed header, readable by the page
    await page.goto(unlisted + "/")
    refused = await page.evaluate(READ_STREAM, [gw.url, MASTER])
    assert "error" in refused and "Failed to fetch" in refused["error"], refused
    await page.close()
