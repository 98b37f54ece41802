"""Every Prometheus metric the gateway exports, in one registry.

The metrics a request moves (about fifteen updates each) are the gateway's own `Counter`,
`Gauge` and `Histogram` below: a number in a slot, no lock, exported through one collector in
the exact text prometheus_client's own would give (tests/test_metrics.py holds them to it).
prometheus_client's metrics check every update and take a lock for it, which cost a request
as much as a twentieth of its CPU; every update here comes from the event loop's thread.
The process, platform and garbage-collector metrics, and those of modules a config turns on
(Redis, workers), are the library's.
"""

from __future__ import annotations

import platform
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from typing import Generic, TypeVar

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gateway import __version__

# A `_created` series beside every counter and histogram doubles what a scrape carries, and no
# alert or dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY = CollectorRegistry(auto_describe=True)
# The process's CPU, memory and file descriptors, its garbage collector, and the Python it
# runs on, as every Prometheus client exports them.
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)


class CounterValue:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        self.value += amount


class GaugeValue:
    __slots__ = ("function", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.function: Callable[[], float] | None = None

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount

    def dec(self, amount: float = 1.0) -> None:
        self.value -= amount

    def set(self, value: float) -> None:
        self.value = float(value)

    def set_function(self, function: Callable[[], float]) -> None:
        """Read the value from `function` at each scrape."""
        self.function = function

    def read(self) -> float:
        return float(self.function()) if self.function is not None else self.value


class HistogramValue:
    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds  # ascending, +Inf last
        self.counts = [0] * len(bounds)  # observations in each bucket alone
        self.sum = 0.0

    def observe(self, amount: float) -> None:
        self.sum += amount
        self.counts[bisect_left(self.bounds, amount)] += 1


V = TypeVar("V", CounterValue, GaugeValue, HistogramValue)


class _Metric(Generic[V]):
    """A metric and its children by label values (a metric without labels is its own one
    child: `inc()` on it directly)."""

    name: str
    documentation: str
    labelnames: tuple[str, ...]

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str] = ()) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self._children: dict[tuple[str, ...], V] = {}
        if not self.labelnames:
            self._children[()] = self._new()
        _GATEWAY.metrics.append(self)

    def _new(self) -> V:
        raise NotImplementedError

    def labels(self, *values: object) -> V:
        try:
            return self._children[values]  # type: ignore[index]
        except KeyError:
            if len(values) != len(self.labelnames) or not self.labelnames:
                raise ValueError(f"{self.name} takes the labels {self.labelnames}") from None
            key = tuple(str(v) for v in values)
            child = self._children.get(key)
            if child is None:
                child = self._children[key] = self._new()
            self._children[values] = child  # type: ignore[index]
            return child

    def _unlabelled(self) -> V:
        if self.labelnames:
            raise ValueError(f"{self.name} has labels {self.labelnames}: use labels()")
        return self._children[()]

    def _series(self) -> Iterator[tuple[list[str], V]]:
        """Each child once, by its label values as exported."""
        seen: set[int] = set()
        for key, child in list(self._children.items()):
            if id(child) not in seen and all(type(v) is str for v in key):
                seen.add(id(child))
                yield list(key), child

    def collect(self) -> Metric:
        raise NotImplementedError


class Counter(_Metric[CounterValue]):
    def _new(self) -> CounterValue:
        return CounterValue()

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def collect(self) -> Metric:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._series():
            family.add_metric(values, child.value)
        return family


class Gauge(_Metric[GaugeValue]):
    def _new(self) -> GaugeValue:
        return GaugeValue()

    def inc(self, amount: float = 1.0) -> None:
        self._unlabelled().inc(amount)

    def dec(self, amount: float = 1.0) -> None:
        self._unlabelled().dec(amount)

    def set(self, value: float) -> None:
        self._unlabelled().set(value)

    def set_function(self, function: Callable[[], float]) -> None:
        self._unlabelled().set_function(function)

    def collect(self) -> Metric:
        family = GaugeMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._series():
            family.add_metric(values, child.read())
        return family


class Histogram(_Metric[HistogramValue]):
    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: Sequence[str] = (),
        *,
        buckets: Sequence[float],
    ) -> None:
        self.bounds = (*sorted(float(b) for b in buckets), float("inf"))
        super().__init__(name, documentation, labelnames)

    def _new(self) -> HistogramValue:
        return HistogramValue(self.bounds)

    def observe(self, amount: float) -> None:
        self._unlabelled().observe(amount)

    def collect(self) -> Metric:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self.labelnames)
        for values, child in self._series():
            running, buckets = 0, []
            for bound, count in zip(self.bounds, child.counts, strict=True):
                running += count
                le = floatToGoString(bound)  # type: ignore[no-untyped-call]
                buckets.append((le, float(running)))
            family.add_metric(values, buckets, child.sum)
        return family


class _Gateway(Collector):
    """The gateway's own metrics, in the registry."""

    def __init__(self) -> None:
        self.metrics: list[_Metric[CounterValue] | _Metric[GaugeValue] | _Metric[HistogramValue]]
        self.metrics = []

    def collect(self) -> Iterator[Metric]:
        for metric in self.metrics:
            yield metric.collect()


_GATEWAY = _Gateway()
REGISTRY.register(_GATEWAY)


