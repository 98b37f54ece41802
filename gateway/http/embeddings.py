"""POST /v1/embeddings: routed by the same aliases, strategies and retries; not recorded."""

from __future__ import annotations

import asyncio

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.requests import parse_json_object
from gateway.errors import InvalidRequest, UpstreamError, UpstreamTimeout
from gateway.http.auth import PRINCIPAL
from gateway.routing.retry import RetryPlan


async def embeddings(request: web.Request) -> web.Response:
    body = parse_json_object(await request.read())
    if not isinstance(body.get("model"), str):
        raise InvalidRequest("Missing required parameter: 'model'.", param="model")
    inputs = body.get("input")
    if not (isinstance(inputs, str) or (isinstance(inputs, list) and inputs)):
        raise InvalidRequest("'input' must be a string or a non-empty array.", param="input")
    router = request.app[GATEWAY].routes
    alias = router.alias(body["model"], request[PRINCIPAL])
    plan = [d for d in router.plan(alias, body) if hasattr(d.provider, "embeddings")]
    if not plan:
        raise InvalidRequest(
            f"The model `{alias.name}` has no deployment that serves embeddings.", param="model"
        )
    retries = RetryPlan(alias, plan)
    while (deployment := await retries.next()) is not None:
        deployment.health.acquire()
        try:
            async with asyncio.timeout(deployment.config.timeouts.total_s):
                raw: bytes = await deployment.provider.embeddings(body)  # type: ignore[attr-defined]
        except TimeoutError:
            error: UpstreamError = UpstreamTimeout(
                "the embeddings request timed out", phase="total"
            )
            retries.failed(deployment, error)
            deployment.health.failed(error.label)
            continue
        except UpstreamError as exc:
            retries.failed(deployment, exc)
            if exc.retryable:
                deployment.health.failed(exc.label)
            continue
        finally:
            deployment.health.release()
        deployment.health.succeeded(None)
        return web.Response(
            body=raw,
            content_type="application/json",
            headers={
                "X-Gateway-Deployment": deployment.name,
                "X-Gateway-Attempts": str(retries.attempts),
            },
        )
    assert retries.last_error is not None
    retries.last_error.headers["X-Gateway-Attempts"] = str(retries.attempts)
    raise retries.last_error
