"""deploy/ stays valid: each file is read by the tool that will read it in production.

- Dockerfile: parsed here (no Docker engine on this machine): multi-stage, non-root, a
  HEALTHCHECK whose exact command is run against a live gateway.
- docker-compose.yml: `docker-compose config` (compose's own schema check) plus the wiring
  between the replicas, PostgreSQL, Redis, Prometheus and the gateway config they mount.
- prometheus.yml and alerts.yml: `promtool check config`, `promtool check rules` and the alert
  unit tests in alerts_test.yml (`promtool test rules`).
- The Grafana dashboard: its PromQL parsed by promtool, its metric names checked.
- The Helm chart: rendered and linted by Helm's own Go engine (the `helm-python-sdk` package
  bundles it), every object validated against the Kubernetes OpenAPI schemas
  (`kubernetes-validate`).

Every gateway config embedded anywhere goes through the gateway's own `parse_config`, and every
metric name referenced goes through `gateway.metrics.REGISTRY`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from fnmatch import fnmatch
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from gateway.config import LoadedConfig, parse_config
from tests.test_cli import free_port

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "gateway"
ALERTS = DEPLOY / "alerts.yml"
DASHBOARD = DEPLOY / "grafana" / "gateway-dashboard.json"

MASTER_KEY = "k" * 32  # long enough for auth.master_key
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::([-?])([^}]*))?\}")


# --- shared helpers ---------------------------------------------------------------------------


def exported_metrics() -> set[str]:
    """Every sample name the gateway can export, from its registry (with the metrics of the
    modules a gateway imports only when its config uses them: Redis, `serve --workers`)."""
    import gateway.metering.redis_limits
    import gateway.metering.shared_limits  # noqa: F401
    from gateway.metrics import REGISTRY

    suffixes = {
        "counter": ("_total", "_created"),
        "gauge": ("",),
        "histogram": ("_bucket", "_sum", "_count", "_created"),
        "summary": ("", "_sum", "_count", "_created"),
    }
    names = set()
    for family in REGISTRY.collect():
        names.update(family.name + suffix for suffix in suffixes.get(family.type, ("",)))
    return names


def metric_labels() -> dict[str, set[str]]:
    """Family name -> its label names (plus the two Prometheus adds when scraping)."""
    from prometheus_client.metrics import MetricWrapperBase

    from gateway import metrics

    labels = {}
    for value in vars(metrics).values():
        if isinstance(value, metrics.Counter | metrics.Gauge | metrics.Histogram):
            name = value.collect().name  # (a counter's without `_total`, as the library's)
            labels[name] = set(value.labelnames) | {"instance", "job"}
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                labels[family.name] = set(getattr(value, "_labelnames", ())) | {"instance", "job"}
    return labels


def referenced_metrics(expr: str) -> set[str]:
    """The gateway metric names a PromQL expression reads (label values stripped first)."""
    without_strings = re.sub(r'"[^"]*"', '""', expr)
    return set(re.findall(r"\bgateway_[a-z0-9_]+\b", without_strings))


def check_config(raw: Any, env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> LoadedConfig:
    """Validate a gateway config the way `gateway serve` would, with exactly `env` set for the
    variables it references: a reference nobody provides shows up as a warning."""
    for name in set(re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", json.dumps(raw))):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return parse_config(raw, "<deploy>")


def uncomment_examples(text: str) -> str:
    """Turn commented-out YAML keys (`# - name: x`, `#   api_key: y`) into live lines, so a
    commented example can be validated too. Prose comments start with a capital or have no
    `key:` and stay comments."""
    return re.sub(r"(?m)^(\s*)# (\s*(?:- )?[a-z_]+:(?: .*)?)$", r"\1\2", text)


def promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus)")
    return path


def run_promtool(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [promtool(), *args], capture_output=True, text=True, cwd=ROOT, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result


# --- Dockerfile -------------------------------------------------------------------------------


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not current):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        keyword, _, args = current.partition(" ")
        out.append((keyword.upper(), " ".join(args.split())))
        current = ""
    assert not current, "the Dockerfile ends inside a continued line"
    return out


def dockerfile_stages(path: Path) -> list[list[tuple[str, str]]]:
    stages: list[list[tuple[str, str]]] = []
    for keyword, args in dockerfile_instructions(path):
        if keyword == "FROM":
            stages.append([])
        elif not stages:
            assert keyword == "ARG", f"{keyword} before the first FROM"
            continue
        stages[-1].append((keyword, args))
    return stages


def dockerfile_env(stage: list[tuple[str, str]]) -> dict[str, str]:
    env = {}
    for keyword, args in stage:
        if keyword == "ENV":
            for pair in args.split():
                name, _, value = pair.partition("=")
                env[name] = value
    return env


def image_config_path() -> str:
    final = dockerfile_stages(DEPLOY / "Dockerfile")[-1]
    return dockerfile_env(final)["GATEWAY_CONFIG"]


def healthcheck_command() -> list[str]:
    final = dockerfile_stages(DEPLOY / "Dockerfile")[-1]
    checks = [args for keyword, args in final if keyword == "HEALTHCHECK"]
    assert len(checks) == 1, "the final stage needs exactly one HEALTHCHECK"
    options, _, command = checks[0].partition(" CMD ")
    assert "--interval=" in options and "--timeout=" in options, options
    assert command.startswith("["), "HEALTHCHECK CMD in exec (JSON) form: no shell needed"
    parsed: list[str] = json.loads(command)
    return parsed


def test_dockerfile_is_multi_stage_and_ships_only_the_built_virtualenv() -> None:
    instructions = dockerfile_instructions(DEPLOY / "Dockerfile")
    froms = [args for keyword, args in instructions if keyword == "FROM"]
    assert len(froms) >= 2
    build_stages = [f.split(" AS ")[-1] for f in froms[:-1] if " AS " in f]
    assert build_stages, "the build stage needs a name for COPY --from"
    final = dockerfile_stages(DEPLOY / "Dockerfile")[-1]
    copies = [args for keyword, args in final if keyword == "COPY"]
    assert any(c.startswith(f"--from={stage} ") for c in copies for stage in build_stages), (
        "the final stage copies the build stage's output"
    )
    # Sources and build tools stay in the build stage.
    assert not any("pip install" in args for keyword, args in final if keyword == "RUN")
    assert not any(c.split()[0] in ("gateway", ".") for c in copies)


def test_dockerfile_base_image_satisfies_requires_python() -> None:
    from packaging.specifiers import SpecifierSet

    args = [a for k, a in dockerfile_instructions(DEPLOY / "Dockerfile") if k == "ARG"]
    image = dict(a.split("=", 1) for a in args if "=" in a)["PYTHON_IMAGE"]
    match = re.match(r"python:(\d+\.\d+)", image)
    assert match, image
    pyproject = (ROOT / "pyproject.toml").read_text()
    requires = re.search(r'requires-python = "([^"]+)"', pyproject)
    assert requires
    assert match.group(1) in SpecifierSet(requires.group(1))


def test_dockerfile_final_stage_runs_as_a_numeric_non_root_user() -> None:
    final = dockerfile_stages(DEPLOY / "Dockerfile")[-1]
    users = [args for keyword, args in final if keyword == "USER"]
    assert users, "the final stage needs a USER"
    uid = users[-1].split(":")[0]
    # Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
    assert uid.isdigit() and int(uid) != 0
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == int(uid)


def test_dockerfile_has_no_secret_and_serves_the_config_it_copies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    final = dockerfile_stages(DEPLOY / "Dockerfile")[-1]
    for keyword, args in dockerfile_instructions(DEPLOY / "Dockerfile"):
        if keyword in ("ENV", "ARG"):
            for pair in args.split():
                name, _, value = pair.partition("=")
                if re.search(r"KEY|TOKEN|PASSWORD|SECRET", name, re.IGNORECASE):
                    assert not value, f"{keyword} {name} bakes a secret into the image"
    entrypoint = json.loads(next(a for k, a in final if k == "ENTRYPOINT"))
    cmd = json.loads(next(a for k, a in final if k == "CMD"))
    assert entrypoint + cmd == ["gateway", "serve"]
    config_path = image_config_path()
    copied = [a.split() for k, a in final if k == "COPY" and not a.startswith("--")]
    assert [src for src, dst in copied if dst == config_path] == ["deploy/docker/gateway.yaml"]
    exposed = [a for k, a in final if k == "EXPOSE"]
    raw = yaml.safe_load((DEPLOY / "docker" / "gateway.yaml").read_text())
    config = check_config(raw, {}, monkeypatch).config
    assert exposed == [str(config.server.port)]
    assert config.server.host == "0.0.0.0", "in a container the gateway must listen on all"
    assert f":{config.server.port}/health/live" in " ".join(healthcheck_command())


def test_image_config_and_its_commented_example_validate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    text = (DEPLOY / "docker" / "gateway.yaml").read_text()
    loaded = check_config(yaml.safe_load(text), {}, monkeypatch)
    assert [m.name for m in loaded.config.models] == ["demo"]
    assert loaded.config.store.sqlite_path.is_absolute()
    assert loaded.warnings == []
    example = check_config(
        yaml.safe_load(uncomment_examples(text)), {"OPENAI_API_KEY": "sk-test"}, monkeypatch
    ).config
    assert [m.name for m in example.models] == ["demo", "gpt-4o-mini"]
    assert example.models[1].deployments[0].api_key == "sk-test"


def _dockerignored(path: str, patterns: list[str]) -> bool:
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        bare = pattern.removeprefix("**/")
        for prefix in prefixes:
            if fnmatch(prefix, pattern) or (
                bare != pattern and fnmatch(prefix.split("/")[-1], bare)
            ):
                return True
    return False


def test_dockerfile_copies_exist_and_are_not_dockerignored() -> None:
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    patterns = [p.strip() for p in lines if p.strip() and not p.startswith("#")]
    assert not any(p.startswith("!") for p in patterns), "the check below ignores exceptions"
    for must_skip in (".git", ".venv", "data", "deploy/.env"):
        assert _dockerignored(must_skip, patterns), must_skip
    for stage in dockerfile_stages(DEPLOY / "Dockerfile"):
        for keyword, args in stage:
            if keyword != "COPY" or args.startswith("--from="):
                continue
            *sources, _destination = args.split()
            for source in sources:
                assert (ROOT / source).exists(), source
                assert not _dockerignored(source.rstrip("/"), patterns), source


def _wait_live(port: int, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert process.poll() is None, "the gateway exited before listening"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/live", timeout=1):
                return
        except OSError:
            time.sleep(0.1)
    raise AssertionError("the gateway did not answer /health/live within 30 s")


def test_healthcheck_command_passes_on_a_live_gateway_and_fails_after_sigterm(
    tmp_path: Path,
) -> None:
    """The image's own config and HEALTHCHECK, run here: only paths and port differ."""
    raw = yaml.safe_load((DEPLOY / "docker" / "gateway.yaml").read_text())
    raw["store"]["url"] = f"sqlite:///{tmp_path}/gateway.db"
    raw["store"]["spool_path"] = str(tmp_path / "spool")
    config = tmp_path / "gateway.yaml"
    config.write_text(yaml.safe_dump(raw))
    port = free_port()
    command = [
        sys.executable if arg == "python" else arg.replace(":4000/", f":{port}/")
        for arg in healthcheck_command()
    ]
    assert command != healthcheck_command()
    env = {k: v for k, v in os.environ.items() if k != "GATEWAY_MASTER_KEY"}
    with (tmp_path / "stderr").open("wb") as stderr:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gateway",
                "serve",
                "--config",
                str(config),
                "--port",
                str(port),
            ],
            stderr=stderr,
            env=env,
        )
        try:
            _wait_live(port, process)
            assert subprocess.run(command, timeout=10, check=False).returncode == 0
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0, "SIGTERM drains and exits 0"
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    failed = subprocess.run(command, timeout=10, capture_output=True, check=False)
    assert failed.returncode != 0


