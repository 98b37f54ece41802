"""GET /openapi.json: the gateway's own OpenAPI 3.1 document.

Every route in `gateway.http.routes` is described here with the status codes it really returns;
`tests/security/test_openapi.py` fails when a route is added without its description, and
schemathesis checks the live gateway against this document.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.context import GATEWAY
from gateway.conversations.listing import SORTS
from gateway.errors import TooManyFailedKeys, Unauthorized
from gateway.http.auth import principal_of
from gateway.http.openapi_schemas import Schema, components, ref

JSON = "application/json"
SSE = "text/event-stream"
FORM = "multipart/form-data"

_REASONS = {
    200: "OK",
    201: "Created",
    304: "Not modified (If-None-Match matched the ETag)",
    308: "Permanent redirect to /ui/",
    400: "Invalid request: the body or a parameter (`param` names it)",
    401: "Missing, unknown, revoked or expired API key",
    403: "A team key on a master-key endpoint",
    404: "Unknown resource, model alias or endpoint",
    408: "The request body did not arrive within server.body_timeout_s",
    409: "Conflict with the resource's current state",
    413: "The request body is larger than server.max_body_mb",
    429: "A rate limit, concurrency limit or hard budget was reached",
    502: "The upstream could not be reached or answered with a broken stream",
    503: "The conversation store is unavailable, or the gateway is shutting down",
    504: "The upstream timed out",
}

# Error statuses shared by kinds of route.
_AUTH = (401, 503)  # 503: a key is looked up in the store
_BODY = (400, 408, 413)
_COMPLETION = (*_AUTH, *_BODY, 404, 429, 502, 503, 504)
_ADMIN = (401, 403, 503)

Operation = dict[str, Any]


def _error(status: int, shape: str) -> dict[str, Any]:
    return {"description": _REASONS[status], "content": {JSON: {"schema": ref(shape)}}}


def _ok(schema: Schema, *, status: int = 200, extra: dict[str, Schema] | None = None) -> Operation:
    content = {JSON: {"schema": schema}, **{k: {"schema": v} for k, v in (extra or {}).items()}}
    return {str(status): {"description": _REASONS[status], "content": content}}


def op(
    summary: str,
    ok: Operation,
    errors: tuple[int, ...] = (),
    *,
    body: Schema | None = None,
    required_body: bool = True,
    params: list[dict[str, Any]] | None = None,
    public: bool = False,
    error_shape: str = "Error",
    upstream: bool = False,
    form: Schema | None = None,
) -> Operation:
    responses: dict[str, Any] = dict(ok)
    if params and any(p["in"] in ("path", "query") for p in params):
        errors = (*errors, 400)  # a malformed parameter, or a NUL in the URL
    for status in sorted(set(errors)):
        responses[str(status)] = _error(status, error_shape)
    if upstream:
        responses["default"] = {
            "description": "The upstream's own HTTP error, status and body passed through",
            "content": {JSON: {"schema": ref(error_shape)}},
        }
    out: Operation = {"summary": summary, "responses": responses}
    if params:
        out["parameters"] = params
    if body is not None:
        out["requestBody"] = {"required": required_body, "content": {JSON: {"schema": body}}}
    if form is not None:
        out["requestBody"] = {"required": True, "content": {FORM: {"schema": form}}}
    if public:
        out["security"] = []
    return out


# The API calls that are no turn (gateway.http.media): what each takes; answered as the upstream
# answered (JSON, text, or audio bytes).
_CALL = (*_AUTH, *_BODY, 403, 404, 429, 502, 503, 504)
_FILE = {"type": "string", "format": "binary"}


def _form(required: list[str], **fields: Schema) -> Schema:
    return {"type": "object", "required": required, "properties": fields}


def _calls(obj: Schema, listing: Schema) -> dict[str, Any]:
    text = {"type": "string"}
    model = {"type": "string", "description": "A model alias from the gateway's config."}
    image_body = {
        "type": "object",
        "required": ["model", "prompt"],
        "properties": {"model": model, "prompt": text, "n": {"type": "integer", "minimum": 1}},
        "example": {"model": "demo", "prompt": "a lighthouse at dusk", "size": "1024x1024"},
    }
    any_answer = _ok(obj, extra={"text/plain": text})
    return {
        "/v1/images/generations": {
            "post": op(
                "Images, per image by size and quality",
                _ok(obj),
                _CALL,
                body=image_body,
                upstream=True,
            )
        },
        "/v1/images/edits": {
            "post": op(
                "Image edits (multipart)",
                _ok(obj),
                _CALL,
                form=_form(["model", "image", "prompt"], model=model, image=_FILE, prompt=text),
                upstream=True,
            )
        },
        "/v1/images/variations": {
            "post": op(
                "Image variations (multipart)",
                _ok(obj),
                _CALL,
                form=_form(["model", "image"], model=model, image=_FILE),
                upstream=True,
            )
        },
        "/v1/audio/transcriptions": {
            "post": op(
                "Transcriptions (multipart), per second or per audio token",
                any_answer,
                _CALL,
                form=_form(["model", "file"], model=model, file=_FILE),
                upstream=True,
            )
        },
        "/v1/audio/translations": {
            "post": op(
                "Translations into English (multipart)",
                any_answer,
                _CALL,
                form=_form(["model", "file"], model=model, file=_FILE),
                upstream=True,
            )
        },
        "/v1/audio/speech": {
            "post": op(
                "Speech: the audio relayed as it comes, per character",
                _ok(obj, extra={"audio/mpeg": _FILE, "application/octet-stream": _FILE}),
                _CALL,
                body={
                    "type": "object",
                    "required": ["model", "input", "voice"],
                    "properties": {"model": model, "input": text, "voice": text},
                },
                upstream=True,
            )
        },
        "/v1/moderations": {
            "post": op(
                "Moderations, free unless priced",
                _ok(obj),
                _CALL,
                body={"type": "object", "required": ["input"], "properties": {"model": model}},
                upstream=True,
            )
        },
        "/v1/rerank": {
            "post": op(
                "Rerank, the Cohere/Jina shape: {model, query, documents, top_n}",
                _ok(obj),
                _CALL,
                body={
                    "type": "object",
                    "required": ["model", "query", "documents"],
                    "properties": {
                        "model": model,
                        "query": text,
                        "documents": {"type": "array", "minItems": 1},
                        "top_n": {"type": "integer", "minimum": 1},
                    },
                },
                upstream=True,
            )
        },
        "/v1/files": {
            "post": op(
                "Upload a file to the deployment of the model it is for (multipart)",
                _ok(obj),
                _CALL,
                form=_form(["file", "purpose"], file=_FILE, purpose=text, model=model),
                upstream=True,
            ),
            "get": op(
                "The team's files",
                _ok(listing),
                (*_AUTH, 400),
                params=[
                    query("purpose", text),
                    query("limit", {"type": "integer"}),
                    query("after", text),
                    query("order", {"enum": ["asc", "desc"]}),
                ],
            ),
        },
        "/v1/files/{id}": {
            "get": op(
                "A file of the team's", _ok(obj), (*_AUTH, 404, 502, 504), params=_ID, upstream=True
            ),
            "delete": op(
                "Delete a file of the team's",
                _ok(obj),
                (*_AUTH, 404, 502, 504),
                params=_ID,
                upstream=True,
            ),
        },
        "/v1/files/{id}/content": {
            "get": op(
                "A file's content, as the upstream has it",
                _ok(obj, extra={"application/octet-stream": _FILE}),
                (*_AUTH, 404, 502, 504),
                params=_ID,
                upstream=True,
            )
        },
        "/v1/batches": {
            "post": op(
                "A batch of an uploaded file's requests, at the batch price",
                _ok(obj),
                _CALL,
                body={
                    "type": "object",
                    "required": ["input_file_id", "endpoint", "completion_window"],
                    "properties": {
                        "input_file_id": text,
                        "endpoint": text,
                        "completion_window": text,
                    },
                },
                upstream=True,
            ),
            "get": op(
                "The team's batches",
                _ok(listing),
                (*_AUTH, 400),
                params=[query("limit", {"type": "integer"}), query("after", text)],
            ),
        },
        "/v1/batches/{id}": {
            "get": op(
                "A batch of the team's; metered once completed",
                _ok(obj),
                (*_AUTH, 404, 502, 504),
                params=_ID,
                upstream=True,
            )
        },
        "/v1/batches/{id}/cancel": {
            "post": op(
                "Cancel a batch of the team's",
                _ok(obj),
                (*_AUTH, 404, 502, 504),
                params=_ID,
                upstream=True,
            )
        },
        "/v1/requests": {
            "get": op(
                "The request log of API calls that are no turn: newest first",
                _ok(listing),
                (*_AUTH, 400),
                params=[
                    query("id", text, "A request's X-Request-Id"),
                    query("endpoint", text),
                    query("status", {"enum": ["completed", "error"]}),
                    query("model", text),
                    query("key_id", text),
                    query("team_id", text, "The master key's filter"),
                    query("since", _TIME),
                    query("until", _TIME),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                    query("after", text, "The previous page's `cursor`"),
                ],
            )
        },
    }


def path_param(name: str = "id", description: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "schema": {"type": "string", "minLength": 1},
        "description": description,
    }


# The conversation list's range filters (gateway.conversations.listing.RANGES).
_LIST_RANGES = (
    ("min_cost", "Total cost in USD, at least"),
    ("max_cost", "Total cost in USD, at most"),
    ("min_duration_ms", "The attempts' durations summed, at least"),
    ("max_duration_ms", "The attempts' durations summed, at most"),
    ("min_ttft_ms", "The attempts' average time to first token, at least"),
    ("max_ttft_ms", "The attempts' average time to first token, at most"),
)


def query(name: str, schema: Schema, description: str = "") -> dict[str, Any]:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "schema": schema,
        "description": description,
    }


CONVERSATION_HEADER = {
    "name": "X-Conversation-Id",
    "in": "header",
    "required": False,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
    "description": "Join (or start) this conversation.",
}
_ID = [path_param()]
_TIME = {"type": "string", "description": "Unix seconds or ISO 8601"}
# Each server-sent event: the JSON of a chunk (or `[DONE]`) in `data`, its type in `event`.
_STREAM = {
    SSE: {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"}}}
}


def paths() -> dict[str, dict[str, Operation]]:
    conv = {
        "type": "object",
        "required": ["id", "object"],
        "properties": {"id": {"type": "string"}},
    }
    obj: Schema = {"type": "object"}
    listing = ref("List")
    completion_params = [CONVERSATION_HEADER]
    return {
        "/v1/chat/completions": {
            "post": op(
                "Chat completion, streamed (text/event-stream) or not",
                _ok(ref("ChatCompletion"), extra=_STREAM),
                _COMPLETION,
                body=ref("ChatCompletionRequest"),
                params=completion_params,
                upstream=True,
            )
        },
        "/v1/chat/completions/{request_id}/cancel": {
            "post": op(
                "Stop an in-flight chat completion from another connection",
                _ok(ref("ChatCompletionCancellation")),
                (*_AUTH, *_BODY, 404, 409),
                body=ref("Cancel"),
                required_body=False,
                params=[path_param("request_id", "The stream's X-Request-Id")],
            )
        },
        "/v1/completions": {
            "post": op(
                "OpenAI's legacy Completions API, for any provider; recorded as a turn",
                _ok(ref("TextCompletion"), extra=_STREAM),
                _COMPLETION,
                body=ref("CompletionRequest"),
                params=completion_params,
                upstream=True,
            )
        },
        "/v1/messages": {
            "post": op(
                "The Anthropic Messages API, for any provider",
                _ok(ref("AnthropicMessage"), extra=_STREAM),
                _COMPLETION,
                body=ref("MessagesRequest"),
                params=completion_params,
                error_shape="AnthropicError",
                upstream=True,
            )
        },
        "/v1/messages/count_tokens": {
            "post": op(
                "Input tokens of a Messages request: Anthropic's count on an Anthropic"
                " deployment, else the gateway's estimate (X-Gateway-Token-Count)",
                _ok(ref("TokenCount")),
                (*_AUTH, *_BODY, 404),
                body=ref("TokenCountRequest"),
                error_shape="AnthropicError",
                upstream=True,
            )
        },
        "/v1/responses": {
            "post": op(
                "The OpenAI Responses API, for any provider",
                _ok(ref("Response"), extra=_STREAM),
                _COMPLETION,
                body=ref("ResponsesRequest"),
                params=completion_params,
                upstream=True,
            )
        },
        "/v1/responses/{id}": {
            "get": op("A stored response", _ok(ref("Response")), (*_AUTH, 404), params=_ID),
            "delete": op("Delete a stored response", _ok(obj), (*_AUTH, 404), params=_ID),
        },
        "/v1/responses/{id}/input_items": {
            "get": op(
                "The input items of a stored response",
                _ok(listing),
                (*_AUTH, 404),
                params=[*_ID, query("order", {"enum": ["asc", "desc"]})],
            )
        },
        "/v1/responses/{id}/cancel": {
            "post": op(
                "Stop an in-flight response",
                _ok(ref("Response")),
                (*_AUTH, *_BODY, 404, 409),
                body=ref("Cancel"),
                required_body=False,
                params=_ID,
            )
        },
        "/v1/embeddings": {
            "post": op(
                "Embeddings, routed, admitted and metered like completions; not recorded",
                _ok(listing),
                (*_AUTH, *_BODY, 403, 404, 429, 502, 503, 504),
                body=ref("EmbeddingsRequest"),
                upstream=True,
            )
        },
        **_calls(obj, listing),
        "/v1/models": {"get": op("The configured model aliases", _ok(listing), _AUTH)},
        "/v1/models/{id}": {
            "get": op(
                "One model the key may use (an alias, or an id a pattern alias serves)",
                _ok(ref("Model")),
                (*_AUTH, 404),
                params=[path_param("id", "A model id")],
            )
        },
        "/v1/me": {
            "get": op(
                "What the presented key acts as, and a virtual key's own limits and spend",
                _ok(ref("Principal")),
                _AUTH,
            )
        },
        "/v1/usage": {
            "get": op(
                "Usage and cost, grouped",
                _ok(listing, extra={"text/csv": {"type": "string"}}),
                (*_AUTH, 400),
                params=[
                    query(
                        "group_by",
                        {
                            "anyOf": [
                                {"enum": ["team", "key", "user", "model", "deployment"]},
                                {"type": "string", "pattern": "^tag:[A-Za-z0-9_.:-]{1,64}$"},
                            ]
                        },
                        "A grouping, or tag:<key> of the requests' metadata",
                    ),
                    query("granularity", {"enum": ["hour", "day"]}),
                    query("from", _TIME),
                    query("to", _TIME),
                    query("team_id", {"type": "string"}, "The master key's filter"),
                    query("format", {"enum": ["json", "csv"]}),
                ],
            )
        },
        "/v1/usage/latency": {
            "get": op(
                "Time to first token and duration percentiles (p50, p95, p99), grouped",
                _ok(listing),
                (*_AUTH, 400),
                params=[
                    query("group_by", {"enum": ["team", "key", "user", "model", "deployment"]}),
                    query("from", _TIME),
                    query("to", _TIME),
                    query("team_id", {"type": "string"}, "The master key's filter"),
                ],
            )
        },
        "/v1/usage/requests": {
            "get": op(
                "Every usage record of a range, for a bill (CSV or JSON Lines, streamed)",
                {
                    "200": {
                        "description": "OK",
                        "content": {
                            "text/csv": {"schema": {"type": "string"}},
                            "application/jsonl": {"schema": {"type": "string"}},
                        },
                    }
                },
                (*_AUTH, 400),
                params=[
                    query("from", _TIME),
                    query("to", _TIME),
                    query("team_id", {"type": "string"}, "The master key's filter"),
                    query("format", {"enum": ["csv", "jsonl"]}),
                ],
            )
        },
        "/v1/conversations": {
            "post": op(
                "Create a conversation (OpenAI Conversations API)",
                _ok(conv),
                (*_AUTH, *_BODY),
                body=ref("NewConversation"),
                required_body=False,
            ),
            "get": op(
                "List conversations (a request log): filtered, searched, sorted",
                _ok(listing),
                (*_AUTH, 400),
                params=[
                    query("team_id", {"type": "string"}),
                    query("key_id", {"type": "string"}),
                    query("model", {"type": "string"}),
                    query("status", {"enum": ["completed", "interrupted", "error", "active"]}),
                    query("since", _TIME),
                    query("until", _TIME),
                    query(
                        "q",
                        {"type": "string"},
                        "Words, all in one message's text (user, assistant, tool result);"
                        " English stemming",
                    ),
                    query("parent_id", {"type": "string"}),
                    query(
                        "id",
                        {"type": "string"},
                        "A conversation's id, or one of its turns', responses' or requests'"
                        " (X-Request-Id)",
                    ),
                    query("user", {"type": "string"}, "A turn for this user"),
                    *(
                        query(name, {"type": "number", "minimum": 0}, description)
                        for name, description in _LIST_RANGES
                    ),
                    query("stopped", {"enum": ["true", "1"]}, "A turn ended interrupted"),
                    query("failed", {"enum": ["true", "1"]}, "An attempt failed"),
                    query("include", {"enum": ["usage"]}, "Each row's totals, as `usage`"),
                    query(
                        "sort",
                        {"enum": list(SORTS)},
                        "Default `created`; NULL totals last in either order",
                    ),
                    query("order", {"enum": ["desc", "asc"]}, "Default `desc`"),
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                    query(
                        "after",
                        {"type": "string"},
                        "The previous page's `cursor` (same sort and order, else 400), or a"
                        " conversation id to start after",
                    ),
                ],
            )
            | {
                # A parameter name OpenAPI has no way to spell: `metadata.` and any key.
                "description": "`metadata.<key>=<value>` (repeatable) keeps conversations whose"
                " metadata holds that key with that string value."
            },
        },
        "/v1/conversations/{id}": {
            "get": op("A conversation", _ok(conv), (*_AUTH, 404), params=_ID),
            "post": op(
                "Replace a conversation's metadata (OpenAI Conversations API)",
                _ok(conv),
                (*_AUTH, *_BODY, 404),
                body=ref("ConversationUpdate"),
                params=_ID,
            ),
            "delete": op("Hide a conversation", _ok(obj), (*_AUTH, 404), params=_ID),
        },
        "/v1/conversations/{id}/items": {
            "get": op(
                "A conversation's items",
                _ok(listing),
                (*_AUTH, 400, 404),
                params=[
                    *_ID,
                    query("limit", {"type": "integer", "minimum": 1, "maximum": 100}),
                    query("after", {"type": "string"}),
                    query("order", {"enum": ["asc", "desc"]}),
                ],
            ),
            "post": op(
                "Add items to a conversation",
                _ok(listing),
                (*_AUTH, *_BODY, 404),
                body=ref("NewItems"),
                params=_ID,
            ),
        },
        "/v1/conversations/{id}/events": {
            "get": op("The event log", _ok(listing), (*_AUTH, 404), params=_ID)
        },
        "/v1/conversations/{id}/messages": {
            "get": op("The derived model history", _ok(listing), (*_AUTH, 404), params=_ID)
        },
        "/v1/conversations/{id}/branches": {
            "post": op(
                "Branch a conversation at a seq",
                _ok(conv, status=201),
                (*_AUTH, *_BODY, 404, 409),
                body=ref("NewBranch"),
                params=_ID,
            )
        },
        "/v1/conversations/{id}/turns/{turn_id}/truncate": {
            "post": op(
                "Truncate a turn's interrupted answer to what its client showed",
                _ok(ref("Truncation")),
                (*_AUTH, *_BODY, 404, 409),
                body=ref("Truncate"),
                params=[*_ID, path_param("turn_id", "The turn's X-Gateway-Turn-Id")],
            )
        },
        "/v1/conversations/{id}/turns/{turn_id}/cancel": {
            "post": op(
                "Stop a turn in flight, on whichever replica runs it; recorded as a client's"
                " cancel",
                _ok(ref("TurnCancellation")),
                (*_AUTH, 404, 409),
                params=[*_ID, path_param("turn_id", "The turn's X-Gateway-Turn-Id")],
            )
        },
        "/v1/conversations/{id}/turns/{turn_id}/live": {
            "get": op(
                "A streaming turn's answer as its client has it, as server-sent events"
                " (`answer`, then `end`), on the replica running it",
                {
                    "200": {
                        "description": _REASONS[200],
                        "content": {k: {"schema": v} for k, v in _STREAM.items()},
                    }
                },
                (*_AUTH, 404),
                params=[*_ID, path_param("turn_id", "The turn's X-Gateway-Turn-Id")],
            )
        },
        "/v1/conversations/{id}/usage": {
            "get": op("Usage of every attempt", _ok(listing), (*_AUTH, 404), params=_ID)
        },
        "/v1/gateway/deployments": {
            "get": op("Every deployment's live state", _ok(listing), _ADMIN)
        },
        "/v1/gateway/teams": {
            "post": op(
                "Create a team",
                _ok(obj, status=201),
                (*_ADMIN, *_BODY, 409),
                body=ref("NewTeam"),
            ),
            "get": op("All teams", _ok(listing), _ADMIN),
        },
        "/v1/gateway/teams/{id}": {
            "patch": op(
                "Rename a team or change its limits",
                _ok(obj),
                (*_ADMIN, *_BODY, 404),
                body=ref("TeamChanges"),
                params=_ID,
            )
        },
        "/v1/gateway/keys": {
            "post": op(
                "Create a virtual key (its secret is in `key`, shown once)",
                _ok(obj, status=201),
                (*_ADMIN, *_BODY),
                body=ref("NewKey"),
            ),
            "get": op(
                "All keys, never their secrets",
                _ok(listing),
                _ADMIN,
                params=[query("team_id", {"type": "string"})],
            ),
        },
        "/v1/gateway/keys/{id}": {
            "get": op("One key", _ok(obj), (*_ADMIN, 404), params=_ID),
            "patch": op(
                "Change a key",
                _ok(obj),
                (*_ADMIN, *_BODY, 404),
                body=ref("KeyChanges"),
                params=_ID,
            ),
            "delete": op("Revoke a key", _ok(obj), (*_ADMIN, 404), params=_ID),
        },
        "/v1/gateway/keys/{id}/rotate": {
            "post": op(
                "A new key like this one (its secret in `key`, shown once); the old one keeps"
                " working for `overlap_s` (default 3600), then expires",
                _ok(obj, status=201),
                (*_ADMIN, *_BODY, 404, 409),
                body=ref("KeyRotation"),
                params=_ID,
            )
        },
        "/health/live": {"get": op("Liveness", _ok(obj), public=True)},
        "/health/ready": {"get": op("Readiness: checks the store", _ok(obj), (503,), public=True)},
        "/metrics": {
            "get": op(
                "Prometheus metrics",
                {"200": {"description": "OK", "content": {"text/plain": {"schema": {}}}}},
                public=True,
            )
        },
        "/openapi.json": {"get": op("This document", _ok(obj), public=True)},
        "/ui": {
            "get": op(
                "Redirect to the admin UI",
                {"308": {"description": _REASONS[308]}},
                public=True,
            )
        },
        "/ui/": {"get": op("The admin UI's page", _page(("text/html",)), public=True)},
        "/ui/{file}": {
            "get": op(
                "A static file of the admin UI",
                _page(("text/html", "text/javascript", "text/css", "image/svg+xml")),
                (404,),
                params=[path_param("file")],
                public=True,
            )
        },
    }


def _page(types: tuple[str, ...]) -> Operation:
    return {
        "200": {"description": "OK", "content": {t: {"schema": {}} for t in types}},
        "304": {"description": _REASONS[304]},
    }


# The request schemas whose `model` lists the caller's aliases as examples.
_MODEL_SCHEMAS = (
    "ChatCompletionRequest",
    "MessagesRequest",
    "ResponsesRequest",
    "EmbeddingsRequest",
)


def document(aliases: list[str]) -> dict[str, Any]:
    """The document; `aliases` (those the caller may use) are given as `model` examples."""
    schemas = components()
    for name in _MODEL_SCHEMAS if aliases else ():
        properties = schemas[name]["properties"]
        model = {**properties["model"], "examples": aliases}
        schemas[name] = {**schemas[name], "properties": {**properties, "model": model}}
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "gateway",
            "version": "0.1.0",
            "description": "An OpenAI-compatible LLM gateway that records what each user saw.",
        },
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}, {"apiKey": []}],
        "paths": paths(),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer"},
                "apiKey": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
    }


async def openapi(request: web.Request) -> web.Response:
    """Public, but its `model` examples are the aliases the caller's key may use: none without
    a valid key (an open gateway's caller is the admin, and sees them all)."""
    try:
        principal = await principal_of(request)
    except (Unauthorized, TooManyFailedKeys):
        principal = None
    aliases = request.app[GATEWAY].routes.aliases
    usable = [a for a in aliases if principal.may_use(a)] if principal is not None else []
    return web.json_response(document(usable))
