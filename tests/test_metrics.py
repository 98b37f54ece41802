"""/metrics parses with prometheus-client's own parser, and the counters move."""

from __future__ import annotations

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import GatewayUnderTest


async def scrape(gw: GatewayUnderTest) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    async with aiohttp.ClientSession() as session, session.get(gw.url + "/metrics") as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = await response.text()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_counters_move_with_traffic(gw: GatewayUnderTest) -> None:
    turns = ("gateway_turns_total", (("reason", ""), ("status", "completed")))
    attempts = (
        "gateway_upstream_attempts_total",
        (("deployment", "demo/0-demo"), ("outcome", "ok")),
    )
    tokens = (
        "gateway_tokens_total",
        (
            ("alias", "demo"),
            ("deployment", "demo/0-demo"),
            ("kind", "completion"),
            ("source", "provider"),
        ),
    )
    before = await scrape(gw)
    billed = {"prompt": 0, "completion": 0}
    for _ in range(3):
        answer = await gw.client().chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}]
        )
        assert answer.usage is not None
        billed["prompt"] += answer.usage.prompt_tokens
        billed["completion"] += answer.usage.completion_tokens
    billed["delivered"] = billed["completion"]  # answered whole: all of it delivered
    await gw.flush()
    after = await scrape(gw)
    completions = (
        "gateway_completions_total",
        (
            ("alias", "demo"),
            ("deployment", "demo/0-demo"),
            ("dialect", "openai.chat"),
            ("status", "completed"),
        ),
    )
    duration = ("gateway_request_duration_seconds_count", (("alias", "demo"),))
    for key in (turns, attempts, completions, duration):
        assert after[key] - before.get(key, 0.0) == 3
    assert after[("gateway_streams_in_flight", ())] == 0
    # Each kind of token is counted under its own label set, by what the provider reported.
    for kind, count in billed.items():
        labels = (*tokens[1][:2], ("kind", kind), tokens[1][3])
        key = ("gateway_tokens_total", labels)
        assert count > 0 and after[key] - before.get(key, 0.0) == count


def test_the_gateways_metrics_export_what_prometheus_clients_own_would() -> None:
    """The same updates to a gateway metric and to prometheus_client's own give the same
    scrape, byte for byte: names, help, types, labels, buckets and values."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client import Counter as LibCounter
    from prometheus_client import Gauge as LibGauge
    from prometheus_client import Histogram as LibHistogram

    from gateway import metrics

    def export(ours: bool) -> list[bytes]:
        registry = CollectorRegistry()
        if ours:
            before = len(metrics._GATEWAY.metrics)
            collector = metrics._Gateway()
            made = [
                metrics.Counter("c_total", "c", ["k"]),
                metrics.Counter("plain_total", "p"),
                metrics.Gauge("g", "g", ["k", "j"]),
                metrics.Gauge("unset", "u"),
                metrics.Histogram("h_seconds", "h", ["k"], buckets=(0.5, 10, 100)),
                metrics.Counter("never_total", "n", ["k"]),
            ]
            del metrics._GATEWAY.metrics[before:]  # (not the process's registry's to export)
            collector.metrics.extend(made)
            registry.register(collector)
            c, plain, g, _, h, _ = made
        else:
            c = LibCounter("c_total", "c", ["k"], registry=registry)
            plain = LibCounter("plain_total", "p", registry=registry)
            g = LibGauge("g", "g", ["k", "j"], registry=registry)
            LibGauge("unset", "u", registry=registry)
            h = LibHistogram("h_seconds", "h", ["k"], buckets=(0.5, 10, 100), registry=registry)
            LibCounter("never_total", "n", ["k"], registry=registry)
        for key, amount in [("a", 1.0), ("b", 0.25), ("a", 50.0), ("a", 0.5), ("c", 1e9)]:
            c.labels(key).inc(amount)
            plain.inc()
            g.labels(key, "x").inc(amount)
            g.labels(key, 7).dec(amount / 2)  # a label value that is not a string
            h.labels(key).observe(amount)
        lines = generate_latest(registry).splitlines()
        return [line for line in lines if b"_created" not in line]

    ours = export(ours=True)
    assert ours == export(ours=False)
    assert b'h_seconds_bucket{k="a",le="0.5"} 1.0' in ours  # an observation on a bound


def test_what_the_library_refuses_is_still_refused() -> None:
    from gateway import metrics

    before = len(metrics._GATEWAY.metrics)
    counter = metrics.Counter("r_total", "r", ["k"])
    plain = metrics.Gauge("r_plain", "r")
    del metrics._GATEWAY.metrics[before:]
    with pytest.raises(ValueError):
        counter.inc()  # a labelled metric without its labels
    with pytest.raises(ValueError):
        counter.labels("x").inc(-1)
    with pytest.raises(ValueError):
        counter.labels("x", "y")  # too many label values
    with pytest.raises(ValueError):
        plain.labels("x")  # labels on a metric without any
    counter.labels("x").inc(2)
    assert counter.labels("x").value == 2


async def test_the_process_and_the_build_are_exported_and_no_created_series(
    gw: GatewayUnderTest,
) -> None:
    from gateway import __version__

    scraped = await scrape(gw)
    names = {name for name, _ in scraped}
    assert {"process_resident_memory_bytes", "process_open_fds", "python_info"} <= names
    build = [labels for name, labels in scraped if name == "gateway_build_info"]
    assert len(build) == 1 and ("version", __version__) in build[0]
    assert not [name for name in names if name.endswith("_created")]