# --- docker compose ---------------------------------------------------------------------------

COMPOSE_FILE = DEPLOY / "docker-compose.yml"
COMPOSE_ENV = {"GATEWAY_MASTER_KEY": MASTER_KEY, "POSTGRES_PASSWORD": "pw-test"}


def compose_interpolate(value: str, env: dict[str, str]) -> str:
    """Compose's `${VAR}`, `${VAR:-default}` and `${VAR:?error}` against `env`."""

    def replace(match: re.Match[str]) -> str:
        name, kind, rest = match.groups()
        if env.get(name):
            return env[name]
        assert kind != "?", f"compose requires {name}: {rest}"
        return rest if kind == "-" else ""

    return _ENV_REF.sub(replace, value)


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(COMPOSE_FILE.read_text())
    return data


def gateway_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: service
        for name, service in compose["services"].items()
        if service.get("build", {}).get("dockerfile") == "deploy/Dockerfile"
    }


def service_using(compose: dict[str, Any], image: str) -> str:
    names = [n for n, s in compose["services"].items() if s.get("image", "").startswith(image)]
    assert len(names) == 1, f"one service runs {image}: {names}"
    return names[0]


def test_compose_runs_two_gateway_replicas_with_postgres_redis_and_prometheus(
    compose: dict[str, Any],
) -> None:
    gateways = gateway_services(compose)
    assert len(gateways) >= 2
    for image in ("postgres:", "redis:", "prom/prometheus:"):
        service_using(compose, image)
    for service in gateways.values():
        assert (COMPOSE_FILE.parent / service["build"]["context"]).resolve() == ROOT
        assert set(service["depends_on"]) >= {
            service_using(compose, "postgres:"),
            service_using(compose, "redis:"),
        }
        assert all(d["condition"] == "service_healthy" for d in service["depends_on"].values())
    # Each replica keeps its own spool and SQLite fallback.
    data_volumes = [
        v.split(":")[0]
        for s in gateways.values()
        for v in s["volumes"]
        if v.split(":")[1] == "/var/lib/gateway"
    ]
    assert len(set(data_volumes)) == len(gateways)
    published = [p.rsplit(":", 2)[-2] for s in gateways.values() for p in s["ports"]]
    assert len(set(published)) == len(published), "two replicas cannot publish one host port"


