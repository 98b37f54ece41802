"""Model aliases to ordered deployments.

A deployment is one provider + upstream model + endpoint. This version tries an alias's
deployments in the order the config lists them (a fallback chain); routing strategies,
cooldowns and retry policy build on this list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import aiohttp

from gateway.config import DeploymentConfig, GatewayConfig
from gateway.errors import ModelNotFound
from gateway.providers.base import Provider
from gateway.providers.demo import DemoProvider
from gateway.providers.openai_compatible import OpenAICompatibleProvider


@dataclass(frozen=True)
class Deployment:
    name: str
    alias: str
    provider_name: str
    upstream_model: str
    provider: Provider

    @property
    def route(self) -> dict[str, Any]:
        return {
            "provider": self.provider_name,
            "deployment": self.name,
            "model": self.upstream_model,
        }


def _provider(config: DeploymentConfig, model: str, session: aiohttp.ClientSession) -> Provider:
    if config.provider == "demo":
        return DemoProvider(config, model)
    return OpenAICompatibleProvider(config, session, model)


class Router:
    def __init__(self, config: GatewayConfig, session: aiohttp.ClientSession) -> None:
        self._aliases: dict[str, list[Deployment]] = {}
        for model in config.models:
            deployments = []
            for i, dep in enumerate(model.deployments):
                upstream_model = dep.model or model.name
                name = dep.name or f"{model.name}/{i}-{dep.provider}"
                deployments.append(
                    Deployment(
                        name,
                        model.name,
                        dep.provider,
                        upstream_model,
                        _provider(dep, upstream_model, session),
                    )
                )
            self._aliases[model.name] = deployments

    @property
    def aliases(self) -> list[str]:
        return list(self._aliases)

    def plan(self, alias: object) -> list[Deployment]:
        if not isinstance(alias, str) or alias not in self._aliases:
            raise ModelNotFound(
                f"The model `{alias}` does not exist or you do not have access to it.",
                param="model",
            )
        return self._aliases[alias]
