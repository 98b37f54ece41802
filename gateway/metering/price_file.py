"""The operator's price file (`prices:`), read and checked: model ids to entries with litellm's
price fields, in JSON or YAML. Depends on nothing above the configuration, which checks the file
with it when it is loaded; gateway.metering.prices resolves each deployment's price from it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

# litellm's names for the prices the gateway bills by (USD per token), and the output bound.
INPUT = "input_cost_per_token"
OUTPUT = "output_cost_per_token"
CACHE_READ = "cache_read_input_token_cost"
CACHE_WRITE = "cache_creation_input_token_cost"  # Anthropic's 5-minute cache write
CACHE_WRITE_1H = "cache_creation_input_token_cost_above_1hr"  # its 1-hour cache write
MAX_OUTPUT = "max_output_tokens"
AUDIO_INPUT = "input_cost_per_audio_token"
AUDIO_OUTPUT = "output_cost_per_audio_token"
PRICE_FIELDS = (INPUT, OUTPUT, CACHE_READ, CACHE_WRITE, CACHE_WRITE_1H)


def number(entry: Mapping[str, Any], name: str) -> float | None:
    value = entry.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        return None
    return float(value)


def load_price_file(path: str) -> dict[str, dict[str, Any]]:
    """The operator's price file: model ids to entries with litellm's fields, in JSON or YAML.
    ValueError names what is wrong."""
    import yaml

    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot read the price file {path}: {exc.strerror}") from None
    try:
        data = orjson.loads(text)
    except orjson.JSONDecodeError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            problem = getattr(exc, "problem", None) or str(exc)
            raise ValueError(f"the price file {path} is not JSON or YAML: {problem}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"the price file {path} must map model ids to prices")
    out: dict[str, dict[str, Any]] = {}
    for name, entry in data.items():
        if name == "sample_spec":  # litellm's description of its fields, in a copied map
            continue
        where = f"the price file {path}: {name!r}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping of litellm's price fields")
        entry = {k: _yaml_number(v) if "cost" in k else v for k, v in entry.items()}
        for field in PRICE_FIELDS:
            if field in entry and number(entry, field) is None:
                raise ValueError(f"{where}: {field} must be a number >= 0 (USD per token)")
        for field in (INPUT, OUTPUT):
            if field not in entry:
                raise ValueError(f"{where} has no {field}")
        limit = entry.get(MAX_OUTPUT)
        if limit is not None and (not isinstance(limit, int) or limit < 1):
            raise ValueError(f"{where}: {MAX_OUTPUT} must be a positive integer")
        out[str(name)] = entry
    return out


def _yaml_number(value: Any) -> Any:
    """YAML 1.1 reads `3e-06` (no dot) as a string: the number it means."""
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            return value
        return number if math.isfinite(number) else value
    return value