def test_compose_bind_mounts_exist(compose: dict[str, Any]) -> None:
    for name, service in compose["services"].items():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                assert (COMPOSE_FILE.parent / source).exists(), f"{name}: {source}"


def test_compose_gateway_config_validates_with_the_environment_compose_gives(
    compose: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    postgres = compose["services"][service_using(compose, "postgres:")]
    redis = service_using(compose, "redis:")
    for service in gateway_services(compose).values():
        env = {
            k: compose_interpolate(str(v), COMPOSE_ENV) for k, v in service["environment"].items()
        }
        # Secrets are references to deploy/.env, never literal values in the compose file.
        for name, value in service["environment"].items():
            if re.search(r"KEY|PASSWORD|TOKEN|SECRET", name):
                assert re.fullmatch(r"\$\{[^}]+\}", str(value)), f"{name} is not a reference"
        mounts = dict(reversed(v.split(":")[:2]) for v in service["volumes"])
        source = COMPOSE_FILE.parent / mounts[image_config_path()]
        text = source.read_text()
        loaded = check_config(yaml.safe_load(text), env, monkeypatch)
        assert loaded.warnings == [], "every ${VAR} of the config is in the compose environment"
        config = loaded.config
        assert config.server.host == "0.0.0.0"
        assert any(p.endswith(f":{config.server.port}") for p in service["ports"])
        assert config.auth.master_key == MASTER_KEY
        url = urlsplit(config.store.url)
        assert config.store.backend == "postgresql"
        assert url.hostname == service_using(compose, "postgres:")
        assert url.username == postgres["environment"]["POSTGRES_USER"]
        assert url.password == COMPOSE_ENV["POSTGRES_PASSWORD"]
        assert url.path == "/" + postgres["environment"]["POSTGRES_DB"]
        assert config.limits.redis_url and urlsplit(config.limits.redis_url).hostname == redis
        assert config.store.spool_path.startswith("/var/lib/gateway/")
        # Docker waits stop_grace_period after SIGTERM: longer than the gateway's drain.
        assert int(service["stop_grace_period"].rstrip("s")) > config.server.shutdown_grace_s
        example = check_config(yaml.safe_load(uncomment_examples(text)), env, monkeypatch)
        assert "gpt-4o-mini" in [m.name for m in example.config.models]
        assert example.warnings == []


def test_compose_env_example_names_every_required_variable() -> None:
    required = set(re.findall(r"\$\{([A-Z_]+):\?", COMPOSE_FILE.read_text()))
    assert required
    example = (DEPLOY / ".env.example").read_text()
    defined = set(re.findall(r"(?m)^([A-Z_]+)=", example))
    assert required <= defined
    assert ".env" in (DEPLOY / ".gitignore").read_text().split()


def test_compose_file_passes_docker_compose_config(tmp_path: Path) -> None:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.skip("docker-compose is not installed (Debian: apt-get install docker-compose)")
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), **COMPOSE_ENV}
    result = subprocess.run(
        [binary, "--project-directory", str(DEPLOY), "-f", str(COMPOSE_FILE), "config"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    normalized = yaml.safe_load(result.stdout)
    assert set(normalized["services"]) == set(yaml.safe_load(COMPOSE_FILE.read_text())["services"])
    missing = subprocess.run(
        [binary, "--project-directory", str(DEPLOY), "-f", str(COMPOSE_FILE), "config"],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)},
        timeout=60,
        check=False,
    )
    if not (DEPLOY / ".env").exists():
        assert missing.returncode != 0, "a missing GATEWAY_MASTER_KEY must stop compose"


