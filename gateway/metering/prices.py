"""Prices per token: litellm's bundled price map, read offline, with per-deployment overrides.

The map ships inside the litellm package (`model_prices_and_context_window_backup.json`); it is
read as a file, without importing litellm (seconds) and without the network.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import orjson

_MAP_FILE = "model_prices_and_context_window_backup.json"


@dataclass(frozen=True)
class Price:
    input: float  # USD per prompt token
    output: float  # USD per completion token
    cached_input: float | None = None  # USD per cached prompt token, when cheaper
    source: str = "litellm"

    def cost(self, prompt: int, completion: int, cached: int = 0) -> float:
        cached = min(cached, prompt) if self.cached_input is not None else 0
        total = (prompt - cached) * self.input + completion * self.output
        if cached:
            assert self.cached_input is not None
            total += cached * self.cached_input
        return round(total, 10)


@cache
def price_map() -> dict[str, Any]:
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return {}
    path = Path(next(iter(spec.submodule_search_locations))) / _MAP_FILE
    try:
        data: dict[str, Any] = orjson.loads(path.read_bytes())
    except OSError:
        return {}
    return data


def lookup(model: str, provider: str | None = None) -> Price | None:
    """The price of an upstream model id, trying `provider/model` and the bare id."""
    prices = price_map()
    candidates = [model]
    if provider:
        candidates.insert(0, f"{provider}/{model}")
    if "/" in model:
        candidates.append(model.split("/", 1)[1])
    for name in candidates:
        entry = prices.get(name)
        if isinstance(entry, dict) and "input_cost_per_token" in entry:
            return Price(
                input=float(entry["input_cost_per_token"]),
                output=float(entry.get("output_cost_per_token") or 0.0),
                cached_input=entry.get("cache_read_input_token_cost"),
            )
    return None


def deployment_price(
    model: str,
    provider: str,
    input_per_mtok: float | None,
    output_per_mtok: float | None,
) -> Price | None:
    """A deployment's price: its config override when set, else the map's."""
    if input_per_mtok is not None and output_per_mtok is not None:
        return Price(input_per_mtok / 1e6, output_per_mtok / 1e6, source="config")
    return lookup(model, provider)
