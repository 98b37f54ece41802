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
from gateway.routing.model_cards import card
from gateway.routing.router import Alias

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


def _model(model_id: str, alias: Alias) -> dict[str, object]:
    return {
        "id": model_id,
        "object": "model",
        "created": _STARTED,
        "owned_by": "gateway",
        **card(alias.deployments),
    }


async def models(request: web.Request) -> web.Response:
    """The aliases the key may use, pattern aliases (`openai/*`) by their own name, each with
    what its deployments are known to take and cost (gateway.routing.model_cards)."""
    principal = request[PRINCIPAL]
    routes = request.app[GATEWAY].routes
    data = [
        _model(name, routes.alias(name)) if "*" not in name else _pattern(name)
        for name in routes.aliases
        if principal.may_use(name)
    ]
    return web.json_response({"object": "list", "data": data})


def _pattern(name: str) -> dict[str, object]:
    """A pattern alias serves many models: what each takes is on its own id's page."""
    return {"id": name, "object": "model", "created": _STARTED, "owned_by": "gateway"}


async def model(request: web.Request) -> web.Response:
    """GET /v1/models/{id}: the model, when an alias (or a pattern alias) serves it to this
    key; else 404 `model_not_found`, as for a completion asking for it."""
    model_id = request.match_info["id"]
    alias = request.app[GATEWAY].routes.alias(model_id, request[PRINCIPAL])
    return web.json_response(_model(model_id, alias))


async def metrics(request: web.Request) -> web.Response:
    response = web.Response(body=gateway_metrics.render())
    response.headers["Content-Type"] = CONTENT_TYPE_LATEST
    return response