# --- Prometheus ---------------------------------------------------------------------------------


def test_prometheus_scrapes_every_gateway_replica_and_loads_the_alerts(
    compose: dict[str, Any],
) -> None:
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = {
        target
        for job in config["scrape_configs"]
        if job["job_name"] == "gateway"
        for static in job["static_configs"]
        for target in static["targets"]
    }
    expected = set()
    for name, service in gateway_services(compose).items():
        port = service["ports"][0].rsplit(":", 1)[-1]
        expected.add(f"{name}:{port}")
    assert targets == expected
    assert config["rule_files"] == [ALERTS.name]
    prometheus = compose["services"][service_using(compose, "prom/prometheus:")]
    mounted = {v.split(":")[0]: v.split(":")[1] for v in prometheus["volumes"]}
    assert mounted["./prometheus.yml"] == "/etc/prometheus/prometheus.yml"
    assert mounted[f"./{ALERTS.name}"] == f"/etc/prometheus/{ALERTS.name}"


def test_promtool_accepts_the_config_and_the_rules() -> None:
    run_promtool("check", "config", "deploy/prometheus.yml")
    run_promtool("check", "rules", "deploy/alerts.yml")


def test_every_alert_fires_in_the_promtool_unit_tests() -> None:
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    tests = yaml.safe_load((Path(__file__).parent / "alerts_test.yml").read_text())
    fired = {
        case["alertname"]
        for test in tests["tests"]
        for case in test.get("alert_rule_test", [])
        if case["exp_alerts"]
    }
    assert {r["alert"] for r in rules} <= fired
    result = run_promtool("test", "rules", "tests/deploy/alerts_test.yml")
    assert "SUCCESS" in result.stdout


