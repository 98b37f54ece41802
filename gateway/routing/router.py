"""Model aliases to an ordered plan of deployments for one request.

A deployment is one provider + upstream model + endpoint, with its live health
(`gateway.routing.health`). The alias's strategy orders its own deployments (fallback by priority,
weighted random, least busy, lowest time to first token, cheapest for this request), then the
deployments of its `fallbacks` aliases follow in their own order. Deployments cooling down
are left out unless nothing else is available.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Any

from gateway.config import DeploymentConfig, GatewayConfig, ModelConfig, RetryConfig
from gateway.errors import ModelNotFound
from gateway.metering.keys import Principal
from gateway.metering.prices import Price, Resolved, load_price_file, resolve
from gateway.providers.base import Provider
from gateway.providers.demo import DemoProvider
from gateway.providers.openai_compatible import (
    AzureOpenAIProvider,
    OpenAICompatibleProvider,
    OpenAIResponsesProvider,
)
from gateway.routing.health import DeploymentHealth
from gateway.upstream.pool import UpstreamPool

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class Deployment:
    name: str
    alias: str
    provider_name: str
    upstream_model: str
    provider: Provider
    config: DeploymentConfig
    health: DeploymentHealth
    # Resolved at start (`price_deployment`): None for an unpriced deployment.
    priced: Resolved = field(default_factory=lambda: Resolved(None, "unpriced"))

    @property
    def route(self) -> dict[str, Any]:
        return {
            "provider": self.provider_name,
            "deployment": self.name,
            "model": self.upstream_model,
        }

    @property
    def price(self) -> Price | None:
        return self.priced.price

    def estimated_cost(self, prompt_tokens: int, completion_tokens: int) -> float | None:
        price = self.price
        return price.cost(prompt_tokens, completion_tokens) if price is not None else None


@dataclass(frozen=True)
class Alias:
    config: ModelConfig
    deployments: list[Deployment]

    @property
    def name(self) -> str:
        return self.config.name

    @property
    def retry(self) -> RetryConfig:
        return self.config.retry


def _provider(config: DeploymentConfig, model: str, pool: UpstreamPool) -> Provider:
    if config.provider == "demo":
        return DemoProvider(config, model)
    if config.provider == "anthropic":
        from gateway.providers.anthropic import AnthropicProvider

        return AnthropicProvider(config, pool, model)
    if config.provider == "azure":
        return AzureOpenAIProvider(config, pool, model)
    if config.api == "responses":
        return OpenAIResponsesProvider(config, pool, model)
    if config.provider == "litellm":
        # Imported only when configured: litellm takes seconds to import.
        from gateway.providers.litellm_adapter import LiteLLMProvider

        return LiteLLMProvider(config, model)
    return OpenAICompatibleProvider(config, pool, model)


def deployment_name(alias: str, index: int, config: DeploymentConfig) -> str:
    return config.name or f"{alias}/{index}-{config.provider}"


def price_deployment(
    config: DeploymentConfig, upstream_model: str, file: dict[str, Any] | None
) -> Resolved:
    """A deployment's price and where it came from (gateway.metering.prices.resolve)."""
    override: dict[str, Any] | None = None
    if config.price is not None and config.price != "free":
        override = config.price.model_dump(exclude_none=True)
    elif config.input_cost_per_mtok is not None and config.output_cost_per_mtok is not None:
        override = {
            "input_cost_per_token": config.input_cost_per_mtok / 1e6,
            "output_cost_per_token": config.output_cost_per_mtok / 1e6,
        }
    return resolve(
        upstream_model, config.provider, override=override, free=config.price == "free", file=file
    )


@dataclass(frozen=True)
class PricedDeployment:
    alias: str
    name: str
    provider: str
    model: str
    priced: Resolved


def price_list(config: GatewayConfig) -> list[PricedDeployment]:
    """Every deployment's price, as the router resolves it at start (no provider is made)."""
    file = load_price_file(config.prices) if config.prices is not None else None
    out = []
    for model in config.models:
        for i, dep in enumerate(model.deployments):
            upstream_model = dep.model or model.name
            priced = price_deployment(dep, upstream_model, file)
            name = deployment_name(model.name, i, dep)
            out.append(PricedDeployment(model.name, name, dep.provider, upstream_model, priced))
    return out


