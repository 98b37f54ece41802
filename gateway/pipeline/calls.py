"""An API call that is no turn: images, audio, moderations, rerank (and the model-bound calls of
files and batches). Admitted, routed and metered as a completion is, and listed in the request
log, but not recorded as a conversation:

    admit: the key's models, its and its team's limits and budgets, with the most the call may
      cost at the dearest deployment of its plan (a hard budget refuses one it cannot price)
      -> attempts: the alias's deployments that serve the endpoint, in plan order, retried and
         fallen back as a completion's are, until the answer's first byte
      -> answer: the upstream's body unchanged (a binary one, speech, relayed as it comes)
      -> meter: one usage row naming the endpoint, what the call was billed by and its cost;
         a call that failed on every deployment gets one too, with its error and no cost

A deployment serves an endpoint when its provider says so (`serves`): OpenAI-compatible and
Azure deployments speak the OpenAI API themselves, litellm's are driven through its
functions, Anthropic's and the demo serve none of these.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from gateway import logs
from gateway.context import Gateway
from gateway.errors import (
    GatewayError,
    InvalidRequest,
    PriceUnknown,
    UpstreamError,
    UpstreamTimeout,
)
from gateway.forms import Form
from gateway.ids import new_id
from gateway.metering.call_prices import Bill, CallPrices
from gateway.metering.keys import Principal
from gateway.metering.limits import Lease, scopes_of
from gateway.metering.usage import UsageRecord, cost_header
from gateway.routing.retry import RetryPlan
from gateway.routing.router import Alias, Deployment
from gateway.scrub import credentials, scrub_error
from gateway.upstream.seam import UpstreamBody, read_all

# The answer's media type when the upstream names none.
JSON = "application/json"


@dataclass
class Call:
    """One call: where it goes and what it carries, how much it may cost, how it is billed."""

    endpoint: str  # as the request log names it: `images.generations`
    path: str  # past the API base: `/images/generations`
    model: str  # the alias asked for
    json: dict[str, Any] | None = None  # a JSON body (its `model` replaced per deployment)
    form: Form | None = None  # or a multipart form (likewise)
    user: str | None = None
    # The most the call may cost at a deployment's prices (None: it cannot be priced there).
    estimate: Callable[[CallPrices], float | None] = lambda prices: 0.0
    # What the call was billed by, from the answer (its bytes, and its JSON when it is JSON).
    bill: Callable[[CallPrices, bytes, Any], Bill] = lambda prices, raw, answer: Bill({}, 0.0)
    stream: bool = False  # relay the answer's bytes as they come (a binary answer: speech)


def end_user(
    gateway: Gateway, principal: Principal, user: str | None, request: web.Request | None
) -> str | None:
    """Whom a call is for, as for a turn (gateway.pipeline.turn.turn_user): the key's own
    user, else the request's `user`, else the header `limits.end_user_header` names. Its
    `end_user` limits and budgets admit the call, and its usage row names it."""
    if principal.user or user:
        return principal.user or user
    header = gateway.config.limits.end_user_header
    if header and request is not None:
        return request.headers.get(header) or None
    return None


def serves(deployment: Deployment, endpoint: str) -> bool:
    check = getattr(deployment.provider, "serves", None)
    return bool(check is not None and check(endpoint))


async def run_call(
    gateway: Gateway, request: web.Request, principal: Principal, call: Call
) -> web.StreamResponse:
    router = gateway.routes
    alias = router.alias(call.model, principal)
    plan = [d for d in router.plan(alias, {}) if serves(d, call.endpoint)]
    if not plan:
        names = ", ".join(f"{d.name} ({d.provider_name})" for d in alias.deployments)
        raise InvalidRequest(
            f"The model `{alias.model}` has no deployment that serves /v1/{call.path.lstrip('/')}"
            f" (its deployments: {names}).",
            param="model",
        )
    prices = {d.name: router.call_prices(d) for d in plan}
    call.user = end_user(gateway, principal, call.user, request)
    lease = await _admit(gateway, principal, call, plan, prices)
    logs.annotate(alias=alias.name)
    try:
        return await _attempts(gateway, request, principal, call, alias, plan, prices, lease)
    finally:
        lease.release()  # a no-op once the answer settled it


async def _admit(
    gateway: Gateway,
    principal: Principal,
    call: Call,
    plan: list[Deployment],
    prices: dict[str, CallPrices],
) -> Lease:
    scopes = scopes_of(
        principal.key_limits,
        principal.team_limits,
        principal.key_id,
        principal.team_id,
        principal.user or call.user,
    )
    if not any(s[2].tpm or s[2].budget for s in scopes):
        return await gateway.limiter.admit(scopes, 0, 0.0)
    costs = {d.name: call.estimate(prices[d.name]) for d in plan}
    hard = [(k, i) for k, i, limits in scopes if limits.budget and limits.budget.mode == "hard"]
    unpriced = [d for d in plan if costs[d.name] is None]
    if hard and unpriced:
        kind, ident = hard[0]
        names = ", ".join(f"{d.name!r} (model {d.upstream_model!r})" for d in unpriced)
        raise PriceUnknown(
            f"The {kind} {ident!r} has a hard budget, and the deployment {names} this"
            f" {call.endpoint} call may reach has no known price for it, so its cost could not"
            " be counted against the budget. Price the model in the price file (`prices:`)"
            " with litellm's fields for it, or set `price: free` on the deployment."
        )
    most = max((c for c in costs.values() if c is not None), default=0.0)
    return await gateway.limiter.admit(scopes, 0, most)


async def _attempts(
    gateway: Gateway,
    request: web.Request,
    principal: Principal,
    call: Call,
    alias: Alias,
    plan: list[Deployment],
    prices: dict[str, CallPrices],
    lease: Lease,
) -> web.StreamResponse:
    started = time.monotonic()
    retries = RetryPlan(alias, plan)
    while (deployment := await retries.next()) is not None:
        deployment.health.acquire()
        try:
            async with asyncio.timeout(deployment.config.timeouts.total_s):
                upstream = await _send(deployment, call)
                first = await upstream.read() if call.stream else await read_all(upstream)
        except TimeoutError:
            error: UpstreamError = UpstreamTimeout(
                f"the {call.endpoint} call timed out", phase="total"
            )
            _failed(retries, deployment, error)
            continue
        except UpstreamError as exc:
            config = deployment.config
            scrub_error(exc, [config.api_key or "", *credentials(config.extra_headers)])
            _failed(retries, deployment, exc)
            continue
        finally:
            deployment.health.release()
        deployment.health.succeeded(None)
        headers = {
            "X-Gateway-Deployment": deployment.name,
            "X-Gateway-Attempts": str(retries.attempts),
            **lease.headers,
        }
        logs.annotate(deployment=deployment.name)
        content_type = _content_type(upstream)
        if not call.stream:
            cost = _meter(
                gateway,
                principal,
                call,
                alias,
                deployment,
                prices,
                lease,
                first,
                content_type,
                started,
            )
            if cost is not None:
                headers["X-Gateway-Cost-USD"] = cost_header(cost)
            return web.Response(body=first, headers={**headers, "Content-Type": content_type})
        return await _relay(
            gateway,
            request,
            principal,
            call,
            alias,
            deployment,
            prices,
            lease,
            upstream,
            first,
            headers,
            content_type,
            started,
        )
    assert retries.last_error is not None
    last = retries.last_error
    # The request log's row of a call no deployment answered.
    meter_call(
        gateway,
        principal,
        plan[0],
        call.endpoint,
        alias=alias.name,
        started=started,
        user=call.user,
        error=last,
    )
    last.headers["X-Gateway-Attempts"] = str(retries.attempts)
    last.retries_spent = True
    raise last


async def _send(deployment: Deployment, call: Call) -> UpstreamBody:
    model = deployment.upstream_model
    json = {**call.json, "model": model} if call.json is not None else None
    response: UpstreamBody = await deployment.provider.call(  # type: ignore[attr-defined]
        call.endpoint, call.path, json=json, form=call.form, model=model
    )
    return response


def _failed(retries: RetryPlan, deployment: Deployment, error: UpstreamError) -> None:
    retries.failed(deployment, error)
    if error.retryable:
        deployment.health.failed(error.label)


def _content_type(upstream: UpstreamBody) -> str:
    return upstream.headers.get("content-type") or JSON


async def _relay(
    gateway: Gateway,
    request: web.Request,
    principal: Principal,
    call: Call,
    alias: Alias,
    deployment: Deployment,
    prices: dict[str, CallPrices],
    lease: Lease,
    upstream: UpstreamBody,
    first: bytes,
    headers: dict[str, str],
    content_type: str,
    started: float,
) -> web.StreamResponse:
    """A binary answer, relayed as it comes; metered once whole (or as far as it got)."""
    response = web.StreamResponse(headers={**headers, "Content-Type": content_type})
    await response.prepare(request)
    parts = [first]
    try:
        chunk = first
        while chunk:
            await response.write(chunk)
            chunk = await upstream.read()
            parts.append(chunk)
        await response.write_eof()
    finally:
        upstream.close()
        raw = b"".join(parts)
        _meter(
            gateway, principal, call, alias, deployment, prices, lease, raw, content_type, started
        )
    return response


def call_record(
    principal: Principal,
    deployment: Deployment,
    endpoint: str,
    *,
    alias: str,
    started: float | None,
    user: str | None = None,
    bill: Bill | None = None,
    error: GatewayError | None = None,
) -> UsageRecord:
    """A call's usage row, which the request log lists by its request's X-Request-Id: what
    `bill` says it was billed by and cost, or for a failed call (`error`) its error and no
    cost (providers bill no failed call)."""
    bill = bill or Bill({}, 0.0)
    return UsageRecord(
        id=f"{new_id('call')}:1",  # unique, even where a client's request ids repeat
        turn_id=call_id(),
        conversation_id="",
        team_id=principal.team_id,
        key_id=principal.key_id,
        user=principal.user or user,
        alias=alias,
        deployment=deployment.name,
        provider=deployment.provider_name,
        model=deployment.upstream_model,
        created_at=time.time(),
        status="completed" if error is None else "error",
        prompt_tokens=bill.prompt_tokens,
        completion_tokens=bill.completion_tokens,
        completion_delivered=0,
        reasoning_tokens=0,
        cached_tokens=0,
        usage_source=bill.source,
        cost_usd=bill.cost if error is None else 0.0,
        ttft_ms=None,
        duration_ms=round((time.monotonic() - started) * 1000.0, 2) if started else None,
        endpoint=endpoint,
        units=orjson.dumps(bill.units).decode() if bill.units else None,
        error=error_text(error) if error is not None else None,
        prices=bill.prices,
        price_source=bill.price_source,
    )


def _meter(
    gateway: Gateway,
    principal: Principal,
    call: Call,
    alias: Alias,
    deployment: Deployment,
    prices: dict[str, CallPrices],
    lease: Lease,
    raw: bytes,
    content_type: str,
    started: float,
) -> float | None:
    """Write the call's usage row and settle its lease; what it cost (None: unpriced)."""
    answer: Any = None
    if content_type.startswith(JSON):
        try:
            answer = orjson.loads(raw)
        except orjson.JSONDecodeError:
            answer = None
    bill = call.bill(prices[deployment.name], raw, answer)
    meter_call(
        gateway,
        principal,
        deployment,
        call.endpoint,
        alias=alias.name,
        started=started,
        user=call.user,
        bill=bill,
    )
    lease.settle(bill.cost or 0.0, bill.prompt_tokens + bill.completion_tokens)
    return bill.cost


def meter_call(
    gateway: Gateway,
    principal: Principal,
    deployment: Deployment,
    endpoint: str,
    *,
    alias: str,
    started: float | None,
    user: str | None = None,
    bill: Bill | None = None,
    error: GatewayError | None = None,
) -> None:
    """Write a call's usage row (`call_record`), where the gateway meters."""
    if gateway.meter is not None:
        record = call_record(
            principal,
            deployment,
            endpoint,
            alias=alias,
            started=started,
            user=user,
            bill=bill,
            error=error,
        )
        gateway.meter.call(record)


def call_id() -> str:
    """The request log's id of the call being served: its request's X-Request-Id."""
    return logs.request_id() or new_id("call")


def error_text(error: GatewayError) -> str:
    """A failed call's error as the request log keeps it: its code and message."""
    return f"{error.code}: {error.message}"[:500]