def test_alerts_cover_errors_budgets_store_redis_crashes_and_cooldowns() -> None:
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    exprs = {r["alert"]: " ".join(r["expr"].split()) for r in rules}
    covered = {
        "error rate": r'gateway_requests_total\{status=~"5\.\."',
        "budget exhaustion": r'gateway_limit_rejections_total\{limit="budget"\}',
        "store queue depth": r"gateway_store_queue_depth",
        "spooling": r"gateway_store_spooling",
        "spool size": r"gateway_store_spool_bytes",
        "Redis errors": r"gateway_redis_errors_total",
        "local limit fallback": r"gateway_limit_local_fallbacks_total",
        "crash recoveries": r'gateway_turns_total\{status="aborted", reason="crash_recovered"\}',
        "cooldowns": r'gateway_deployment_state\{state="cooling"\}',
    }
    for what, pattern in covered.items():
        assert any(re.search(pattern, e) for e in exprs.values()), what
    known = exported_metrics()
    for rule in rules:
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        unknown = referenced_metrics(rule["expr"]) - known
        assert not unknown, f"{rule['alert']} reads metrics the gateway does not export: {unknown}"


def test_every_alert_is_described_in_the_deploy_readme() -> None:
    readme = (DEPLOY / "README.md").read_text()
    monitoring = readme.split("\n## Monitoring\n", 1)[1].split("\n## ", 1)[0]
    described = set(re.findall(r"`(Gateway[A-Za-z]+)`", monitoring))
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    assert {r["alert"] for r in rules} == described


# --- Grafana ------------------------------------------------------------------------------------


def dashboard_panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def grafana_to_promql(expr: str) -> str:
    """Replace Grafana's variables with what Grafana would put there."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$(instance|alias)\b", ".*", expr)


def test_dashboard_is_well_formed() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    used = set()
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        area = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not area & cells, f"{panel['title']} overlaps another panel"
        cells |= area
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            used.update(re.findall(r"\$(\w+)", target["expr"]))
    assert {u for u in used if not u.startswith("__")} <= set(variables)


def test_dashboard_queries_parse_and_read_exported_metrics(tmp_path: Path) -> None:
    known = exported_metrics()
    exprs = [t["expr"] for p in dashboard_panels() for t in p["targets"]]
    for expr in exprs:
        unknown = referenced_metrics(expr) - known
        assert not unknown, f"{expr} reads metrics the gateway does not export: {unknown}"
    dashboard = json.loads(DASHBOARD.read_text())
    labels = metric_labels()
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["definition"])
        assert match, variable["definition"]
        metric, label = match.groups()
        assert metric in known, variable["definition"]
        assert label in labels[metric.removesuffix("_total")], variable["definition"]
    # promtool parses PromQL when it checks rules: one recording rule per panel query.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{i}", "expr": grafana_to_promql(e)}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(yaml.safe_dump(rules))
    run_promtool("check", "rules", str(path))


def test_compose_grafana_provisions_the_dashboard(compose: dict[str, Any]) -> None:
    grafana = compose["services"][service_using(compose, "grafana/grafana:")]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    dashboard_dir = os.path.dirname(mounts["./grafana/gateway-dashboard.json"])
    provider = yaml.safe_load((DEPLOY / "grafana/provisioning/dashboards/gateway.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == dashboard_dir
    datasource = yaml.safe_load(
        (DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text()
    )["datasources"][0]
    prometheus = service_using(compose, "prom/prometheus:")
    assert datasource["type"] == "prometheus"
    assert urlsplit(datasource["url"]).hostname == prometheus


# --- Helm chart ---------------------------------------------------------------------------------

SECRET_ENV = {
    "GATEWAY_MASTER_KEY": MASTER_KEY,
    "GATEWAY_DATABASE_URL": "postgresql://gateway:pw@postgres:5432/gateway",
    "GATEWAY_REDIS_URL": "redis://redis:6379/0",
}


def helm() -> Any:
    return pytest.importorskip(
        "helm_python",
        reason="helm-python-sdk (Helm's engine) is not installed: pip install -e '.[dev]'",
    )


def render(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`helm template gw deploy/helm/gateway -n llm [--values ...]`, parsed."""
    with helm().Chart.load(str(CHART)) as chart:
        manifests = chart.render(values or {}, name="gw", namespace="llm")
    objects = []
    for path, text in sorted(manifests.items()):
        if path.endswith(".yaml"):
            objects += [o for o in yaml.safe_load_all(text) if o]
    return objects


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds: dict[str, dict[str, Any]] = {}
    for obj in objects:
        assert obj["kind"] not in kinds, f"two {obj['kind']} objects"
        kinds[obj["kind"]] = obj
    return kinds


