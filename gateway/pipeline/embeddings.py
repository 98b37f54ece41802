"""An embeddings request: routed by the same aliases, strategies and retries as a turn, and
answered with the upstream's body unchanged. Nothing of it is recorded as a conversation."""

from __future__ import annotations

import asyncio
from typing import Any

from gateway.context import Gateway
from gateway.errors import InvalidRequest, UpstreamError, UpstreamTimeout
from gateway.metering.keys import Principal
from gateway.routing.retry import RetryPlan


async def run_embeddings(
    gateway: Gateway, principal: Principal, body: dict[str, Any]
) -> tuple[bytes, dict[str, str]]:
    """The upstream's JSON answer and the response headers; the last `UpstreamError` when
    every deployment failed."""
    router = gateway.routes
    alias = router.alias(body["model"], principal)
    plan = [d for d in router.plan(alias, body) if hasattr(d.provider, "embeddings")]
    if not plan:
        raise InvalidRequest(
            f"The model `{alias.name}` has no deployment that serves embeddings.", param="model"
        )
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
        headers = {
            "X-Gateway-Deployment": deployment.name,
            "X-Gateway-Attempts": str(retries.attempts),
        }
        return raw, headers
    assert retries.last_error is not None
    retries.last_error.headers["X-Gateway-Attempts"] = str(retries.attempts)
    raise retries.last_error
