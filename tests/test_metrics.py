"""/metrics parses with prometheus-client's own parser, and the counters move."""

from __future__ import annotations

import aiohttp
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
    for _ in range(3):
        await gw.client().chat.completions.create(
            model="demo", messages=[{"role": "user", "content": "hi"}]
        )
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
    assert after[tokens] > before.get(tokens, 0.0)


def test_metric_values_take_no_lock_per_update() -> None:
    # Updated only on the event loop's thread: the lock-free value class is the one in use.
    from gateway import metrics

    child = metrics.TURNS.labels("completed", "test")
    before = child._value.get()
    child.inc()
    assert type(child._value).__name__ == "_LoopValue"
    assert child._value.get() == before + 1
