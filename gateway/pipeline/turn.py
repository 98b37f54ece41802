"""One turn, from admission to its end: what every completion endpoint runs.

    admit: rate limits and budgets for the key and its team, before any upstream call
      -> join: the request's conversation (`X-Conversation-Id`, a stored response's, or new)
      -> record: the turn begins with its new input (gateway.conversations.recorder)
      -> relay: the alias's deployments tried in plan order, the answer relayed to the client
         and the turn ended however it ends (gateway.pipeline.relay)

The HTTP handlers only parse the client's dialect into an OpenAI chat body, authenticate, and
call `run_turn`; the answer comes back already rendered in the client's dialect.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from aiohttp import web

from gateway import logs
from gateway.context import GATEWAY, Gateway
from gateway.conversations.recorder import TurnRecorder
from gateway.conversations.service import Joined
from gateway.dialects.base import Dialect
from gateway.dialects.openai_chat import ChatBody
from gateway.dialects.requests import Shape
from gateway.errors import InvalidRequest
from gateway.ids import new_id
from gateway.metering.keys import Principal
from gateway.metering.usage import tags_json
from gateway.pipeline.admission import admit
from gateway.pipeline.relay import Relay
from gateway.providers.params import ANTHROPIC_EXTRAS, PRIVATE, check_plan
from gateway.routing.router import Deployment
from gateway.scrub import REDACTED, scrub
from gateway.tracing import TRACING, TurnTrace


@dataclass(slots=True)
class TurnRequest:
    """What a client asked for, already in OpenAI chat shape whatever its dialect. (Not frozen:
    one is made per request, and a frozen dataclass sets each field the slow way.)"""

    body: ChatBody
    stream: bool
    dialect: Dialect  # the client's: how answers, errors and cancels are rendered
    request_id: str
    # Set by the Responses API, which joins its conversation through the stored response.
    joined: Joined | None = None
    cancel_key: str | None = None  # what an explicit cancel names; the request id if None
    on_turn: Callable[[TurnRecorder], None] | None = None  # told of the turn before it begins
    # Each deployment of the plan as this endpoint reaches it (/v1/completions: those that
    # serve the legacy API themselves speak it).
    plan_view: Callable[[Deployment], Deployment] | None = None


async def run_turn(
    gateway: Gateway, request: web.Request, principal: Principal, turn: TurnRequest
) -> web.StreamResponse:
    """Admit, join, record and relay one completion; returns the client's response."""
    tracing = request.app.get(TRACING)
    if tracing is None:
        return await _run_turn(gateway, request, principal, turn, None)
    model = str(turn.body.get("model"))
    trace = tracing.turn(request.headers, model, turn.request_id, turn.dialect.name)
    try:
        return await _run_turn(gateway, request, principal, turn, trace)
    except BaseException as error:
        trace.raised(error)
        raise
    finally:
        trace.left()