@pytest.fixture(scope="module")
def rendered() -> dict[str, dict[str, Any]]:
    return by_kind(render())


def container(rendered: dict[str, dict[str, Any]]) -> dict[str, Any]:
    containers = rendered["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: dict[str, Any] = containers[0]
    return result


def k8s_versions() -> list[str]:
    from kubernetes_validate import utils

    return [utils.all_versions()[0], utils.latest_version()]


def validate_k8s(objects: list[dict[str, Any]]) -> None:
    from kubernetes_validate import utils

    for version in k8s_versions():
        for obj in objects:
            try:
                utils.validate(obj, version, strict=True)
            except utils.ValidationError as error:
                where = "/".join(str(p) for p in error.absolute_path)
                raise AssertionError(
                    f"{obj['kind']} invalid for Kubernetes {version} at {where}: {error.message}"
                ) from None


def test_chart_lints_clean() -> None:
    report = helm().lint(str(CHART), strict=True)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


def test_chart_renders_every_object_and_each_validates_against_kubernetes(
    rendered: dict[str, dict[str, Any]],
) -> None:
    assert set(rendered) == {
        "ConfigMap",
        "Deployment",
        "Service",
        "HorizontalPodAutoscaler",
        "PodDisruptionBudget",
    }
    assert "Secret" not in rendered, "the chart references Secrets, never writes them"
    validate_k8s(list(rendered.values()))


def test_chart_kube_version_is_the_oldest_validated() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    oldest = k8s_versions()[0]
    assert chart["kubeVersion"] == f">={oldest}-0"


def test_deployment_probes_drain_and_security(rendered: dict[str, dict[str, Any]]) -> None:
    pod = rendered["Deployment"]["spec"]["template"]["spec"]
    main = container(rendered)
    ports = {p["name"]: p["containerPort"] for p in main["ports"]}
    assert main["readinessProbe"]["httpGet"] == {"path": "/health/ready", "port": "http"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/health/live", "port": "http"}
    assert main["startupProbe"]["httpGet"]["path"] == "/health/live"
    assert "http" in ports
    # Graceful drain: preStop first (the endpoints controller drops the pod), then SIGTERM and
    # shutdown_grace_s for in-flight streams, all within the grace period.
    command = main["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep" and int(command[1]) > 0
    config = yaml.safe_load(rendered["ConfigMap"]["data"]["gateway.yaml"])
    grace = config["server"]["shutdown_grace_s"]
    assert pod["terminationGracePeriodSeconds"] > int(command[1]) + grace
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert main["securityContext"]["allowPrivilegeEscalation"] is False
    assert main["securityContext"]["readOnlyRootFilesystem"] is True
    # A read-only root needs writable mounts for the spool and /tmp.
    mounts = {m["mountPath"]: m for m in main["volumeMounts"]}
    assert config["store"]["spool_path"].startswith("/var/lib/gateway/")
    assert "/var/lib/gateway" in mounts and "/tmp" in mounts
    assert pod["automountServiceAccountToken"] is False


def test_deployment_takes_secrets_from_secret_references(
    rendered: dict[str, dict[str, Any]],
) -> None:
    main = container(rendered)
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in main["env"] if "valueFrom" in e}
    assert set(refs) >= set(SECRET_ENV)
    assert all(r["name"] and r["key"] for r in refs.values())
    assert not [e for e in main["env"] if e["name"] in SECRET_ENV and "value" in e]
    assert [e["secretRef"]["name"] for e in main["envFrom"]] == ["gateway-provider-keys"]


def test_configmap_holds_a_valid_gateway_config_without_secrets(
    rendered: dict[str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    main = container(rendered)
    pod = rendered["Deployment"]["spec"]["template"]["spec"]
    raw = yaml.safe_load(rendered["ConfigMap"]["data"]["gateway.yaml"])
    # Every string that would hold a secret is a ${VAR} reference.
    assert raw["auth"]["master_key"].startswith("${")
    assert raw["store"]["url"].startswith("${")
    secret_env = {e["name"] for e in main["env"] if "valueFrom" in e}
    loaded = check_config(
        raw, {k: v for k, v in SECRET_ENV.items() if k in secret_env}, monkeypatch
    )
    assert loaded.warnings == [], "every ${VAR} of the config comes from a Secret"
    config = loaded.config
    assert config.server.host == "0.0.0.0"
    assert config.store.backend == "postgresql"
    assert config.limits.redis_url is not None
    assert config.auth.master_key == MASTER_KEY
    # The config file the container reads is the one the ConfigMap provides.
    args = main["args"]
    config_path = args[args.index("--config") + 1]
    mount = next(m for m in main["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
    volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
    assert volume["configMap"]["name"] == rendered["ConfigMap"]["metadata"]["name"]
    assert config_path.removeprefix(mount["mountPath"] + "/") in rendered["ConfigMap"]["data"]
    assert main["ports"][0]["containerPort"] == config.server.port
    annotations = rendered["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == str(config.server.port)
    assert annotations["prometheus.io/path"] == "/metrics"
    assert len(annotations["checksum/config"]) == 64


def test_values_commented_openai_example_validates(monkeypatch: pytest.MonkeyPatch) -> None:
    text = (CHART / "values.yaml").read_text()
    raw = yaml.safe_load(uncomment_examples(text))["config"]
    loaded = check_config(raw, {**SECRET_ENV, "OPENAI_API_KEY": "sk-test"}, monkeypatch)
    assert [m.name for m in loaded.config.models] == ["demo", "gpt-4o-mini"]
    assert loaded.config.models[1].deployments[0].api_key == "sk-test"
    objects = by_kind(render({"config": raw}))
    validate_k8s(list(objects.values()))


def test_service_hpa_and_pdb_point_at_the_deployment(rendered: dict[str, dict[str, Any]]) -> None:
    deployment = rendered["Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    service = rendered["Service"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    port_names = {p["name"] for p in container(rendered)["ports"]}
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    hpa = rendered["HorizontalPodAutoscaler"]["spec"]
    assert hpa["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": deployment["metadata"]["name"],
    }
    assert 2 <= hpa["minReplicas"] <= hpa["maxReplicas"]
    assert "replicas" not in deployment["spec"], "the HPA owns the replica count"
    # A CPU utilization target needs a CPU request to compute against.
    assert container(rendered)["resources"]["requests"]["cpu"]
    pdb = rendered["PodDisruptionBudget"]["spec"]
    assert pdb["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pdb["minAvailable"] < hpa["minReplicas"]


def test_without_autoscaling_the_replica_count_rules_and_one_replica_gets_no_pdb() -> None:
    fixed = by_kind(render({"autoscaling": {"enabled": False}, "replicaCount": 3}))
    assert "HorizontalPodAutoscaler" not in fixed
    assert fixed["Deployment"]["spec"]["replicas"] == 3
    assert "PodDisruptionBudget" in fixed
    validate_k8s(list(fixed.values()))
    single = by_kind(render({"autoscaling": {"enabled": False}, "replicaCount": 1}))
    assert "PodDisruptionBudget" not in single, "minAvailable 1 of 1 would block node drains"


def test_chart_refuses_a_grace_period_shorter_than_the_drain() -> None:
    errors = helm().HelmError
    with pytest.raises(errors, match="terminationGracePeriodSeconds"):
        render({"terminationGracePeriodSeconds": 15})  # 5 s preStop + 10 s drain + 1 s exit
    assert by_kind(render({"terminationGracePeriodSeconds": 16}))["Deployment"]
    fractional = {"config": {"server": {"shutdown_grace_s": 2.5}}}
    ok = by_kind(render({**fractional, "terminationGracePeriodSeconds": 9}))
    assert ok["Deployment"]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 9


# Fields the Prometheus Operator's ServiceMonitor CRD (monitoring.coreos.com/v1) defines, for
# the parts the chart writes: kubernetes-validate knows no CRD, so a misspelt field would
# otherwise pass here and be dropped by the API server.
SERVICE_MONITOR_FIELDS = {
    "spec": {"endpoints", "selector", "namespaceSelector", "jobLabel", "targetLabels",
             "podTargetLabels", "sampleLimit", "targetLimit", "attachMetadata"},
    "endpoint": {"port", "targetPort", "path", "scheme", "params", "interval", "scrapeTimeout",
                 "tlsConfig", "bearerTokenSecret", "authorization", "honorLabels",
                 "honorTimestamps", "basicAuth", "oauth2", "metricRelabelings", "relabelings",
                 "proxyUrl", "followRedirects", "enableHttp2", "filterRunning"},
    "relabeling": {"sourceLabels", "separator", "targetLabel", "regex", "modulus",
                   "replacement", "action"},
}  # fmt: skip


def alert_jobs() -> set[str]:
    """The `job` label values deploy/alerts.yml selects on."""
    rules = [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]
    return {job for r in rules for job in re.findall(r'\bjob="([^"]+)"', r["expr"])}


def test_service_monitor_scrapes_the_service_with_the_job_the_alerts_read() -> None:
    assert "ServiceMonitor" not in by_kind(render()), "off unless asked for"
    objects = by_kind(render({"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}}))
    monitor, service = objects["ServiceMonitor"], objects["Service"]
    validate_k8s([o for o in objects.values() if o["kind"] != "ServiceMonitor"])
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "prom"  # for serviceMonitorSelector
    spec = monitor["spec"]
    assert set(spec) <= SERVICE_MONITOR_FIELDS["spec"]
    # It selects this Service, in its namespace, and no other object's labels.
    assert spec["namespaceSelector"] == {"matchNames": ["llm"]}
    selector = spec["selector"]["matchLabels"]
    assert selector.items() <= service["metadata"]["labels"].items()
    assert selector == service["spec"]["selector"]
    (endpoint,) = spec["endpoints"]
    assert set(endpoint) <= SERVICE_MONITOR_FIELDS["endpoint"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    # Prometheus refuses a scrape timeout longer than the interval.
    seconds = {"s": 1, "m": 60, "h": 3600}
    interval, timeout = (int(endpoint[k][:-1]) * seconds[endpoint[k][-1]]
                         for k in ("interval", "scrapeTimeout"))  # fmt: skip
    assert timeout <= interval
    # The job label ends as the one the alerts select on (the operator's default would be the
    # Service's name, gw-gateway).
    relabel = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert all(set(r) <= SERVICE_MONITOR_FIELDS["relabeling"] for r in endpoint["relabelings"])
    assert [(r["action"], r["replacement"]) for r in relabel] == [("replace", "gateway")]
    assert "sourceLabels" not in relabel[0]
    assert alert_jobs() == {"gateway"}
    assert service["metadata"]["name"] != "gateway"  # so the relabeling is needed
    renamed = by_kind(render({"serviceMonitor": {"enabled": True, "jobName": "llm-gw"}}))
    endpoint = renamed["ServiceMonitor"]["spec"]["endpoints"][0]
    assert endpoint["relabelings"][-1]["replacement"] == "llm-gw"


@pytest.mark.parametrize(
    "values",
    [
        {"autoscalling": {"enabled": False}},
        {"secrets": {"envFrom": [{"name": "keys", "optinal": True}]}},
        {"replicaCount": "two"},
        {"config": {"server": {"port": 70000}}},
        {"serviceMonitor": {"enabled": True, "interval": "30"}},
        {"serviceMonitor": {"enable": True}},
    ],
)
def test_chart_schema_rejects_mistyped_values(values: dict[str, Any]) -> None:
    """values.schema.json: a typo fails the render instead of being silently ignored."""
    with pytest.raises(helm().HelmValuesError, match="schema"):
        render(values)


def secrets_in(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from secrets_in(value)
    elif isinstance(node, list):
        for value in node:
            yield from secrets_in(value)
    elif isinstance(node, str) and re.search(r"\bsk-[A-Za-z0-9]{8,}|://[^/:@\s]+:[^$@/\s]+@", node):
        yield node


def test_no_literal_secret_in_any_deploy_file() -> None:
    for path in [*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]:
        if "templates" in path.parts:
            continue  # Go templates; their rendered output is checked above
        for document in yaml.safe_load_all(path.read_text()):
            assert list(secrets_in(document)) == [], path
