"""Operator endpoints under /v1/gateway/ (the master key only; see gateway.http.auth)."""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.requests import parse_json_object, validated
from gateway.metering.admin import Admin, KeyChanges, KeyRotation, NewKey, NewTeam, TeamChanges


def _admin(request: web.Request) -> Admin:
    gateway = request.app[GATEWAY]
    return Admin(gateway.keys, gateway.auth, gateway.routes.known)


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


async def create_team(request: web.Request) -> web.Response:
    body = validated(NewTeam, parse_json_object(await request.read()))
    team = await _admin(request).create_team(body)
    return web.json_response(team.to_api(), status=201)


async def list_teams(request: web.Request) -> web.Response:
    teams = await request.app[GATEWAY].keys.teams()
    return web.json_response({"object": "list", "data": [t.to_api() for t in teams]})


async def update_team(request: web.Request) -> web.Response:
    body = validated(TeamChanges, parse_json_object(await request.read()))
    team = await _admin(request).update_team(request.match_info["id"], body)
    return web.json_response(team.to_api())


async def create_key(request: web.Request) -> web.Response:
    body = validated(NewKey, parse_json_object(await request.read()))
    record, secret = await _admin(request).create_key(body)
    # The only time the secret is shown: the store keeps its hash.
    return web.json_response({**record.to_api(), "key": secret}, status=201)


async def list_keys(request: web.Request) -> web.Response:
    keys = await request.app[GATEWAY].keys.keys(request.query.get("team_id"))
    return web.json_response({"object": "list", "data": [k.to_api() for k in keys]})


async def get_key(request: web.Request) -> web.Response:
    record = await _admin(request).key(request.match_info["id"])
    return web.json_response(record.to_api())


async def update_key(request: web.Request) -> web.Response:
    body = validated(KeyChanges, parse_json_object(await request.read()))
    record = await _admin(request).update_key(request.match_info["id"], body)
    return web.json_response(record.to_api())


async def revoke_key(request: web.Request) -> web.Response:
    record = await _admin(request).revoke_key(request.match_info["id"])
    return web.json_response(record.to_api())


async def rotate_key(request: web.Request) -> web.Response:
    """A new key for this one's holder; the old one works `overlap_s` more (default 1 h)."""
    raw = await request.read()
    body = validated(KeyRotation, parse_json_object(raw) if raw.strip() else {})
    rotated = await _admin(request).rotate_key(request.match_info["id"], body.overlap_s)
    # The only time the new secret is shown: the store keeps its hash.
    return web.json_response(
        {**rotated.key.to_api(), "key": rotated.secret, "rotated_from": rotated.old.to_api()},
        status=201,
    )
