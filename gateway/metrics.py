"""Every Prometheus metric the gateway exports, in one registry."""

from __future__ import annotations

from bisect import bisect_left
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import values as _values

REGISTRY = CollectorRegistry(auto_describe=True)


class _LoopValue:
    """A metric child's value, without prometheus_client's lock around every update.

    The gateway updates and exports its metrics only on the event loop's thread (the store's
    threads and the tokenizer's never touch them), so the lock bought nothing, and a request
    makes about fifteen updates. Same interface as prometheus_client's MutexValue."""

    _multiprocess = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._value = 0.0
        self._exemplar: Any = None

    def inc(self, amount: float) -> None:
        self._value += amount

    def set(self, value: float, timestamp: float | None = None) -> None:
        self._value = value

    def set_exemplar(self, exemplar: Any) -> None:
        self._exemplar = exemplar

    def get(self) -> float:
        return self._value

    def get_exemplar(self) -> Any:
        return self._exemplar


# prometheus_client picks the value class when it is imported (it is how its multiprocess mode
# swaps in shared files); only the plain in-process one is replaced.
if _values.ValueClass is _values.MutexValue:
    _values.ValueClass = _LoopValue


class _KeptChildren:
    """`labels()` from a dict: prometheus_client validates and locks on every call (~2 us),
    and a request makes about ten. Label values here are few by design (no key or team ids)."""

    _kept: dict[tuple[Any, ...], Any]
    # Takes updates: a labelled metric's child, or a metric without labels (what the library
    # checks on every update, decided here once).
    _updatable: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._updatable = bool(self._labelvalues or not self._labelnames)  # type: ignore[attr-defined]

    def labels(self, *values: Any, **by_name: Any) -> Any:
        if by_name:
            return super().labels(*values, **by_name)  # type: ignore[misc]
        try:
            return self._kept[values]
        except AttributeError:
            self._kept = {}
        except KeyError:
            pass
        child = super().labels(*values)  # type: ignore[misc]
        self._kept[values] = child
        return child


# Updates without prometheus_client's checks on every call (two nested calls, ~0.5 us, about
# fifteen times a request): whether a metric takes updates is decided when it is made
# (`_updatable`), which is all they check; anything else (an exemplar, a negative count, a
# metric missing its labels) goes the library's way and gets its errors.


class Counter(_KeptChildren, prometheus_client.Counter):
    def inc(self, amount: float = 1, exemplar: dict[str, str] | None = None) -> None:
        if exemplar is None and amount >= 0 and self._updatable:
            self._value.inc(amount)
        else:
            super().inc(amount, exemplar)


class Gauge(_KeptChildren, prometheus_client.Gauge):
    def inc(self, amount: float = 1) -> None:
        if self._updatable and not self._is_most_recent:
            self._value.inc(amount)
        else:
            super().inc(amount)

    def dec(self, amount: float = 1) -> None:
        if self._updatable and not self._is_most_recent:
            self._value.inc(-amount)
        else:
            super().dec(amount)


class Histogram(_KeptChildren, prometheus_client.Histogram):
    def observe(self, amount: float, exemplar: dict[str, str] | None = None) -> None:
        if exemplar is not None or not self._updatable:
            super().observe(amount, exemplar)
            return
        self._sum.inc(amount)
        # The first bucket whose upper bound is at least `amount` (the last is +Inf; NaN
        # counts in none, as in the library).
        bounds = self._upper_bounds
        at = bisect_left(bounds, amount)
        if at < len(bounds) and amount <= bounds[at]:
            self._buckets[at].inc(1)


