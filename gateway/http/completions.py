"""POST /v1/completions: OpenAI's legacy Completions API, recorded as a turn like a chat."""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.openai_completions import OPENAI_COMPLETIONS, parse_request
from gateway.http.auth import PRINCIPAL
from gateway.http.large_bodies import read_parsed
from gateway.http.middleware import REQUEST_ID
from gateway.pipeline.turn import TurnRequest, run_turn, shape_of
from gateway.providers.openai_completions import completions_view


async def completions(request: web.Request) -> web.StreamResponse:
    shape = shape_of(request)
    body, parsed = await read_parsed(request, lambda raw: parse_request(raw, shape))
    turn = TurnRequest(
        body,
        bool(parsed.stream),
        OPENAI_COMPLETIONS,
        request[REQUEST_ID],
        plan_view=completions_view,
    )
    return await run_turn(request.app[GATEWAY], request, request[PRINCIPAL], turn)
