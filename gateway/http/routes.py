"""The route table: paths, and the API dialect of the routes that speak another than OpenAI's."""

from __future__ import annotations

from importlib import import_module

from aiohttp import web
from aiohttp.typedefs import Handler

from gateway.context import ERROR_DIALECTS
from gateway.dialects.anthropic_messages import ANTHROPIC_MESSAGES
from gateway.dialects.base import Dialect
from gateway.http import (
    chat,
    completions,
    conversations,
    embeddings,
    files,
    media,
    messages,
    responses,
    system,
)
from gateway.http.large_bodies import laned

# The routes that take multipart uploads, within server.max_upload_mb rather than max_body_mb.
UPLOADS = frozenset(
    {
        "/v1/files",
        "/v1/images/edits",
        "/v1/images/variations",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
    }
)

# Operator routes (admin, the UI, the conversation list, usage reports, the OpenAPI document)
# import their modules on their first request: serving completions does not need them, and
# importing them is part of every cold start.
LAZY_MODULES = ("admin", "conversations_list", "openapi", "request_log", "ui", "usage")


def _later(module: str, name: str) -> Handler:
    handler: Handler | None = None

    async def handle(request: web.Request) -> web.StreamResponse:
        nonlocal handler
        if handler is None:
            handler = getattr(import_module(f"gateway.http.{module}"), name)
        return await handler(request)

    # What it stands for, for reprs and for the test that every such name exists.
    handle.__module__ = f"gateway.http.{module}"
    handle.__name__ = handle.__qualname__ = name
    return handle


class _Later:
    """`admin.create_team` in the table below, imported when first called."""

    def __init__(self, module: str) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Handler:
        return _later(self._module, name)


admin, conversations_list, openapi, request_log, ui, usage = (_Later(m) for m in LAZY_MODULES)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", laned(chat.chat_completions))
    app.router.add_post("/v1/chat/completions/{request_id}/cancel", chat.cancel)
    app.router.add_post("/v1/completions", laned(completions.completions))
    # Anthropic's Messages API: its clients get its errors' shape.
    anthropic: dict[web.AbstractRoute, Dialect] = {
        route: ANTHROPIC_MESSAGES
        for route in (
            app.router.add_post("/v1/messages", laned(messages.messages)),
            app.router.add_post("/v1/messages/count_tokens", messages.count_tokens),
        )
    }
    app[ERROR_DIALECTS] = anthropic
    app.router.add_post("/v1/responses", laned(responses.create))
    app.router.add_get("/v1/responses/{id}", responses.retrieve)
    app.router.add_delete("/v1/responses/{id}", responses.delete)
    app.router.add_get("/v1/responses/{id}/input_items", responses.input_items)
    app.router.add_post("/v1/responses/{id}/cancel", responses.cancel)
    app.router.add_post("/v1/embeddings", laned(embeddings.embeddings))
    app.router.add_post("/v1/images/generations", media.images_generations)
    app.router.add_post("/v1/images/edits", media.images_edits)
    app.router.add_post("/v1/images/variations", media.images_variations)
    app.router.add_post("/v1/audio/transcriptions", media.audio_transcriptions)
    app.router.add_post("/v1/audio/translations", media.audio_translations)
    app.router.add_post("/v1/audio/speech", media.audio_speech)
    app.router.add_post("/v1/moderations", media.moderations)
    app.router.add_post("/v1/rerank", media.rerank)
    app.router.add_post("/v1/files", files.upload)
    app.router.add_get("/v1/files", files.list_files)
    app.router.add_get("/v1/files/{id}", files.retrieve_file)
    app.router.add_get("/v1/files/{id}/content", files.file_content)
    app.router.add_delete("/v1/files/{id}", files.delete_file)
    app.router.add_post("/v1/batches", files.create_batch)
    app.router.add_get("/v1/batches", files.list_batches)
    app.router.add_get("/v1/batches/{id}", files.retrieve_batch)
    app.router.add_post("/v1/batches/{id}/cancel", files.cancel_batch)
    app.router.add_get("/v1/models", system.models)
    app.router.add_get("/v1/models/{id:.+}", system.model)
    app.router.add_get("/v1/me", ui.me)
    app.router.add_get("/v1/usage", usage.usage)
    app.router.add_get("/v1/usage/latency", usage.latency)
    app.router.add_get("/v1/usage/requests", usage.requests)
    app.router.add_get("/v1/requests", request_log.list_)
    app.router.add_post("/v1/conversations", conversations.create)
    app.router.add_get("/v1/conversations", conversations_list.list_)
    app.router.add_get("/v1/conversations/{id}", conversations.retrieve)
    app.router.add_post("/v1/conversations/{id}", conversations.update)
    app.router.add_delete("/v1/conversations/{id}", conversations.delete)
    app.router.add_get("/v1/conversations/{id}/items", conversations.list_items)
    app.router.add_post("/v1/conversations/{id}/items", conversations.add_items)
    app.router.add_get("/v1/conversations/{id}/events", conversations.events)
    app.router.add_get("/v1/conversations/{id}/messages", conversations.messages)
    app.router.add_post("/v1/conversations/{id}/branches", conversations.branch)
    app.router.add_post(
        "/v1/conversations/{id}/turns/{turn_id}/truncate", conversations.truncate_turn
    )
    app.router.add_post("/v1/conversations/{id}/turns/{turn_id}/cancel", conversations.cancel_turn)
    app.router.add_get("/v1/conversations/{id}/turns/{turn_id}/live", conversations.live_turn)
    app.router.add_get("/v1/conversations/{id}/usage", conversations_list.usage)
    app.router.add_get("/v1/gateway/deployments", admin.deployments)
    app.router.add_post("/v1/gateway/teams", admin.create_team)
    app.router.add_get("/v1/gateway/teams", admin.list_teams)
    app.router.add_patch("/v1/gateway/teams/{id}", admin.update_team)
    app.router.add_post("/v1/gateway/keys", admin.create_key)
    app.router.add_get("/v1/gateway/keys", admin.list_keys)
    app.router.add_get("/v1/gateway/keys/{id}", admin.get_key)
    app.router.add_patch("/v1/gateway/keys/{id}", admin.update_key)
    app.router.add_delete("/v1/gateway/keys/{id}", admin.revoke_key)
    app.router.add_post("/v1/gateway/keys/{id}/rotate", admin.rotate_key)
    app.router.add_get("/health/live", system.live)
    app.router.add_get("/health/ready", system.ready)
    app.router.add_get("/metrics", system.metrics)
    app.router.add_get("/openapi.json", openapi.openapi)
    app.router.add_get("/ui", ui.redirect)
    app.router.add_get("/ui/", ui.index)
    app.router.add_get("/ui/{file}", ui.asset)
