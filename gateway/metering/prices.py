"""Prices per token, resolved once at start for every deployment.

Where a deployment's price comes from, the first that has one:

1. the config: the deployment's `price` (`free`, or litellm's fields), or its
   `input_cost_per_mtok` and `output_cost_per_mtok`;
2. the operator's price file (the top-level `prices:`), an entry for the upstream model id;
3. litellm's bundled price map (`model_prices_and_context_window_backup.json`, read as a file:
   without importing litellm, which takes seconds, and without the network);

else the deployment is *unpriced*, and says why (the built-in `demo` too, unless its config
says `price: free`). A price from the config or the file without `max_output_tokens` takes the
model's from the map (`output_limit`): what a request without an output bound reserves.

In the file and the map a model id is looked up as written; then with its provider's prefix
added (`anthropic/`, `azure/`, `openai/`) or the prefix it has taken off (`gemini/x` -> `x`);
then, for a dated id (`-20250514`, `-2024-08-06`), its undated family, the same ways. An entry
found by a prefix must belong to that prefix's provider (its `litellm_provider`), and an
`anthropic` or `azure` deployment takes only its own provider's entries, so a price never comes
from another provider's entry. Nothing else is guessed: a model the file and the map do not
hold is unpriced, and a hard budget refuses its requests (`require_price`).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from gateway.errors import PriceUnknown
from gateway.metering.price_file import (
    AUDIO_INPUT,
    AUDIO_OUTPUT,
    CACHE_READ,
    CACHE_WRITE,
    CACHE_WRITE_1H,
    INPUT,
    MAX_OUTPUT,
    OUTPUT,
    number,
)

if TYPE_CHECKING:
    from gateway.metering.limits import Limits

_MAP_FILE = "model_prices_and_context_window_backup.json"

# A price for prompts above a number of tokens (`input_cost_per_token_above_200k_tokens`), for
# each kind of token; a service tier's or batch's own (`..._priority`) is not read.
_TIER_KEY = re.compile(
    rf"^({CACHE_WRITE_1H}|{CACHE_WRITE}|{CACHE_READ}|{INPUT}|{OUTPUT})_above_(\d+)(k?)_tokens$"
)

# The prefix a provider's entries carry in litellm's map, and the `litellm_provider` they name.
_NAMESPACE = {"openai": "openai", "azure": "azure", "anthropic": "anthropic"}
# Entries an `anthropic` or `azure` deployment may take; the others call any model by its id.
_OWN_ENTRIES_ONLY = {
    "anthropic": ("anthropic",),
    "azure": ("azure", "azure_text"),
    "bedrock": ("bedrock", "bedrock_converse"),
}
_DATED = re.compile(r"^(.+?)(?:-\d{8}|-\d{4}-\d{2}-\d{2})$")

SOURCES = {"map": "bundled map", "file": "price file", "config": "config", "free": "free"}


@dataclass(frozen=True)
class Tier:
    """The prices of a prompt of more than `above` tokens, each kind of token that has one."""

    above: int
    input: float | None = None
    output: float | None = None
    cache_read: float | None = None
    cache_write: float | None = None
    cache_write_1h: float | None = None


@dataclass(frozen=True)
class Price:
    """USD per token, and where it came from. A price the entry does not give is billed as the
    next one that is: a 1-hour cache write as a 5-minute one, a cache write or read as input."""

    input: float
    output: float
    cache_read: float | None = None
    cache_write: float | None = None  # 5-minute cache write
    cache_write_1h: float | None = None
    max_output_tokens: int | None = None
    source: str = "map"  # map | file | config | free
    entry: str | None = None  # the id of the map's or the file's entry
    # Dearer prices for longer prompts (Gemini's above 200k tokens), by `above`, lowest first.
    tiers: tuple[Tier, ...] = ()
    # Audio tokens (inside the prompt's and the completion's counts), where they cost more.
    audio_input: float | None = None
    audio_output: float | None = None
    # OpenAI's service tiers the entry prices (`priority`, `flex`): (tier, input, output,
    # cache read), a price the tier does not give being the default tier's.
    service_tiers: tuple[tuple[str, float | None, float | None, float | None], ...] = ()

    def for_service_tier(self, tier: object) -> Price:
        """The price of an answer the provider says it served at `tier` (its `service_tier`);
        this one for the default tier, or a tier the entry does not price."""
        for name, input_price, output_price, cache_read in self.service_tiers:
            if name == tier:
                return replace(
                    self,
                    input=input_price if input_price is not None else self.input,
                    output=output_price if output_price is not None else self.output,
                    cache_read=cache_read if cache_read is not None else self.cache_read,
                    service_tiers=(),
                )
        return self

    def at(self, prompt: int) -> Price:
        """The flat price a prompt of `prompt` tokens is billed at: the highest tier it is above
        (as litellm's cost_per_token picks it), each kind of token the tier does not price at
        this price's own."""
        tier = None
        for candidate in self.tiers:
            if prompt > candidate.above:
                tier = candidate
        if tier is None:
            return self

        def pick(own: float | None, base: float | None) -> float | None:
            return own if own is not None else base

        return replace(
            self,
            input=pick(tier.input, self.input) or 0.0,
            output=pick(tier.output, self.output) or 0.0,
            cache_read=pick(tier.cache_read, self.cache_read),
            cache_write=pick(tier.cache_write, self.cache_write),
            cache_write_1h=pick(tier.cache_write_1h, self.cache_write_1h),
            tiers=(),
        )

    @property
    def where(self) -> str:
        """Where it came from, as `gateway prices` says it."""
        label = SOURCES.get(self.source, self.source)
        return f"{label} ({self.entry})" if self.entry else label

    def cost(
        self,
        prompt: int,
        completion: int,
        cached: int = 0,
        cache_write: int = 0,
        cache_write_1h: int = 0,
        audio_in: int = 0,
        audio_out: int = 0,
    ) -> float:
        """The cost of `prompt` input tokens, of which `cached` were read from the cache,
        `cache_write` / `cache_write_1h` written to it (5 minutes, 1 hour) and `audio_in` were
        audio, and `completion` output tokens (reasoning included: it is output), `audio_out`
        of them audio, at the tier the prompt is in."""
        flat = self.at(prompt) if self.tiers else self
        cached = max(0, min(cached, prompt))
        cache_write = max(0, min(cache_write, prompt - cached))
        cache_write_1h = max(0, min(cache_write_1h, prompt - cached - cache_write))
        plain = prompt - cached - cache_write - cache_write_1h
        audio = 0.0
        if audio_in and self.audio_input is not None:
            audio_in = min(audio_in, plain)
            plain -= audio_in
            audio += audio_in * self.audio_input
        if audio_out and self.audio_output is not None:
            audio_out = min(audio_out, completion)
            completion -= audio_out
            audio += audio_out * self.audio_output
        write = flat.cache_write if flat.cache_write is not None else flat.input
        write_1h = flat.cache_write_1h if flat.cache_write_1h is not None else write
        read = flat.cache_read if flat.cache_read is not None else flat.input
        total = (
            plain * flat.input
            + cached * read
            + cache_write * write
            + cache_write_1h * write_1h
            + completion * flat.output
            + audio
        )
        return round(total, 10)


FREE = Price(0.0, 0.0, 0.0, 0.0, 0.0, source="free")


@cache
def price_columns(price: Price) -> tuple[str, str]:
    """A usage row's `prices` (the unit prices it is charged at, USD per token, as JSON: each
    kind of token at what `Price.cost` bills it) and `price_source` (`Price.where`), made once
    a price: what a report shows and re-rates a row by."""
    write = price.cache_write if price.cache_write is not None else price.input
    units = {
        "input": price.input,
        "output": price.output,
        "cache_read": price.cache_read if price.cache_read is not None else price.input,
        "cache_write_5m": write,
        "cache_write_1h": price.cache_write_1h if price.cache_write_1h is not None else write,
        "audio_input": price.audio_input if price.audio_input is not None else price.input,
        "audio_output": price.audio_output if price.audio_output is not None else price.output,
    }
    return orjson.dumps(units).decode(), price.where


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


def map_version() -> str:
    """The litellm release whose bundled map prices are read from."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"litellm {version('litellm')}"
    except PackageNotFoundError:
        return "litellm not installed"


def price_of_entry(entry: Mapping[str, Any], source: str, name: str | None) -> Price | None:
    """A Price from an entry with litellm's fields; None without an input price."""
    input_price = number(entry, INPUT)
    if input_price is None:
        return None
    limit = entry.get(MAX_OUTPUT)
    return Price(
        input=input_price,
        output=number(entry, OUTPUT) or 0.0,
        cache_read=number(entry, CACHE_READ),
        cache_write=number(entry, CACHE_WRITE),
        cache_write_1h=number(entry, CACHE_WRITE_1H),
        max_output_tokens=limit if isinstance(limit, int) and limit > 0 else None,
        source=source,
        entry=name,
        tiers=_tiers(entry),
        audio_input=number(entry, AUDIO_INPUT),
        audio_output=number(entry, AUDIO_OUTPUT),
        service_tiers=_service_tiers(entry),
    )


# The service tiers OpenAI answers with that its entries price, by their fields' suffix.
_SERVICE_TIERS = ("priority", "flex")


def _service_tiers(
    entry: Mapping[str, Any],
) -> tuple[tuple[str, float | None, float | None, float | None], ...]:
    out = []
    for tier in _SERVICE_TIERS:
        prices = (
            number(entry, f"{INPUT}_{tier}"),
            number(entry, f"{OUTPUT}_{tier}"),
            number(entry, f"{CACHE_READ}_{tier}"),
        )
        if any(price is not None for price in prices):
            out.append((tier, *prices))
    return tuple(out)


_TIER_FIELDS = {
    INPUT: "input",
    OUTPUT: "output",
    CACHE_READ: "cache_read",
    CACHE_WRITE: "cache_write",
    CACHE_WRITE_1H: "cache_write_1h",
}


def _tiers(entry: Mapping[str, Any]) -> tuple[Tier, ...]:
    """An entry's prices above a prompt length, by length (none for most entries)."""
    found: dict[int, dict[str, float]] = {}
    for key in entry:
        if "_above_" not in key or not key.endswith("_tokens"):  # the usual key: no regex
            continue
        match = _TIER_KEY.match(key)
        value = number(entry, key)
        if match is None or value is None:
            continue
        above = int(match.group(2)) * (1000 if match.group(3) else 1)
        found.setdefault(above, {})[_TIER_FIELDS[match.group(1)]] = value
    return tuple(Tier(above, **prices) for above, prices in sorted(found.items()))


# Route segments litellm puts between a provider's prefix and the model id.
_ROUTES = {"bedrock": ("converse", "invoke", "converse_like")}


def candidates(model: str, provider: str) -> list[tuple[str, str | None]]:
    """The ids a model is looked up as, in order, each with the provider whose entries alone
    may price it when found that way (None: any entry)."""
    own = provider if provider in _OWN_ENTRIES_ONLY else None
    namespace = _NAMESPACE.get(provider)
    names = [model]
    prefix, slash, rest = model.partition("/")
    route, slash2, routed = rest.partition("/")
    if slash and slash2 and route in _ROUTES.get(prefix, ()):
        # litellm's choice of the provider's API (`bedrock/converse/...`), not the model's id:
        # the map prices the model as `bedrock/<model>` or `<model>`.
        names = [f"{prefix}/{routed}"]
    dated = _DATED.match(model)
    if dated is not None:
        names.append(dated.group(1))  # the undated family, only if the table has it
    out: list[tuple[str, str | None]] = []
    for name in names:
        out.append((name, own))
        prefix, slash, rest = name.partition("/")
        if slash and rest:
            out.append((rest, prefix))  # `gemini/x` -> `x`, a gemini entry only
        elif namespace is not None:
            out.append((f"{namespace}/{name}", namespace))
    return out


def _belongs(entry: Mapping[str, Any], provider: str | None, source: str) -> bool:
    """Whether an entry may price a model of `provider` (None: any entry may)."""
    if provider is None:
        return True
    named = entry.get("litellm_provider")
    if not isinstance(named, str):
        return source == "file"  # the operator's own entries need not name one
    allowed = _OWN_ENTRIES_ONLY.get(provider, (provider,))
    return any(named == p or named.startswith(p + "-") for p in allowed)


def map_entry(model: str, provider: str) -> dict[str, Any] | None:
    """The model's entry in the bundled map, looked up as a price is; None when it has none."""
    table = price_map()
    for name, owner in candidates(model, provider):
        entry = table.get(name)
        if isinstance(entry, dict) and _belongs(entry, owner, "map"):
            return entry
    return None


def output_limit(model: str, provider: str) -> int | None:
    """The model's largest answer in the bundled map (its `max_output_tokens`, else its
    `max_tokens`, as litellm reads it), looked up as a price is; None when it has no entry."""
    entry = map_entry(model, provider)
    for field in (MAX_OUTPUT, "max_tokens"):
        limit = entry.get(field) if entry is not None else None
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return limit
    return None


def _with_output_limit(price: Price, model: str, provider: str) -> Price:
    """A price from the config or the price file without `max_output_tokens` takes the
    model's from the bundled map: a request without an output bound reserves it."""
    if price.max_output_tokens is not None:
        return price
    limit = output_limit(model, provider)
    return price if limit is None else replace(price, max_output_tokens=limit)


def lookup(
    model: str, provider: str, table: Mapping[str, Any], source: str = "map"
) -> Price | None:
    """The price of an upstream model id in the map or a price file."""
    for name, owner in candidates(model, provider):
        entry = table.get(name)
        if isinstance(entry, dict) and _belongs(entry, owner, source):
            price = price_of_entry(entry, source, name)
            if price is not None:
                return price
    return None


@dataclass(frozen=True)
class Resolved:
    price: Price | None
    why: str  # where the price came from, or why there is none (`price` None: unpriced)


def resolve(
    model: str,
    provider: str,
    *,
    override: Mapping[str, Any] | None = None,
    free: bool = False,
    file: Mapping[str, Any] | None = None,
) -> Resolved:
    """A deployment's price: the config's (`override`, `free`), the file's, the map's."""
    if free:
        return Resolved(FREE, "free: marked `price: free` in the config")
    if override is not None:
        price = price_of_entry(override, "config", None)
        if price is not None:
            return Resolved(_with_output_limit(price, model, provider), "config")
    tried = ", ".join(name for name, _ in candidates(model, provider))
    if file:
        price = lookup(model, provider, file, "file")
        if price is not None:
            return Resolved(_with_output_limit(price, model, provider), price.where)
    price = lookup(model, provider, price_map())
    if price is not None:
        return Resolved(price, price.where)
    if file is not None:
        why = f"neither the price file nor the bundled map ({map_version()}) has an entry for"
        return Resolved(None, f"{why} {tried}")
    why = f"the bundled map ({map_version()}) has no entry for {tried}, and no price file is set"
    return Resolved(None, why)


# -- admission ------------------------------------------------------------------------------------


class Priced(Protocol):
    """What `require_price` reads of a deployment (gateway.routing.router.Deployment)."""

    @property
    def name(self) -> str: ...
    @property
    def upstream_model(self) -> str: ...
    @property
    def price(self) -> Price | None: ...


def require_price(scopes: Sequence[tuple[str, str, Limits]], plan: Sequence[Priced]) -> None:
    """Under a hard budget, every deployment the request may reach must have a price: an
    unpriced one would spend without being metered. 403 `price_unknown` otherwise, naming it
    and how to price it; nothing is recorded and no upstream is called."""
    hard = [
        (kind, ident)
        for kind, ident, limits in scopes
        if limits.budget is not None and limits.budget.mode == "hard"
    ]
    if not hard:
        return
    unpriced = [d for d in plan if d.price is None]
    if not unpriced:
        return
    names = ", ".join(f"{d.name!r} (model {d.upstream_model!r})" for d in unpriced)
    kind, ident = hard[0]
    raise PriceUnknown(
        f"The {kind} {ident!r} has a hard budget, and the deployment {names} this request may"
        " reach has no known price, so its cost could not be counted against it. Price it:"
        " an entry for the model in the price file (`prices:`), a `price` on the deployment"
        " in the config, or `price: free` if it really costs nothing (`gateway prices` lists"
        " every deployment's price)."
    )
