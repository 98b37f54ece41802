"""POST /v1/embeddings: the request checked, then admitted, routed and metered like a completion
(not recorded as a conversation)."""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.requests import parse_json_object
from gateway.errors import InvalidRequest
from gateway.http.auth import PRINCIPAL
from gateway.http.large_bodies import read_parsed
from gateway.pipeline.embeddings import run_embeddings


def _token(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _same(inputs: list[object]) -> bool:
    """OpenAI's input forms: strings, token ids, or arrays of token ids, one form a request."""
    return (
        all(isinstance(i, str) for i in inputs)
        or all(_token(i) for i in inputs)
        or all(isinstance(i, list) and i and all(_token(t) for t in i) for i in inputs)
    )


async def embeddings(request: web.Request) -> web.Response:
    body = await read_parsed(request, parse_json_object)
    if not isinstance(body.get("model"), str):
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    inputs = body.get("input")
    if not (isinstance(inputs, str) or (isinstance(inputs, list) and inputs and _same(inputs))):
        raise InvalidRequest(
            "'input' must be a string, or a non-empty array of strings, of token ids, or of"
            " arrays of token ids.",
            param="input",
        )
    if body.get("user") is not None and not isinstance(body["user"], str):
        raise InvalidRequest("Invalid value for 'user': expected a string.", param="user")
    if body.get("encoding_format") not in (None, "float", "base64"):
        raise InvalidRequest(
            "Invalid value for 'encoding_format': expected 'float' or 'base64'.",
            param="encoding_format",
        )
    dimensions = body.get("dimensions")
    if dimensions is not None and (
        not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1
    ):
        raise InvalidRequest(
            "Invalid value for 'dimensions': expected a positive integer.", param="dimensions"
        )
    raw, headers = await run_embeddings(request.app[GATEWAY], request[PRINCIPAL], body, request)
    return web.Response(body=raw, content_type="application/json", headers=headers)
