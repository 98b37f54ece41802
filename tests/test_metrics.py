"""/metrics parses with prometheus-client's own parser, and the counters move."""

from __future__ import annotations

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
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


def test_metric_values_take_no_lock_per_update() -> None:
    # Updated only on the event loop's thread: the lock-free value class is the one in use.
    from gateway import metrics

    child = metrics.TURNS.labels("completed", "test")
    before = child._value.get()
    child.inc()
    assert type(child._value).__name__ == "_LoopValue"
    assert child._value.get() == before + 1


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b"]),
            st.floats(0, 400, allow_nan=False) | st.just(float("nan")) | st.just(float("inf")),
        ),
        max_size=30,
    )
)
def test_updates_without_the_librarys_checks_export_what_the_library_would(
    updates: list[tuple[str, float]],
) -> None:
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client import Counter as LibCounter
    from prometheus_client import Gauge as LibGauge
    from prometheus_client import Histogram as LibHistogram

    from gateway import metrics

    def export(counter: type, gauge: type, histogram: type) -> list[bytes]:
        registry = CollectorRegistry()
        c = counter("c_total", "c", ["k"], registry=registry)
        g = gauge("g", "g", ["k"], registry=registry)
        plain = gauge("p", "p", registry=registry)
        h = histogram("h", "h", ["k"], buckets=(0.5, 10, 100), registry=registry)
        for key, amount in updates:
            if amount == amount and amount != float("inf"):  # not NaN, finite
                c.labels(key).inc(amount)
                g.labels(key).inc(amount)
                g.labels(key).dec(amount / 2)
                plain.inc(amount)
            h.labels(key).observe(amount)
        lines = generate_latest(registry).splitlines()
        return [line for line in lines if b"_created" not in line]

    ours = export(metrics.Counter, metrics.Gauge, metrics.Histogram)
    assert ours == export(LibCounter, LibGauge, LibHistogram)


def test_what_the_library_refuses_is_still_refused() -> None:
    from prometheus_client import CollectorRegistry

    from gateway import metrics

    registry = CollectorRegistry()
    counter = metrics.Counter("r_total", "r", ["k"], registry=registry)
    with pytest.raises(ValueError):
        counter.inc()  # a labelled metric without its labels
    with pytest.raises(ValueError):
        counter.labels("x").inc(-1)
    with pytest.raises(ValueError):
        metrics.Histogram("rh", "rh", ["k"], registry=registry).observe(1.0)
    counter.labels("x").inc(2, exemplar={"trace_id": "abc"})  # exemplars take the library's way
    assert counter.labels("x")._value.get() == 2
