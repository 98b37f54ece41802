"""Health, model list, metrics."""

from __future__ import annotations

import asyncio
import os
import time

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from gateway import metrics as gateway_metrics
from gateway.context import GATEWAY
from gateway.errors import ServiceUnavailable
from gateway.http.auth import PRINCIPAL

_STARTED = int(time.time())


async def live(request: web.Request) -> web.Response:
    # Which process answered: with `--workers N` or replicas, a probe tells them apart.
    return web.json_response(
        {"status": "ok", "instance": request.app[GATEWAY].store.owner, "pid": os.getpid()}
    )


async def ready(request: web.Request) -> web.Response:
    """200 while the replica can serve, whatever the store does: during a store outage writes
    wait in the spool and keys are served from the cache (`"store": "spooling"`, or
    `"unavailable"` before anything needed writing), so taking every replica out of the load
    balancer would only turn a store outage into a full one. 503 while shutting down, and when
    the store's schema is one this code cannot use (it never will serve that store)."""
    gateway = request.app[GATEWAY]
    if gateway.state["shutting_down"]:
        raise ServiceUnavailable("The gateway is shutting down.")
    store = gateway.store
    if store.refused is not None:
        raise ServiceUnavailable(f"The conversation store cannot be used: {store.refused}")
    try:
        async with asyncio.timeout(2):
            await store.ping()
    except Exception as exc:
        state = "spooling" if store.spooling else "unavailable"
        body = {"status": "ok", "store": state, "detail": f"the store is not answering: {exc}"}
        return web.json_response(body)
    return web.json_response({"status": "ok", "store": "spooling" if store.spooling else "ok"})


def _model(model_id: str) -> dict[str, object]:
    return {"id": model_id, "object": "model", "created": _STARTED, "owned_by": "gateway"}


async def models(request: web.Request) -> web.Response:
    """The aliases the key may use, pattern aliases (`openai/*`) by their own name."""
    principal = request[PRINCIPAL]
    aliases = [a for a in request.app[GATEWAY].routes.aliases if principal.may_use(a)]
    return web.json_response({"object": "list", "data": [_model(a) for a in aliases]})


async def model(request: web.Request) -> web.Response:
    """GET /v1/models/{id}: the model, when an alias (or a pattern alias) serves it to this
    key; else 404 `model_not_found`, as for a completion asking for it."""
    model_id = request.match_info["id"]
    request.app[GATEWAY].routes.alias(model_id, request[PRINCIPAL])
    return web.json_response(_model(model_id))


async def metrics(request: web.Request) -> web.Response:
    response = web.Response(body=gateway_metrics.render())
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
