"""What a request reserves against its key's and team's limits, before any upstream call.

A hard budget holds because each request reserves the most it may cost, at the priciest
deployment of its plan:

- its prompt: the messages (images, audio and files by their provider's rules,
  gateway.metering.tokens) and what the model reads besides them, tool definitions and output
  schemas (gateway.metering.request_tokens);
- `n` times the output bound each deployment is actually sent (gateway.providers.output_bounds:
  an Anthropic deployment's includes the thinking budget a `reasoning_effort` becomes), else the
  model's own limit from its price (the price entry's `max_output_tokens`, else the bundled
  map's). Where neither is known, a hard budget refuses the request (403 `price_unknown`) rather
  than guess.

The real cost replaces the reservation when the turn ends. The TPM window takes the prompt and
`n` times the largest bound sent, else 1,024 tokens a choice, corrected likewise.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gateway.dialects.requests import check_output_params, choices
from gateway.errors import PriceUnknown
from gateway.metering.keys import Principal
from gateway.metering.limits import Lease, Limiter, Limits, scopes_of
from gateway.metering.prices import require_price
from gateway.metering.request_tokens import prompt_extras
from gateway.metering.tokens import count_embedding_input, tally_messages, vendor_of
from gateway.providers.output_bounds import sent_output_bound
from gateway.routing.router import Deployment

# The completion a request is assumed to take where no bound is known (the TPM window, a soft
# budget), a choice.
DEFAULT_COMPLETION_ESTIMATE = 1024


async def admit(
    limiter: Limiter,
    principal: Principal,
    body: Mapping[str, Any],
    plan: list[Deployment],
    *,
    embeddings: bool = False,
    user: str | None = None,
) -> Lease:
    """Rate limits and budgets: a 400 for an output bound or `n` that no reservation could
    honour, a 403 for a deployment a hard budget could not meter, a 429 when a limit is
    reached. An embeddings request (`embeddings`) reserves its input alone. `user`, the end
    user, is admitted too where its key or team sets `end_user` limits. The lease carries
    what the request sends besides its messages, for an estimate of its prompt at its end."""
    scopes = scopes_of(
        principal.key_limits, principal.team_limits, principal.key_id, principal.team_id, user
    )
    if embeddings:
        return await _admit_embeddings(limiter, scopes, body, plan)
    check_output_params(body)
    require_price(scopes, plan)  # 403 price_unknown: a hard budget cannot meter an unpriced one
    extras = prompt_extras(body)
    if not any(s[2].tpm or s[2].budget for s in scopes):
        lease = await limiter.admit(scopes, 0, 0.0)  # only counts: no estimate needed
        lease.extras = extras
        return lease
    n = choices(body)
    prompt_of = tally_messages(body.get("messages") or []).tokens
    hard = _hard(scopes)
    cost = 0.0
    largest: int | None = None  # the largest bound any deployment is sent
    for deployment in plan:
        sent = sent_output_bound(body, deployment)
        if sent is not None and (largest is None or sent > largest):
            largest = sent
        price = deployment.price
        if price is None:
            continue
        model, provider = deployment.upstream_model, deployment.provider_name
        vendor = vendor_of(provider, model)
        prompt = prompt_of(vendor, model) + (extras.tokens(vendor, wait=False) if extras else 0)
        most = sent or price.max_output_tokens
        if most is None:
            if hard is not None and price.output > 0:
                _refuse_unbounded(hard, deployment)
            most = DEFAULT_COMPLETION_ESTIMATE
        cost = max(cost, price.cost(prompt, n * most))
    # The TPM estimate: OpenAI's rules for what is not text (the tokens, not their price).
    tokens = prompt_of("openai", None) + (extras.tokens(wait=False) if extras else 0)
    tokens += n * (largest or DEFAULT_COMPLETION_ESTIMATE)
    lease = await limiter.admit(scopes, tokens, cost)
    lease.extras = extras
    return lease


async def _admit_embeddings(
    limiter: Limiter,
    scopes: list[tuple[str, str, Limits]],
    body: Mapping[str, Any],
    plan: list[Deployment],
) -> Lease:
    require_price(scopes, plan)
    if not any(s[2].tpm or s[2].budget for s in scopes):
        return await limiter.admit(scopes, 0, 0.0)
    prompt = count_embedding_input(body.get("input"))
    prices = [d.price for d in plan if d.price is not None]
    return await limiter.admit(
        scopes, prompt, max((p.cost(prompt, 0) for p in prices), default=0.0)
    )


def _hard(scopes: list[tuple[str, str, Limits]]) -> tuple[str, str] | None:
    """The first scope with a hard budget, if any."""
    for kind, ident, limits in scopes:
        if limits.budget is not None and limits.budget.mode == "hard":
            return kind, ident
    return None


def _refuse_unbounded(scope: tuple[str, str], deployment: Deployment) -> None:
    kind, ident = scope
    raise PriceUnknown(
        f"The {kind} {ident!r} has a hard budget, and this request sets no output bound while"
        f" the deployment {deployment.name!r} (model {deployment.upstream_model!r}) it may"
        " reach has no known output limit (no max_output_tokens in its price, nor in the"
        " bundled model map), so the most it may cost could not be reserved. Set an output"
        " bound (max_completion_tokens, max_tokens or max_output_tokens), or give the price"
        " entry a max_output_tokens.",
        param="max_tokens",
    )