def estimate_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """A cheap (prompt, completion) token guess for ordering by cost: about 4 bytes a token."""
    messages = body.get("messages") or []
    prompt = sum(len(str(m.get("content") or "")) for m in messages if isinstance(m, dict)) // 4
    completion = body.get("max_completion_tokens") or body.get("max_tokens") or 512
    return max(1, prompt), int(completion) if isinstance(completion, int) else 512


class Router:
    def __init__(
        self,
        config: GatewayConfig,
        pool: UpstreamPool,
        rng: random.Random | None = None,
    ) -> None:
        self._aliases: dict[str, Alias] = {}
        self._rng = rng or random.Random()
        names: set[str] = set()
        # Prices resolve once, here: the price file is read at start, as the config is.
        file = load_price_file(config.prices) if config.prices is not None else None
        for model in config.models:
            deployments = []
            for i, dep in enumerate(model.deployments):
                upstream_model = dep.model or model.name
                name = deployment_name(model.name, i, dep)
                if name in names:
                    raise ValueError(f"deployment name {name!r} is used twice")
                names.add(name)
                health = DeploymentHealth(name, model.cooldown, dep.max_concurrency)
                provider = _provider(dep, upstream_model, pool)
                priced = price_deployment(dep, upstream_model, file)
                if priced.price is None:
                    log.warning(
                        "deployment %s (model %s) has no price, so a hard budget refuses its"
                        " requests (price_unknown) and its usage is recorded without cost: %s",
                        name,
                        upstream_model,
                        priced.why,
                    )
                deployments.append(
                    Deployment(
                        name,
                        model.name,
                        dep.provider,
                        upstream_model,
                        provider,
                        dep,
                        health,
                        priced,
                    )
                )
            self._aliases[model.name] = Alias(model, deployments)

    @property
    def aliases(self) -> list[str]:
        return list(self._aliases)

    def alias(self, name: object, principal: Principal | None = None) -> Alias:
        if (
            not isinstance(name, str)
            or name not in self._aliases
            or (principal is not None and not principal.may_use(name))
        ):
            raise ModelNotFound(
                f"The model `{name}` does not exist or you do not have access to it.", param="model"
            )
        return self._aliases[name]

    def deployments(self) -> list[Deployment]:
        return [d for a in self._aliases.values() for d in a.deployments]

    def plan(self, alias: Alias, body: dict[str, Any]) -> list[Deployment]:
        """Every deployment worth trying, best first."""
        ordered: list[Deployment] = []
        seen: set[str] = set()
        for name in [alias.name, *alias.config.fallbacks]:
            group = self._aliases[name]
            for deployment in self._order(group, body):
                if deployment.name not in seen:
                    seen.add(deployment.name)
                    ordered.append(deployment)
        available = [d for d in ordered if d.health.available()]
        if available:
            return available
        # Everything is cooling down or full: try the one that recovers first rather than fail.
        return sorted(ordered, key=lambda d: d.health.cooling_until)

    def _order(self, alias: Alias, body: dict[str, Any]) -> list[Deployment]:
        deployments = list(alias.deployments)
        if len(deployments) < 2:  # an order of one, whatever the strategy
            return deployments
        strategy = alias.config.strategy
        if strategy == "fallback":
            return sorted(deployments, key=lambda d: d.config.priority)
        if strategy == "weighted":
            # Weighted sampling without replacement (Efraimidis-Spirakis keys).
            return sorted(
                deployments, key=lambda d: -(self._rng.random() ** (1.0 / d.config.weight))
            )
        if strategy == "least_busy":
            return sorted(deployments, key=lambda d: d.health.in_flight)
        if strategy == "latency":
            # Unmeasured deployments first, so each gets measured.
            return sorted(
                deployments,
                key=lambda d: d.health.ttft_ms if d.health.ttft_ms is not None else -1.0,
            )
        prompt, completion = estimate_tokens(body)
        costs = {d.name: d.estimated_cost(prompt, completion) for d in deployments}
        return sorted(
            deployments,
            key=lambda d: (costs[d.name] is None, costs[d.name] or 0.0, d.config.priority),
        )
