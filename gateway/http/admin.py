"""Operator endpoints (admin-only once keys exist)."""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY


async def deployments(request: web.Request) -> web.Response:
    """Every deployment with its live health: state, cooldown, in flight, latency, errors."""
    router = request.app[GATEWAY].routes
    data = [
        {
            "name": d.name,
            "alias": d.alias,
            "provider": d.provider_name,
            "model": d.upstream_model,
            "weight": d.config.weight,
            "priority": d.config.priority,
            "max_concurrency": d.config.max_concurrency,
            **d.health.snapshot(),
        }
        for d in router.deployments()
    ]
    return web.json_response({"object": "list", "data": data})
