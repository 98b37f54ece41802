"""POST /v1/messages: the Anthropic Messages API, so Anthropic SDK clients work too.

The request becomes an OpenAI chat body, takes the same path as a chat completion (limits,
conversation, routing to any provider, recording), and the answer is rendered back as Anthropic
events; from an Anthropic upstream its bytes are relayed unchanged.
"""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.anthropic_messages import ANTHROPIC_MESSAGES, parse_request
from gateway.http.auth import PRINCIPAL
from gateway.http.large_bodies import read_parsed
from gateway.http.middleware import REQUEST_ID
from gateway.pipeline.token_count import count_tokens as count
from gateway.pipeline.turn import TurnRequest, run_turn, shape_of
from gateway.providers.params import ANTHROPIC_HEADERS


async def messages(request: web.Request) -> web.StreamResponse:
    shape = shape_of(request)
    body, parsed = await read_parsed(request, lambda raw: parse_request(raw, shape))
    if asked := anthropic_headers(request):
        body[ANTHROPIC_HEADERS] = asked
    turn = TurnRequest(body, bool(parsed.stream), ANTHROPIC_MESSAGES, request[REQUEST_ID])
    return await run_turn(request.app[GATEWAY], request, request[PRINCIPAL], turn)


async def count_tokens(request: web.Request) -> web.Response:
    """POST /v1/messages/count_tokens (gateway.pipeline.token_count)."""
    raw = await request.read()
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    answer, headers = await count(gateway, principal, raw, anthropic_headers(request))
    return web.Response(body=answer, content_type="application/json", headers=headers)


def anthropic_headers(request: web.Request) -> dict[str, str]:
    """The client's `anthropic-version` and `anthropic-beta` (every value of it, joined), for
    an Anthropic deployment."""
    out = {}
    if version := request.headers.get("anthropic-version"):
        out["anthropic-version"] = version
    betas = request.headers.getall("anthropic-beta", ())
    if betas:
        out["anthropic-beta"] = ",".join(betas)
    return out
