"""The reference: a bare aiohttp pass-through proxy with no features.

`python -m bench.passthrough --port P --upstream http://127.0.0.1:UP`. It is the floor the
gateway is compared against: the cost of aiohttp + one upstream hop and nothing else.
"""

from __future__ import annotations

import argparse
from collections.abc import AsyncIterator

import aiohttp
import uvloop
from aiohttp import web

SESSION = web.AppKey("session", aiohttp.ClientSession)
UPSTREAM = web.AppKey("upstream", str)


async def proxy(request: web.Request) -> web.StreamResponse:
    body = await request.read()
    headers = {"Content-Type": "application/json", "Authorization": "Bearer sk-bench"}
    url = request.app[UPSTREAM] + "/v1/chat/completions"
    async with request.app[SESSION].post(url, data=body, headers=headers) as upstream:
        response = web.StreamResponse(status=upstream.status)
        response.content_type = upstream.content_type
        await response.prepare(request)
        async for data in upstream.content.iter_any():
            await response.write(data)
        await response.write_eof()
        return response


async def session_ctx(app: web.Application) -> AsyncIterator[None]:
    # One pooled session, unlimited connections: same shape as the gateway's.
    app[SESSION] = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    yield
    await app[SESSION].close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True, help="e.g. http://127.0.0.1:9000")
    args = parser.parse_args()
    app = web.Application()
    app[UPSTREAM] = args.upstream.rstrip("/")
    app.cleanup_ctx.append(session_ctx)
    app.router.add_post("/v1/chat/completions", proxy)
    web.run_app(
        app,
        host=args.host,
        port=args.port,
        access_log=None,
        print=None,
        shutdown_timeout=1,
        loop=uvloop.new_event_loop(),
    )


if __name__ == "__main__":
    main()
