"""The route table: paths only."""

from __future__ import annotations

from aiohttp import web

from gateway.http import (
    admin,
    chat,
    conversations,
    conversations_list,
    embeddings,
    messages,
    openapi,
    responses,
    system,
    ui,
    usage,
)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/chat/completions", chat.chat_completions)
    app.router.add_post("/v1/chat/completions/{request_id}/cancel", chat.cancel)
    app.router.add_post("/v1/messages", messages.messages)
    app.router.add_post("/v1/responses", responses.create)
    app.router.add_get("/v1/responses/{id}", responses.retrieve)
    app.router.add_delete("/v1/responses/{id}", responses.delete)
    app.router.add_get("/v1/responses/{id}/input_items", responses.input_items)
    app.router.add_post("/v1/responses/{id}/cancel", responses.cancel)
    app.router.add_post("/v1/embeddings", embeddings.embeddings)
    app.router.add_get("/v1/models", system.models)
    app.router.add_get("/v1/me", ui.me)
    app.router.add_get("/v1/usage", usage.usage)
    app.router.add_post("/v1/conversations", conversations.create)
    app.router.add_get("/v1/conversations", conversations_list.list_)
    app.router.add_get("/v1/conversations/{id}", conversations.retrieve)
    app.router.add_delete("/v1/conversations/{id}", conversations.delete)
    app.router.add_get("/v1/conversations/{id}/items", conversations.list_items)
    app.router.add_post("/v1/conversations/{id}/items", conversations.add_items)
    app.router.add_get("/v1/conversations/{id}/events", conversations.events)
    app.router.add_get("/v1/conversations/{id}/messages", conversations.messages)
    app.router.add_post("/v1/conversations/{id}/branches", conversations.branch)
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
    app.router.add_get("/health/live", system.live)
    app.router.add_get("/health/ready", system.ready)
    app.router.add_get("/metrics", system.metrics)
    app.router.add_get("/openapi.json", openapi.openapi)
    app.router.add_get("/ui", ui.redirect)
    app.router.add_get("/ui/", ui.index)
    app.router.add_get("/ui/{file}", ui.asset)
