"""The streaming relay (gateway.pipeline.stream) and the upstream connection it reads."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway import metrics
from tests.conftest import GatewayUnderTest
from tests.fakes import DONE, FAKE, USAGE, FakeUpstream, chunk

OPENED = "gateway_upstream_connections_opened_total"
STREAM = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def done_then_end_later(ended: asyncio.Event) -> object:
    """A whole answer up to `[DONE]`, then the body's end only once `release` is set: as a
    provider's last chunk often comes in a read of its own."""

    async def script(request: web.Request) -> web.StreamResponse:
        fake: FakeUpstream = request.app[FAKE]
        response = await fake.start_sse(request)
        await fake.write(response, chunk("Hello") + chunk(finish="stop", usage=USAGE) + DONE)
        await fake.release.wait()
        fake.release.clear()
        await response.write_eof()
        ended.set()
        return response

    return script


async def test_a_stream_whose_body_ends_after_its_done_keeps_its_upstream_connection(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    pool = gw.gateway.upstreams
    origin = {"origin": "http://" + upstream.url.split("//", 1)[1].split("/", 1)[0]}
    opened = metrics.REGISTRY.get_sample_value(OPENED, origin) or 0.0
    ended = asyncio.Event()
    upstream.push(done_then_end_later(ended))
    body, _ = await gw.post_stream(STREAM)  # the client has the whole answer and its end
    assert body.endswith(b"data: [DONE]\n\n")
    upstream.release.set()
    await asyncio.wait_for(ended.wait(), 5)
    async with asyncio.timeout(5):  # the body's end reaches the gateway: pooled
        while pool.idle_connections == 0:
            await asyncio.sleep(0.001)
    await gw.post_stream(STREAM)  # a captured stream
    ports = [r.transport.get_extra_info("peername")[1] for r in upstream.seen]  # type: ignore[union-attr]
    assert ports[0] == ports[1]  # one connection, kept alive
    assert metrics.REGISTRY.get_sample_value(OPENED, origin) == opened + 1
    assert not upstream.disconnected.is_set()