REQUESTS = Counter(
    "gateway_requests_total",
    "HTTP requests answered, by route and status code.",
    ["route", "status"],
)
IN_FLIGHT = Gauge("gateway_requests_in_flight", "HTTP requests being handled right now.")
COMPLETIONS = Counter(
    "gateway_completions_total",
    "Completion requests by alias, the deployment that answered last, client dialect and"
    " final status (completed, aborted, error).",
    ["alias", "deployment", "dialect", "status"],
)
DURATION = Histogram(
    "gateway_request_duration_seconds",
    "From a completion request's arrival to its end, by alias.",
    ["alias"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
STREAMS = Gauge("gateway_streams_in_flight", "Streaming responses being written right now.")
TURNS = Counter(
    "gateway_turns_total",
    "Conversation turns recorded, by final status and reason.",
    ["status", "reason"],
)
ATTEMPTS = Counter(
    "gateway_upstream_attempts_total",
    "Upstream attempts, by deployment and outcome (ok or an error label).",
    ["deployment", "outcome"],
)
UPSTREAM_CONNECTIONS = Counter(
    "gateway_upstream_connections_opened_total",
    "Connections opened to upstreams, by origin (scheme://host:port): against requests, how"
    " well keep-alive holds (each new one is a TCP and, for https, a TLS handshake).",
    ["origin"],
)
FIRST_TOKEN = Histogram(
    "gateway_time_to_first_token_seconds",
    "From sending the upstream request to its first content event.",
    ["deployment"],
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
)


DEPLOYMENT_IN_FLIGHT = Gauge(
    "gateway_deployment_in_flight",
    "Upstream requests in flight, by deployment.",
    ["deployment"],
)
DEPLOYMENT_STATE = Gauge(
    "gateway_deployment_state",
    "1 for the deployment's current health state (healthy, cooling, half_open), else 0.",
    ["deployment", "state"],
)
DEPLOYMENT_TRANSITIONS = Counter(
    "gateway_deployment_transitions_total",
    "Health state changes, by deployment and the state entered.",
    ["deployment", "state"],
)
RETRIES = Counter(
    "gateway_retries_total",
    "Attempts after the first, by alias and the reason the previous one failed.",
    ["alias", "reason"],
)


TOKENS = Counter(
    "gateway_tokens_total",
    "Tokens by alias, deployment, kind (prompt, completion generated, delivered, reasoning,"
    " cached) and source (the usage row's usage_source).",
    ["alias", "deployment", "kind", "source"],
)
COST = Counter(
    "gateway_cost_usd_total",
    "Cost in USD by alias and deployment, from the deployment's price.",
    ["alias", "deployment"],
)


TRUNCATED_RECORDS = Counter(
    "gateway_truncated_records_total",
    "Attempts whose record was cut at conversations.record_max_text_chars or"
    " record_max_tool_argument_chars, by kind (text: text and reasoning; tool_call): the"
    " stream was relayed whole, its record marked `truncated_record`.",
    ["kind"],
)


USAGE_CLAMPED = Counter(
    "gateway_usage_clamped_total",
    "Token counts a provider reported wrong (negative, not a number, absurd), by deployment"
    " and usage field: each replaced by the gateway's estimate, its row flagged"
    " `usage_source: provider_clamped`.",
    ["deployment", "field"],
)


LIMIT_REJECTIONS = Counter(
    "gateway_limit_rejections_total",
    "Requests refused with 429, by limit (rpm, tpm, concurrency, budget) and scope (key, team).",
    ["limit", "scope"],
)
BUDGET_WARNINGS = Counter(
    "gateway_budget_warnings_total",
    "Requests let through over a soft budget, by scope.",
    ["scope"],
)
CONNECTIONS_REFUSED = Counter(
    "gateway_connections_refused_total",
    "Client connections over server.max_connections: answered 503 (health probes served) and"
    " closed.",
)
AUTH_FAILURES = Counter(
    "gateway_auth_failures_total",
    "Wrong API keys presented, by outcome: refused (401) or rate_limited (429: the client"
    " address is past auth.max_failures in auth.failure_window_s).",
    ["outcome"],
)
STORE_QUEUE = Gauge(
    "gateway_store_queue_depth",
    "Writes waiting in memory for the store writer.",
)
STORE_SPOOL_BYTES = Gauge(
    "gateway_store_spool_bytes",
    "Bytes of writes waiting in the local spool file for the store to return.",
)
STORE_SPOOLING = Gauge(
    "gateway_store_spooling",
    "1 while writes go to the spool (store down or slow), else 0.",
)
STORE_SPOOLED = Counter(
    "gateway_store_spooled_writes_total",
    "Writes put in the spool instead of the store.",
)
STORE_REPLAYED = Counter(
    "gateway_store_replayed_writes_total",
    "Spooled writes replayed into the store.",
)
STORE_WRITE_ERRORS = Counter(
    "gateway_store_write_errors_total",
    "Writes the store refused for their content (logged, then dropped after retries).",
)


# The series the alert rules take `increase()` of (deploy/alerts.yml), exported at 0 from the
# start: a series that first appears at its first event, already at its value, is no increase
# to Prometheus, so the first crash recovery or refused budget would never alert.
TURNS.labels("aborted", "crash_recovered")
for _kind in ("text", "tool_call"):
    TRUNCATED_RECORDS.labels(_kind)
for _outcome in ("refused", "rate_limited"):
    AUTH_FAILURES.labels(_outcome)
for _scope in ("key", "team"):
    LIMIT_REJECTIONS.labels("budget", _scope)
    BUDGET_WARNINGS.labels(_scope)


BUILD_INFO = Gauge(
    "gateway_build_info",
    "1, labelled with the gateway's version and the Python it runs on.",
    ["version", "python"],
)
BUILD_INFO.labels(__version__, platform.python_version()).set(1)


def render() -> bytes:
    return generate_latest(REGISTRY)
