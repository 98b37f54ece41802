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
from gateway.http.middleware import REQUEST_ID
from gateway.pipeline.turn import TurnRequest, run_turn, shape_of


async def messages(request: web.Request) -> web.StreamResponse:
    body, parsed = parse_request(await request.read(), shape_of(request))
    turn = TurnRequest(body, bool(parsed.stream), ANTHROPIC_MESSAGES, request[REQUEST_ID])
    return await run_turn(request.app[GATEWAY], request, request[PRINCIPAL], turn)
