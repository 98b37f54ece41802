"""The README documents every config field and every route."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from gateway.app import create_app
from gateway.config import (
    DeploymentConfig,
    GatewayConfig,
    ModelConfig,
    TimeoutsConfig,
    parse_config,
)

README = (Path(__file__).parents[1] / "README.md").read_text()


def _fields(model: type[BaseModel], prefix: str) -> list[str]:
    out = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out += _fields(annotation, f"{prefix}{name}.")
        else:
            out.append(prefix + name)
    return out


def test_every_config_field_is_in_the_readme() -> None:
    names = [f for f in _fields(GatewayConfig, "") if f != "models"]
    names += _fields(ModelConfig, "models[].")
    names += _fields(DeploymentConfig, "deployments[].")
    assert all(f"deployments[].timeouts.{f}" in names for f in TimeoutsConfig.model_fields)
    missing = [n for n in names if f"`{n}`" not in README]
    assert missing == []


def test_every_route_is_in_the_readme() -> None:
    app = create_app(parse_config({}).config)
    paths = {r.resource.canonical for r in app.router.routes() if r.resource is not None}
    missing = [p for p in paths if p not in README]
    assert missing == []


def test_every_metric_is_in_the_readme() -> None:
    from gateway.metrics import REGISTRY

    names = {m.name for m in REGISTRY.collect()}
    # prometheus-client drops the _total suffix from counter family names.
    missing = [n for n in names if f"`{n}`" not in README and f"`{n}_total`" not in README]
    assert missing == []