async def _run_turn(
    gateway: Gateway,
    request: web.Request,
    principal: Principal,
    turn: TurnRequest,
    trace: TurnTrace | None,
) -> web.StreamResponse:
    body = turn.body
    if isinstance(named := body.get("user"), str) and "\x00" in named:
        # Recorded with the turn's usage, where PostgreSQL text refuses NUL: the usage row
        # would be dropped and the request go unmetered (a way round budgets).
        raise InvalidRequest("'user' may not contain a NUL character.", param="user")
    # Taken together, before any wait: a config reload meanwhile leaves this turn on the
    # deployments and prices it was planned with.
    routes, meter = gateway.routes, gateway.meter
    alias = routes.alias(body.get("model"), principal)
    plan = routes.plan(alias, body)
    if turn.plan_view is not None:
        plan = [turn.plan_view(d) for d in plan]
    # A parameter some deployment of the plan cannot carry: a 400 naming the first such one
    # (nothing recorded), or with `drop_params` dropped for it.
    dropped = check_plan(body, plan, drop=alias.config.drop_params, alias=alias.config.name)
    user = turn_user(principal, body, request)
    lease = await admit(gateway.limiter, principal, body, plan, user=user)
    joined = turn.joined
    try:
        if joined is None:
            conversations = gateway.conversations
            requested = conversations.requested_id(
                request.headers, body.get("metadata"), body.get("litellm_session_id")
            )
            # An Anthropic deployment needs the stored answers' signed thinking back, which
            # only comparing the history with the stored one finds.
            restore = any(d.provider.wire == "anthropic" for d in plan)
            joined = await conversations.join(
                requested, body["messages"], principal, user, restore_thinking=restore
            )
    except BaseException:
        lease.release()
        raise
    body = _without_conversation_id(body)
    turn_id = new_id("turn")
    # The turn's id lets a client address what it showed (truncate, cancel) afterwards.
    headers = {
        "X-Conversation-Id": joined.conversation_id,
        "X-Gateway-Turn-Id": turn_id,
        **lease.headers,
    }
    if joined.repaired is not None:
        # The upstream gets the history the user saw: the dropped partial answer put back.
        body = {**body, "messages": joined.repaired}
        headers["X-Gateway-History-Repaired"] = "1"
    elif joined.restored is not None and any(d.provider.wire == "anthropic" for d in plan):
        # Signed thinking the client left out, from the store: Anthropic refuses a tool turn
        # of a thinking loop without it (docs/providers.md, "Thinking").
        body = {**body, "messages": joined.restored}
    recorder = TurnRecorder(
        gateway.store,
        joined.conversation_id,
        turn_id,
        team_id=principal.team_id,
        key_id=principal.key_id,
        user=user,
        alias=alias.name,
        prompt=body["messages"],
        meter=meter,
        lease=lease,
    )
    if trace is not None:
        trace.began(recorder)
    recorder.dialect = turn.dialect.name
    recorder.threaded = gateway.conversations.threading == "auto"
    if joined.keyed is body["messages"]:
        # The prompt is what threading looked up (not repaired or restored since): its first
        # history messages' canonical forms are made already.
        recorder.prior_keys = joined.prior_keys
    thinking = body.get("thinking")
    recorder.reasoning = bool(body.get("reasoning_effort")) or (
        isinstance(thinking, dict) and thinking.get("type") not in (None, "disabled")
    )
    if isinstance(metadata := body.get("metadata"), dict):
        recorder.tags = tags_json(metadata)  # what usage reports group by
    if turn.on_turn is not None:
        turn.on_turn(recorder)
    recorder.begin(
        new_conversation=joined.create,
        new_messages=joined.new_messages,
        request={
            "endpoint": turn.dialect.name,
            "request_id": turn.request_id,
            "model": alias.model,
            "stream": turn.stream,
            "user": user,  # whom it is for (the key's user, else the request's)
            "instructions": [
                m for m in body["messages"] if m.get("role") in ("system", "developer")
            ],
            "params": recorded_params(body),
            "headers": recorded_headers(request, gateway.conversations.session_headers),
        },
        note=joined.note,
    )
    relay = Relay(
        gateway,
        request,
        recorder,
        body=_without_litellm_fields(body),
        stream=turn.stream,
        alias=alias,
        plan=plan,
        headers=headers,
        dialect=turn.dialect,
        dropped=dropped,
        trace=trace,
    )
    try:
        return await relay.serve(turn.cancel_key or turn.request_id, principal.team_id)
    finally:
        logs.annotate_turn(recorder)  # the access log's alias, deployment and tokens


_CARRIED = frozenset((*PRIVATE, ANTHROPIC_EXTRAS))


def recorded_params(body: Mapping[str, Any]) -> dict[str, Any]:
    """The request's parameters as the turn keeps them: not its messages (recorded as events),
    not what the gateway carries beside them (a Messages client's body and headers), and no
    MCP server's `authorization_token`."""
    params = {k: v for k, v in body.items() if k != "messages"}
    if _CARRIED.isdisjoint(params):  # the usual request: nothing carried beside it
        return params
    for name in PRIVATE:
        params.pop(name, None)
    extras = params.get(ANTHROPIC_EXTRAS)
    servers = extras.get("mcp_servers") if isinstance(extras, dict) else None
    if isinstance(extras, dict) and isinstance(servers, list):
        servers = [
            {**s, "authorization_token": REDACTED}
            if isinstance(s, dict) and "authorization_token" in s
            else s
            for s in servers
        ]
        params[ANTHROPIC_EXTRAS] = {**extras, "mcp_servers": servers}
    return params


