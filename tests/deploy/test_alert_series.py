"""The alert rules read series the gateway really exports, from its start.

An alert on `increase(counter[...]) > 0` sees an event only as a change between two samples: a
series that first appears at its first event, already at its value, is no increase to
Prometheus, and the alert never fires. So every series such a rule selects is in a fresh
process's `/metrics` at 0, and the crash-recovered alert's promtool test starts from the exact
series a real `gateway serve` exports.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_deploy import ALERTS, ROOT, run_promtool

# A selector inside `increase(...)`: the metric and its `label="value"` matchers.
_INCREASE = re.compile(r"increase\((gateway_[a-z0-9_]+)(?:\{([^}]*)\})?\[")
_MATCHER = re.compile(r'(\w+)\s*=\s*"([^"]*)"')
# Exported only when Redis is configured (limits.redis_url): read from a fresh import below.
_REDIS_ONLY = {"gateway_redis_errors_total", "gateway_limit_local_fallbacks_total"}

Samples = list[tuple[str, dict[str, str], float]]


def parse(text: str) -> Samples:
    return [
        (sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


@pytest.fixture(scope="module")
def served_metrics(tmp_path_factory: pytest.TempPathFactory) -> Samples:
    """`/metrics` of a `gateway serve` process just started (open, SQLite, one demo alias)."""
    tmp = tmp_path_factory.mktemp("alert-series")
    config = tmp / "gw.yaml"
    config.write_text(
        f"store: {{url: 'sqlite:///{tmp}/gw.db', spool_path: '{tmp}/spool'}}\n"
        "models: [{name: demo, deployments: [{provider: demo, chunk_delay_ms: 0}]}]\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_MASTER_KEY"}
    # Port 0, read back from its log: no other process can be listening there instead.
    process = subprocess.Popen(
        [sys.executable, "-m", "gateway", "serve", "--config", str(config), "--port", "0"],
        cwd=ROOT,
        env={**env, "PYTHONUNBUFFERED": "1"},
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stderr is not None
        while (line := process.stderr.readline()) and "listening on" not in line:
            pass
        found = re.search(r"listening on (http://[^ ]+)", line)
        assert found, "the gateway exited before listening"
        with urllib.request.urlopen(found.group(1) + "/metrics", timeout=10) as response:
            return parse(response.read().decode())
    finally:
        process.send_signal(signal.SIGTERM)
        process.communicate(timeout=30)


def redis_metrics() -> Samples:
    """The registry of a fresh process that loaded the Redis limiter, as `serve` does when
    `limits.redis_url` is set."""
    code = (
        "import sys, gateway.metering.redis_limits; from gateway import metrics;"
        " sys.stdout.buffer.write(metrics.render())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, check=True, timeout=60
    )
    return parse(out.stdout.decode())


def increase_selectors() -> list[tuple[str, dict[str, str]]]:
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    found = []
    for rule in rules:
        for name, matchers in _INCREASE.findall(rule["expr"]):
            found.append((name, dict(_MATCHER.findall(matchers))))
    return found


def test_every_series_an_increase_alert_reads_is_exported_at_zero_from_the_start(
    served_metrics: Samples,
) -> None:
    selectors = increase_selectors()
    assert len(selectors) >= 5  # crash recoveries, budgets, Redis, local limits, cooldowns
    with_redis = redis_metrics()
    for name, matchers in selectors:
        if name == "gateway_deployment_transitions_total":
            matchers = {**matchers, "deployment": "demo/0-demo"}  # one series per deployment
        samples = with_redis if name in _REDIS_ONLY else served_metrics
        matching = [
            value
            for sample, labels, value in samples
            if sample == name and matchers.items() <= labels.items()
        ]
        assert matching, f"{name}{matchers} is not exported from the start"
        assert all(value == 0 for value in matching), (name, matchers, matching)


def test_the_crash_recovered_alert_fires_on_the_series_the_gateway_exports(
    served_metrics: Samples, tmp_path: Path
) -> None:
    """A process that exported the series for ten minutes is killed with turns open; its
    restart closes 15 of them before its first scrape. A peer's sweep, on a replica that
    has run for a while, counts the same way."""
    [(labels, at_start)] = [
        (labels, value)
        for sample, labels, value in served_metrics
        if sample == "gateway_turns_total" and labels.get("reason") == "crash_recovered"
    ]
    assert at_start == 0
    matchers = ", ".join(
        f'{k}="{v}"' for k, v in {"job": "gateway", "instance": "gw-1:4000", **labels}.items()
    )
    series = f"gateway_turns_total{{{matchers}}}"
    alert = "GatewayCrashRecoveredTurns"
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                # Scraped at 0 for ten minutes, down for two, back at 15.
                "input_series": [{"series": series, "values": "0x10 _x2 15x30"}],
                "alert_rule_test": [
                    {"eval_time": "10m", "alertname": alert, "exp_alerts": []},
                    {
                        "eval_time": "15m",
                        "alertname": alert,
                        "exp_alerts": [
                            {
                                "exp_labels": {"severity": "warning"},
                                "exp_annotations": {
                                    "summary": "A gateway process died with turns in progress",
                                    "description": "15 open turns were closed as"
                                    " crash_recovered over 15 minutes: look for OOM kills or"
                                    " crashes.",
                                },
                            }
                        ],
                    },
                ],
            }
        ],
    }
    path = tmp_path / "crash_recovered_test.yml"
    path.write_text(yaml.safe_dump(tests))
    result = run_promtool("test", "rules", str(path))
    assert "SUCCESS" in result.stdout
