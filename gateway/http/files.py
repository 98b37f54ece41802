"""`/v1/files` and `/v1/batches`, owned by the uploading key's team (gateway.pipeline.files)."""

from __future__ import annotations

from aiohttp import web

from gateway.context import GATEWAY
from gateway.dialects.requests import parse_json_object
from gateway.errors import InvalidRequest
from gateway.forms import read_form
from gateway.http.auth import PRINCIPAL
from gateway.pipeline import files
from gateway.pipeline.calls import end_user
from gateway.storage import objects
from gateway.storage.objects import BATCH, FILE


async def upload(request: web.Request) -> web.Response:
    gateway = request.app[GATEWAY]
    form = await read_form(request, int(gateway.config.server.max_upload_mb * 1024 * 1024))
    principal = request[PRINCIPAL]
    user = end_user(gateway, principal, None, request)
    raw, deployment = await files.upload(gateway, principal, form, user)
    return files.json_answer(raw, deployment)


async def list_files(request: web.Request) -> web.Response:
    return await _list(request, FILE)


async def list_batches(request: web.Request) -> web.Response:
    return await _list(request, BATCH)


async def _list(request: web.Request, kind: str) -> web.Response:
    query = request.query
    try:
        limit = int(query.get("limit", "20" if kind == BATCH else "100"))
    except ValueError:
        limit = 0
    if not 1 <= limit <= 10_000:
        raise InvalidRequest("'limit' must be a number from 1 to 10000.", param="limit")
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise InvalidRequest("'order' must be asc or desc.", param="order")
    principal = request[PRINCIPAL]
    items, more = await objects.listed(
        request.app[GATEWAY].store,
        kind,
        None if principal.is_admin else principal.team_id,
        limit=limit,
        after=query.get("after"),
        newest=kind == BATCH or order == "desc",
    )
    purpose = query.get("purpose")
    if purpose is not None:
        items = [i for i in items if i.object.get("purpose") == purpose]
    return web.json_response(files.listing(items, more))


async def retrieve_file(request: web.Request) -> web.Response:
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    return files.json_answer(
        await files.retrieve_file(gateway, principal, request.match_info["id"])
    )


async def file_content(request: web.Request) -> web.StreamResponse:
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    upstream = await files.file_content(gateway, principal, request.match_info["id"])
    content_type = upstream.headers.get("content-type") or "application/octet-stream"
    response = web.StreamResponse(headers={"Content-Type": content_type})
    try:
        await response.prepare(request)
        while chunk := await upstream.read():
            await response.write(chunk)
        await response.write_eof()
    finally:
        upstream.close()
    return response


async def delete_file(request: web.Request) -> web.Response:
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    user = end_user(gateway, principal, None, request)
    return files.json_answer(
        await files.delete_file(gateway, principal, request.match_info["id"], user)
    )


async def create_batch(request: web.Request) -> web.Response:
    body = parse_json_object(await request.read())
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    user = end_user(gateway, principal, None, request)
    return files.json_answer(await files.create_batch(gateway, principal, body, user))


async def retrieve_batch(request: web.Request) -> web.Response:
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    return files.json_answer(
        await files.retrieve_batch(gateway, principal, request.match_info["id"])
    )


async def cancel_batch(request: web.Request) -> web.Response:
    gateway, principal = request.app[GATEWAY], request[PRINCIPAL]
    user = end_user(gateway, principal, None, request)
    return files.json_answer(
        await files.cancel_batch(gateway, principal, request.match_info["id"], user)
    )
