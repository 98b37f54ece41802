"""An embeddings request: routed by the same aliases, strategies and retries as a turn, and
answered with the upstream's body, unchanged unless its vectors are not in the form the client
asked for. Nothing of it is recorded as a conversation, but it is admitted and metered as a
completion is: the key's and team's limits and budgets first, a usage row with its cost after.

`encoding_format` is honoured whatever the deployment does with it: an upstream that ignores it
(answers floats to a `base64` request, or the reverse) has its vectors converted, base64 being
OpenAI's little-endian float32 array. `dimensions` is passed on; an answer of another length
is refused (a 400), never handed to the client as if it were what was asked for.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import struct
import time
from typing import Any

import orjson
from aiohttp import web

from gateway.context import Gateway
from gateway.errors import InvalidRequest, UpstreamError, UpstreamTimeout
from gateway.metering.call_prices import Bill
from gateway.metering.keys import Principal
from gateway.metering.limits import Lease
from gateway.metering.prices import price_columns
from gateway.metering.tokens import count_embedding_input
from gateway.metering.usage import cost_header
from gateway.pipeline.admission import admit
from gateway.pipeline.calls import end_user, meter_call
from gateway.routing.retry import RetryPlan
from gateway.routing.router import Alias, Deployment


async def run_embeddings(
    gateway: Gateway,
    principal: Principal,
    body: dict[str, Any],
    request: web.Request | None = None,
) -> tuple[bytes, dict[str, str]]:
    """The upstream's JSON answer and the response headers; the last `UpstreamError` when
    every deployment failed.

    Admitted as a completion is (the key's models, its and its team's RPM, TPM, concurrency
    and budgets: `admit`), and metered: one usage row with the input tokens and their cost,
    written when the answer comes. A failed attempt is not billed by providers: no row."""
    router = gateway.routes
    alias = router.alias(body["model"], principal)
    plan = [d for d in router.plan(alias, body) if hasattr(d.provider, "embeddings")]
    if not plan:
        raise InvalidRequest(
            f"The model `{alias.name}` has no deployment that serves embeddings.", param="model"
        )
    user = end_user(gateway, principal, _user(body), request)
    lease = await admit(gateway.limiter, principal, body, plan, embeddings=True, user=user)
    try:
        raw, headers = await _attempts(gateway, principal, body, alias, plan, lease, user)
    finally:
        lease.release()  # a no-op once the answer settled it
    headers.update(lease.headers)
    return raw, headers


async def _attempts(
    gateway: Gateway,
    principal: Principal,
    body: dict[str, Any],
    alias: Alias,
    plan: list[Deployment],
    lease: Lease,
    user: str | None,
) -> tuple[bytes, dict[str, str]]:
    started = time.monotonic()
    retries = RetryPlan(alias, plan)
    while (deployment := await retries.next()) is not None:
        deployment.health.acquire()
        try:
            async with asyncio.timeout(deployment.config.timeouts.total_s):
                raw: bytes = await deployment.provider.embeddings(body)  # type: ignore[attr-defined]
        except TimeoutError:
            error: UpstreamError = UpstreamTimeout(
                "the embeddings request timed out", phase="total"
            )
            retries.failed(deployment, error)
            deployment.health.failed(error.label)
            continue
        except UpstreamError as exc:
            retries.failed(deployment, exc)
            if exc.retryable:
                deployment.health.failed(exc.label)
            continue
        finally:
            deployment.health.release()
        deployment.health.succeeded(None)
        try:
            raw, usage = conform(raw, body, deployment.name)
        except InvalidRequest:  # answered, and billed, but not as asked: metered all the same
            _meter(gateway, principal, body, alias, deployment, lease, None, started, user)
            raise
        cost = _meter(gateway, principal, body, alias, deployment, lease, usage, started, user)
        headers = {
            "X-Gateway-Deployment": deployment.name,
            "X-Gateway-Attempts": str(retries.attempts),
        }
        if cost is not None:
            headers["X-Gateway-Cost-USD"] = cost_header(cost)
        return raw, headers
    assert retries.last_error is not None
    last = retries.last_error
    # The request log's row of an embeddings request no deployment answered.
    meter_call(
        gateway,
        principal,
        plan[0],
        "embeddings",
        alias=alias.name,
        started=started,
        user=user,
        error=last,
    )
    last.headers["X-Gateway-Attempts"] = str(retries.attempts)
    raise last


def _meter(
    gateway: Gateway,
    principal: Principal,
    body: dict[str, Any],
    alias: Alias,
    deployment: Deployment,
    lease: Lease,
    usage: Any,
    started: float,
    user: str | None,
) -> float | None:
    """Write the request's usage row (its input tokens, the provider's count or an estimate,
    and their cost) and settle its lease to them; the cost (None: unpriced)."""
    reported = usage.get("prompt_tokens") if isinstance(usage, dict) else None
    if isinstance(reported, int) and not isinstance(reported, bool) and reported >= 0:
        tokens, source = reported, "provider"
    else:
        tokens, source = count_embedding_input(body.get("input")), "estimated"
    price = deployment.price
    cost = price.cost(tokens, 0) if price is not None else None
    prices, price_source = price_columns(price.at(tokens)) if price is not None else (None, None)
    bill = Bill(
        {}, cost, prompt_tokens=tokens, source=source, prices=prices, price_source=price_source
    )
    meter_call(
        gateway,
        principal,
        deployment,
        "embeddings",
        alias=alias.name,
        started=started,
        user=user,
        bill=bill,
    )
    lease.settle(cost, tokens)
    return cost


def _user(body: dict[str, Any]) -> str | None:
    user = body.get("user")
    return user if isinstance(user, str) and "\x00" not in user else None


def conform(raw: bytes, body: dict[str, Any], deployment: str) -> tuple[bytes, Any]:
    """The upstream's answer with every vector in the asked `encoding_format` (`float` when
    absent), the bytes themselves when they already are; and its `usage`. An answer whose
    vectors are not `dimensions` long is a 400 naming the deployment."""
    fmt = body.get("encoding_format") or "float"
    dimensions = body.get("dimensions")
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return raw, None  # not ours to judge: the client gets what the upstream said
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list):
        return raw, None
    usage = answer.get("usage")
    changed = False
    for item in data:
        vector = item.get("embedding") if isinstance(item, dict) else None
        if isinstance(vector, str):
            floats = _from_base64(vector)
            if floats is None:
                return raw, usage
        elif isinstance(vector, list):
            floats = vector
        else:
            return raw, usage
        if dimensions is not None and len(floats) != dimensions:
            raise InvalidRequest(
                f"The deployment `{deployment}` does not honour 'dimensions': it answered"
                f" {len(floats)}-dimensional embeddings, not {dimensions}.",
                param="dimensions",
            )
        if fmt == "base64" and isinstance(vector, list):
            try:
                item["embedding"] = to_base64(vector)
            except struct.error:  # not a list of numbers
                return raw, usage
            changed = True
        elif fmt == "float" and isinstance(vector, str):
            item["embedding"] = floats
            changed = True
    return (orjson.dumps(answer) if changed else raw), usage


def to_base64(vector: list[float]) -> str:
    """OpenAI's base64 form: the vector as little-endian float32, base64-encoded."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _from_base64(text: str) -> list[float] | None:
    try:
        packed = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None
    if len(packed) % 4:
        return None
    return list(struct.unpack(f"<{len(packed) // 4}f", packed))