REQUESTS = Counter(
    "gateway_requests_total",
    "HTTP requests answered, by route and status code.",
    ["route", "status"],
    registry=REGISTRY,
)
IN_FLIGHT = Gauge(
    "gateway_requests_in_flight", "HTTP requests being handled right now.", registry=REGISTRY
)
COMPLETIONS = Counter(
    "gateway_completions_total",
    "Completion requests by alias, the deployment that answered last, client dialect and"
    " final status (completed, aborted, error).",
    ["alias", "deployment", "dialect", "status"],
    registry=REGISTRY,
)
DURATION = Histogram(
    "gateway_request_duration_seconds",
    "From a completion request's arrival to its end, by alias.",
    ["alias"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
    registry=REGISTRY,
)
STREAMS = Gauge(
    "gateway_streams_in_flight", "Streaming responses being written right now.", registry=REGISTRY
)
TURNS = Counter(
    "gateway_turns_total",
    "Conversation turns recorded, by final status and reason.",
    ["status", "reason"],
    registry=REGISTRY,
)
ATTEMPTS = Counter(
    "gateway_upstream_attempts_total",
    "Upstream attempts, by deployment and outcome (ok or an error label).",
    ["deployment", "outcome"],
    registry=REGISTRY,
)
UPSTREAM_CONNECTIONS = Counter(
    "gateway_upstream_connections_opened_total",
    "Connections opened to upstreams, by origin (scheme://host:port): against requests, how"
    " well keep-alive holds (each new one is a TCP and, for https, a TLS handshake).",
    ["origin"],
    registry=REGISTRY,
)
FIRST_TOKEN = Histogram(
    "gateway_time_to_first_token_seconds",
    "From sending the upstream request to its first content event.",
    ["deployment"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
    registry=REGISTRY,
)


DEPLOYMENT_IN_FLIGHT = Gauge(
    "gateway_deployment_in_flight",
    "Upstream requests in flight, by deployment.",
    ["deployment"],
    registry=REGISTRY,
)
DEPLOYMENT_STATE = Gauge(
    "gateway_deployment_state",
    "1 for the deployment's current health state (healthy, cooling, half_open), else 0.",
    ["deployment", "state"],
    registry=REGISTRY,
)
DEPLOYMENT_TRANSITIONS = Counter(
    "gateway_deployment_transitions_total",
    "Health state changes, by deployment and the state entered.",
    ["deployment", "state"],
    registry=REGISTRY,
)
RETRIES = Counter(
    "gateway_retries_total",
    "Attempts after the first, by alias and the reason the previous one failed.",
    ["alias", "reason"],
    registry=REGISTRY,
)


TOKENS = Counter(
    "gateway_tokens_total",
    "Tokens by alias, deployment, kind (prompt, completion generated, delivered, reasoning,"
    " cached) and source (provider's count or estimated).",
    ["alias", "deployment", "kind", "source"],
    registry=REGISTRY,
)
COST = Counter(
    "gateway_cost_usd_total",
    "Cost in USD by alias and deployment, from the deployment's price.",
    ["alias", "deployment"],
    registry=REGISTRY,
)


LIMIT_REJECTIONS = Counter(
    "gateway_limit_rejections_total",
    "Requests refused with 429, by limit (rpm, tpm, concurrency, budget) and scope (key, team).",
    ["limit", "scope"],
    registry=REGISTRY,
)
BUDGET_WARNINGS = Counter(
    "gateway_budget_warnings_total",
    "Requests let through over a soft budget, by scope.",
    ["scope"],
    registry=REGISTRY,
)
STORE_QUEUE = Gauge(
    "gateway_store_queue_depth",
    "Writes waiting in memory for the store writer.",
    registry=REGISTRY,
)
STORE_SPOOL_BYTES = Gauge(
    "gateway_store_spool_bytes",
    "Bytes of writes waiting in the local spool file for the store to return.",
    registry=REGISTRY,
)
STORE_SPOOLING = Gauge(
    "gateway_store_spooling",
    "1 while writes go to the spool (store down or slow), else 0.",
    registry=REGISTRY,
)
STORE_SPOOLED = Counter(
    "gateway_store_spooled_writes_total",
    "Writes put in the spool instead of the store.",
    registry=REGISTRY,
)
STORE_REPLAYED = Counter(
    "gateway_store_replayed_writes_total",
    "Spooled writes replayed into the store.",
    registry=REGISTRY,
)
STORE_WRITE_ERRORS = Counter(
    "gateway_store_write_errors_total",
    "Writes the store refused for their content (logged, then dropped after retries).",
    registry=REGISTRY,
)


def render() -> bytes:
    return generate_latest(REGISTRY)
