"""Model aliases to an ordered plan of deployments for one request.

A deployment is one provider + upstream model + endpoint, with its live health
(`gateway.routing.health`). The alias's strategy orders its own deployments (fallback by priority,
weighted random, least busy, lowest time to first token, cheapest for this request), then the
deployments of its `fallbacks` aliases follow in their own order. Deployments cooling down
are left out unless nothing else is available.

An alias whose name ends in `*` is a pattern (`openai/*`, `claude-*`, `*`): it serves every
requested id that starts with its literal prefix, exact aliases first, then the longest pattern.
A deployment of it whose `model` holds a `*` sends that `*` replaced by what the alias's `*`
matched (`model: "*"` under `openai/*`: `openai/gpt-4.1` -> `gpt-4.1`), priced for that model.
Each id so resolved is an alias of its own, made once and kept (the most recent few hundred),
whose deployments share their pattern deployment's name and health.
"""

from __future__ import annotations

import logging
import random
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from gateway import logs
from gateway.config import (
    DeploymentConfig,
    DeploymentPrice,
    GatewayConfig,
    ModelConfig,
    RetryConfig,
)
from gateway.errors import ModelNotFound
from gateway.metering.call_prices import CallPrices
from gateway.metering.keys import Principal
from gateway.metering.price_file import load_price_file
from gateway.metering.prices import Price, Resolved, resolve
from gateway.providers.base import Provider
from gateway.providers.demo import DemoProvider
from gateway.providers.openai_compatible import (
    AzureOpenAIProvider,
    OpenAICompatibleProvider,
    OpenAIResponsesProvider,
)
from gateway.routing.health import DeploymentHealth
from gateway.storage.records import Route
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
    def route(self) -> Route:
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
    # The id the client asked for, when a pattern alias (`config.name` ends in `*`) serves it.
    requested: str | None = None

    @property
    def name(self) -> str:
        """The configured alias (a pattern's own name, `openai/*`): what metrics, limits and
        usage rows group by; `model` is the id the client sent."""
        return self.config.name

    @property
    def model(self) -> str:
        """The model id as the client sent it: the alias, or what a pattern matched."""
        return self.requested or self.config.name

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
        # Groq, Mistral and Cohere's chat: litellm's names, the gateway's own reading.
        from gateway.providers.native_routes import native_provider

        if (native := native_provider(config, pool, model)) is not None:
            return native
        # Imported only when configured: litellm takes seconds to import.
        from gateway.providers.litellm_adapter import LiteLLMProvider

        return LiteLLMProvider(config, model)
    return OpenAICompatibleProvider(config, pool, model)


def is_pattern(alias: str) -> bool:
    return alias.endswith("*")


def serves(aliases: Iterable[str], name: str) -> bool:
    """Whether the configured `aliases` serve the model id `name`: one is it, or is a
    pattern whose prefix it has."""
    return any(a == name or (is_pattern(a) and name.startswith(a[:-1])) for a in aliases)


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


def estimate_tokens(body: Mapping[str, Any]) -> tuple[int, int]:
    """A cheap (prompt, completion) token guess for ordering by cost: about 4 bytes a token."""
    messages = body.get("messages") or []
    prompt = sum(len(str(m.get("content") or "")) for m in messages if isinstance(m, dict)) // 4
    completion = body.get("max_completion_tokens") or body.get("max_tokens") or 512
    return max(1, prompt), int(completion) if isinstance(completion, int) else 512


_PATTERN = object()  # a deployment whose price depends on the model it is sent
_LOGGED_NAME = 256  # characters of an unknown model's name kept for the access log
# How many ids served by pattern aliases are kept resolved (their providers made, prices looked
# up); the least recently used goes first.
RESOLVED_IDS = 512


