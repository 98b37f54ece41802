"""Every Prometheus metric the gateway exports, in one registry."""

from __future__ import annotations

import platform
from typing import Generic, TypeVar

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)

from gateway import __version__

# A `_created` series beside every counter and histogram doubles what a scrape carries, and no
# alert or dashboard reads them.
disable_created_metrics()  # type: ignore[no-untyped-call]

REGISTRY = CollectorRegistry(auto_describe=True)
# The process's CPU, memory and file descriptors, its garbage collector, and the Python it
# runs on, as every Prometheus client exports them.
for _collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_collector)

M = TypeVar("M", Counter, Gauge, Histogram)


class Family(Generic[M]):
    """A labelled metric, its children kept by label values: prometheus_client's `labels()`
    checks the values and takes a lock on every call, and a request makes about ten; here it
    is a dict lookup after the first. The label values are few by design (no key
    or team ids), and the gateway never removes a child (`metric.remove()`, `clear()`), which
    would leave a kept one exported no more.

    Only the library's public API: the children are its own, and every update goes its way."""

    __slots__ = ("_children", "metric")
    metric: M
    _children: dict[tuple[object, ...], M]

    def __init__(self, metric: M) -> None:
        self.metric = metric
        self._children = {}

    def labels(self, *values: object) -> M:
        try:
            return self._children[values]
        except KeyError:
            child = self._children[values] = self.metric.labels(*values)
            return child


REQUESTS = Family(
    Counter(
        "gateway_requests_total",
        "HTTP requests answered, by route and status code.",
        ["route", "status"],
        registry=REGISTRY,
    )
)
IN_FLIGHT = Gauge(
    "gateway_requests_in_flight", "HTTP requests being handled right now.", registry=REGISTRY
)
COMPLETIONS = Family(
    Counter(
        "gateway_completions_total",
        "Completion requests by alias, the deployment that answered last, client dialect and"
        " final status (completed, aborted, error).",
        ["alias", "deployment", "dialect", "status"],
        registry=REGISTRY,
    )
)
DURATION = Family(
    Histogram(
        "gateway_request_duration_seconds",
        "From a completion request's arrival to its end, by alias.",
        ["alias"],
        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
        registry=REGISTRY,
    )
)
STREAMS = Gauge(
    "gateway_streams_in_flight", "Streaming responses being written right now.", registry=REGISTRY
)
TURNS = Family(
    Counter(
        "gateway_turns_total",
        "Conversation turns recorded, by final status and reason.",
        ["status", "reason"],
        registry=REGISTRY,
    )
)
ATTEMPTS = Family(
    Counter(
        "gateway_upstream_attempts_total",
        "Upstream attempts, by deployment and outcome (ok or an error label).",
        ["deployment", "outcome"],
        registry=REGISTRY,
    )
)
UPSTREAM_CONNECTIONS = Family(
    Counter(
        "gateway_upstream_connections_opened_total",
        "Connections opened to upstreams, by origin (scheme://host:port): against requests, how"
        " well keep-alive holds (each new one is a TCP and, for https, a TLS handshake).",
        ["origin"],
        registry=REGISTRY,
    )
)
FIRST_TOKEN = Family(
    Histogram(
        "gateway_time_to_first_token_seconds",
        "From sending the upstream request to its first content event.",
        ["deployment"],
        buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
        registry=REGISTRY,
    )
)


DEPLOYMENT_IN_FLIGHT = Family(
    Gauge(
        "gateway_deployment_in_flight",
        "Upstream requests in flight, by deployment.",
        ["deployment"],
        registry=REGISTRY,
    )
)
DEPLOYMENT_STATE = Family(
    Gauge(
        "gateway_deployment_state",
        "1 for the deployment's current health state (healthy, cooling, half_open), else 0.",
        ["deployment", "state"],
        registry=REGISTRY,
    )
)
DEPLOYMENT_TRANSITIONS = Family(
    Counter(
        "gateway_deployment_transitions_total",
        "Health state changes, by deployment and the state entered.",
        ["deployment", "state"],
        registry=REGISTRY,
    )
)
RETRIES = Family(
    Counter(
        "gateway_retries_total",
        "Attempts after the first, by alias and the reason the previous one failed.",
        ["alias", "reason"],
        registry=REGISTRY,
    )
)


TOKENS = Family(
    Counter(
        "gateway_tokens_total",
        "Tokens by alias, deployment, kind (prompt, completion generated, delivered, reasoning,"
        " cached) and source (provider's count or estimated).",
        ["alias", "deployment", "kind", "source"],
        registry=REGISTRY,
    )
)
COST = Family(
    Counter(
        "gateway_cost_usd_total",
        "Cost in USD by alias and deployment, from the deployment's price.",
        ["alias", "deployment"],
        registry=REGISTRY,
    )
)


LIMIT_REJECTIONS = Family(
    Counter(
        "gateway_limit_rejections_total",
        "Requests refused with 429, by limit (rpm, tpm, concurrency, budget) and scope (key,"
        " team).",
        ["limit", "scope"],
        registry=REGISTRY,
    )
)
BUDGET_WARNINGS = Family(
    Counter(
        "gateway_budget_warnings_total",
        "Requests let through over a soft budget, by scope.",
        ["scope"],
        registry=REGISTRY,
    )
)
CONNECTIONS_REFUSED = Counter(
    "gateway_connections_refused_total",
    "Client connections over server.max_connections: answered 503 (health probes served) and"
    " closed.",
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


BUILD_INFO = Gauge(
    "gateway_build_info",
    "1, labelled with the gateway's version and the Python it runs on.",
    ["version", "python"],
    registry=REGISTRY,
)
BUILD_INFO.labels(__version__, platform.python_version()).set(1)


def render() -> bytes:
    return generate_latest(REGISTRY)