def shape_of(request: web.Request) -> Shape:
    """The configured shape limits of a completion request (gateway.dialects.requests)."""
    server = request.app[GATEWAY].config.server
    return server.max_messages, server.max_message_parts, server.max_tools


def turn_user(
    principal: Principal, body: Mapping[str, Any], request: web.Request | None = None
) -> str | None:
    """Who the turn is for: the key's own user, else the request's `user`, else the header
    `limits.end_user_header` names (read only when one is configured)."""
    user = body.get("user")
    if principal.user or isinstance(user, str):
        return principal.user or user
    if request is not None and (header := request.app[GATEWAY].config.limits.end_user_header):
        return request.headers.get(header) or None
    return None


# The request headers kept with each turn, for the UI's request panel: the client and its SDK,
# the API version and betas it asked for, how it named its conversation, its trace. An
# allow-list, so that no credential header is ever stored, whatever a client sends.
RECORDED_HEADERS = (
    "user-agent",
    "x-stainless-lang",
    "x-stainless-package-version",
    "x-stainless-runtime",
    "x-stainless-runtime-version",
    "x-stainless-retry-count",
    "anthropic-version",
    "anthropic-beta",
    "openai-beta",
    "x-conversation-id",
    "traceparent",
)
_CREDENTIAL_NAMES = ("auth", "cookie", "key", "token", "secret", "password", "credential")
_HEADER_CHARS = 512  # each value's recorded length at most


def recorded_headers(request: web.Request, session_headers: tuple[str, ...]) -> dict[str, str]:
    """The allowed headers the request carries, by lower-case name, with the configured
    session headers (`conversations.session_headers`) unless their name is credential-shaped;
    values are scrubbed of anything key-shaped and capped in length."""
    names: tuple[str, ...] = RECORDED_HEADERS
    if session_headers:
        extra = (h.lower() for h in session_headers)
        names = (*names, *(h for h in extra if not any(c in h for c in _CREDENTIAL_NAMES)))
    found = {}
    for name in names:
        values = request.headers.getall(name, ())
        if values:
            found[name] = scrub(", ".join(values))[:_HEADER_CHARS]
    return found


# What a client written for LiteLLM's proxy sends beside the request, for the proxy alone: a
# strict provider refuses them (OpenAI's `metadata` takes strings only, LiteLLM's `tags` are a
# list). Recorded with the turn; never sent upstream.
_LITELLM_FIELDS = frozenset(("litellm_session_id", "litellm_trace_id", "litellm_metadata", "tags"))


def _without_litellm_fields(body: ChatBody) -> dict[str, Any]:
    """The body as it goes upstream: without what only litellm's clients send the gateway."""
    metadata = body.get("metadata")
    tagged = isinstance(metadata, dict) and "tags" in metadata
    if not tagged and _LITELLM_FIELDS.isdisjoint(body):
        return cast("dict[str, Any]", body)  # the usual request: nothing to take out
    upstream = {k: v for k, v in body.items() if k not in _LITELLM_FIELDS}
    if tagged:
        assert isinstance(metadata, dict)
        rest = {k: v for k, v in metadata.items() if k != "tags"}
        if rest:
            upstream["metadata"] = rest
        else:
            del upstream["metadata"]
    return upstream


def _without_conversation_id(body: ChatBody) -> ChatBody:
    """`metadata.conversation_id` is the gateway's: OpenAI refuses `metadata` on a chat
    completion that is not stored, so it goes upstream only with the client's other keys."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict) or "conversation_id" not in metadata:
        return body
    rest = {k: v for k, v in metadata.items() if k != "conversation_id"}
    trimmed = {k: v for k, v in body.items() if k != "metadata"}
    if rest:
        trimmed["metadata"] = rest
    return cast(ChatBody, trimmed)