class Router:
    def __init__(
        self,
        config: GatewayConfig,
        pool: UpstreamPool,
        rng: random.Random | None = None,
        healths: Mapping[str, DeploymentHealth] | None = None,
    ) -> None:
        """`healths`: a previous router's deployments' live state by name (a config reload):
        a deployment configured as before keeps its cooldown, in-flight count and latency."""
        self._aliases: dict[str, Alias] = {}
        self._rng = rng or random.Random()
        self._pool = pool
        names: set[str] = set()
        # Prices resolve once, here: the price file is read at start, as the config is.
        file = self._price_file = (
            load_price_file(config.prices) if config.prices is not None else None
        )
        for model in config.models:
            deployments = []
            for i, dep in enumerate(model.deployments):
                upstream_model = dep.model or model.name
                name = deployment_name(model.name, i, dep)
                if name in names:
                    raise ValueError(f"deployment name {name!r} is used twice")
                names.add(name)
                health = (healths or {}).get(name)
                if health is None or (health.cooldown, health.max_concurrency) != (
                    model.cooldown,
                    dep.max_concurrency,
                ):
                    health = DeploymentHealth(name, model.cooldown, dep.max_concurrency)
                provider = _provider(dep, upstream_model, pool)
                priced = price_deployment(dep, upstream_model, file)
                if priced.price is None and "*" not in upstream_model:
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
        self._exact = {n: a for n, a in self._aliases.items() if not is_pattern(n)}
        # Pattern aliases, longest literal prefix first: the first that matches wins.
        self._patterns = sorted(
            (a for a in self._aliases.values() if is_pattern(a.name)),
            key=lambda a: -len(a.name),
        )
        self._resolved: OrderedDict[tuple[str, str], Alias] = OrderedDict()
        self._by_name = {d.name: d for a in self._aliases.values() for d in a.deployments}
        self._prices = {
            d.name: d.price for d in self._by_name.values() if "*" not in d.upstream_model
        }
        self._model_prices: dict[tuple[str, str], Resolved] = {}

    @property
    def aliases(self) -> list[str]:
        return list(self._aliases)

    def alias(self, name: object, principal: Principal | None = None) -> Alias:
        found = self._exact.get(name) if isinstance(name, str) else None  # the usual case
        if found is None and isinstance(name, str):
            found = self.find(name)
        if found is None or (
            principal is not None
            and principal.models is not None
            and not principal.may_use(found.model, found.config.name)
        ):
            # The access log names what the client asked for, even when nothing serves it.
            logs.annotate(alias=name[:_LOGGED_NAME] if isinstance(name, str) else None)
            raise ModelNotFound(
                f"The model `{name}` does not exist or you do not have access to it.", param="model"
            )
        return found

    def known(self, name: str) -> bool:
        """Whether `name` is an alias, or an id a pattern alias serves (keys' model lists)."""
        return serves(self._aliases, name)

    def find(self, name: str) -> Alias | None:
        """The alias serving the model id `name`: an exact alias, else the longest pattern
        whose prefix it has (resolved for that id); None when none does."""
        exact = self._aliases.get(name)
        if exact is not None and not is_pattern(name):
            return exact
        for pattern in self._patterns:
            prefix = pattern.name[:-1]
            if name.startswith(prefix):
                return self._resolved_for(pattern, name, name[len(prefix) :])
        return None

    def _resolved_for(self, pattern: Alias, requested: str, matched: str) -> Alias:
        """`pattern` serving `requested`, whose part its `*` stands for is `matched`: each
        deployment sending the model that names, priced for it, sharing the pattern
        deployment's name and health. Made once, kept among the most recently used."""
        key = (pattern.name, requested)
        resolved = self._resolved.get(key)
        if resolved is not None:
            self._resolved.move_to_end(key)
            return resolved
        deployments = []
        for template in pattern.deployments:
            model = template.upstream_model.replace("*", matched, 1)
            if model == template.upstream_model:
                deployments.append(template)
                continue
            deployments.append(
                replace(
                    template,
                    upstream_model=model,
                    provider=_provider(template.config, model, self._pool),
                    priced=price_deployment(template.config, model, self._price_file),
                )
            )
        resolved = self._resolved[key] = Alias(pattern.config, deployments, requested)
        if len(self._resolved) > RESOLVED_IDS:
            self._resolved.popitem(last=False)
        return resolved

    def call_prices(self, deployment: Deployment) -> CallPrices:
        """The price entries of what the deployment is sent, for calls billed by other units
        than tokens (gateway.metering.call_prices)."""
        config = deployment.config
        own = (
            config.price.model_dump(exclude_none=True)
            if isinstance(config.price, DeploymentPrice)
            else None
        )
        return CallPrices(
            deployment.upstream_model,
            config.provider,
            own=own,
            file=self._price_file,
            free=config.price == "free",
        )

    def price_of(self, deployment: str, model: str) -> Price | None:
        """The price of `model` sent to the deployment named `deployment` (a pattern
        deployment's price depends on the model it sent); None when unpriced or unknown."""
        price = self._prices.get(deployment, _PATTERN)
        if price is not _PATTERN:  # a deployment of one model: its price, resolved at start
            return price  # type: ignore[return-value]
        template = self._by_name.get(deployment)
        if template is None:
            return None
        if model == template.upstream_model:
            return template.price
        priced = self._model_prices.get((deployment, model))
        if priced is None:
            priced = price_deployment(template.config, model, self._price_file)
            if len(self._model_prices) >= RESOLVED_IDS:
                self._model_prices.pop(next(iter(self._model_prices)))
            self._model_prices[deployment, model] = priced
        return priced.price

    def deployment(self, name: str) -> Deployment | None:
        """The configured deployment of this name (a pattern's as configured)."""
        return self._by_name.get(name)

    def deployments(self) -> list[Deployment]:
        return [d for a in self._aliases.values() for d in a.deployments]

    def plan(self, alias: Alias, body: Mapping[str, Any]) -> list[Deployment]:
        """Every deployment worth trying, best first (`body`: the request's `ChatBody`, empty
        for a call that has none)."""
        if not alias.config.fallbacks and len(alias.deployments) == 1:
            # Tried whatever its health, as the only one: asking moves one that has cooled
            # down to half-open, so that this request is its probe.
            only = alias.deployments[0]
            only.health.available()
            return [only]
        ordered: list[Deployment] = []
        seen: set[str] = set()
        groups = [alias]
        groups += [self._fallback(alias, name) for name in alias.config.fallbacks]
        for group in groups:
            for deployment in self._order(group, body):
                if deployment.name not in seen:
                    seen.add(deployment.name)
                    ordered.append(deployment)
        available = [d for d in ordered if d.health.available()]
        if available:
            return available
        # Everything is cooling down or full: try the one that recovers first rather than fail.
        return sorted(ordered, key=lambda d: d.health.cooling_until)

    def reaches(self, alias: Alias, wire: str) -> bool:
        """Some deployment of the alias or of its fallbacks speaks `wire`: one its plan may
        hold, whatever their health."""
        groups = [alias, *(self._fallback(alias, name) for name in alias.config.fallbacks)]
        return any(d.provider.wire == wire for group in groups for d in group.deployments)

    def _fallback(self, alias: Alias, name: str) -> Alias:
        """A fallback alias of `alias`; a pattern one serves what `alias`'s `*` matched (the
        whole requested id, behind an exact alias)."""
        group = self._aliases[name]
        if not is_pattern(name):
            return group
        model = alias.model
        if is_pattern(alias.name):
            model = model[len(alias.name) - 1 :]
        return self._resolved_for(group, group.name[:-1] + model, model)

    def _order(self, alias: Alias, body: Mapping[str, Any]) -> list[Deployment]:
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
