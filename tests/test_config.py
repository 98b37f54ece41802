"""Config files: the documented shape loads; a bad file names the file, the field and the reason."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from gateway.config import ConfigError, load_config

ISSUE_SHAPE = """
server: {host: 127.0.0.1, port: 4000}
store: {url: "sqlite:///data/gateway.db"}
models:
  - name: demo
    deployments: [{provider: demo}]
  - name: gpt-4o-mini
    deployments:
      - provider: openai            # any OpenAI-compatible endpoint
        model: gpt-4o-mini          # the upstream's model id
        api_base: https://api.openai.com/v1
        api_key: ${OPENAI_API_KEY}
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(text)
    return path


def test_the_documented_shape_loads_and_reads_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    loaded = load_config(write(tmp_path, ISSUE_SHAPE))
    assert [m.name for m in loaded.config.models] == ["demo", "gpt-4o-mini"]
    assert loaded.config.models[1].deployments[0].api_key == "sk-from-env"
    assert loaded.warnings == []


def test_an_unset_variable_is_a_warning_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    loaded = load_config(write(tmp_path, ISSUE_SHAPE))
    assert (
        loaded.config.models[1].deployments[0].api_key is None
        or loaded.config.models[1].deployments[0].api_key == ""
    )
    assert loaded.warnings == [
        f"{tmp_path / 'gateway.yaml'}: models[1].deployments[0].api_key: "
        "environment variable OPENAI_API_KEY is not set"
    ]


def test_defaults_in_references(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GW_PORT", raising=False)
    loaded = load_config(write(tmp_path, "server: {port: '${GW_PORT:-4321}'}\n"))
    assert loaded.config.server.port == 4321


def test_the_shipped_config_is_valid() -> None:
    loaded = load_config(Path(__file__).parents[1] / "config" / "gateway.yaml")
    assert loaded.config.server.port == 4000
    assert loaded.config.store.url == "sqlite:///data/gateway.db"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("server: {hots: 1}\n", "server.hots: unknown field"),
        (
            "models:\n  - name: x\n    deployments: [{provider: nope}]\n",
            "models[0].deployments[0].provider: Input should be 'openai', 'azure', 'anthropic',"
            " 'litellm' or 'demo'",
        ),
        (
            "models:\n  - name: x\n    deployments: [{provider: openai}]\n",
            "models[0].deployments[0]: Value error, provider 'openai' needs api_base",
        ),
        (
            "models:\n  - name: x\n    deployments: []\n",
            "models[0].deployments: List should have at least 1 item",
        ),
        ("server: {port: 99999}\n", "server.port: Input should be less than or equal to 65535"),
        (
            "store: {url: 'mysql://x'}\n",
            "store.url: Value error, use sqlite:///PATH or postgresql://",
        ),
        (
            "models: [{name: a, deployments: [{provider: demo}]},"
            " {name: a, deployments: [{provider: demo}]}]\n",
            "model alias 'a' is defined twice",
        ),
        ("server: [1\n", "line 2, column 1: invalid YAML"),
        ("- just a list\n", "the top level must be a mapping"),
    ],
)
def test_bad_files_fail_with_file_field_and_reason(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).startswith(f"{path}: ")
    assert message in str(caught.value)


def test_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "absent.yaml")


def test_the_master_key_comes_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_MASTER_KEY", raising=False)
    assert load_config(write(tmp_path, "models: []\n")).config.auth.master_key is None
    shipped = Path(__file__).parents[1] / "config" / "gateway.yaml"
    assert load_config(shipped).config.auth.master_key is None  # open, no warning about it
    monkeypatch.setenv("GATEWAY_MASTER_KEY", "a-long-enough-master-key")
    assert (
        load_config(write(tmp_path, "models: []\n")).config.auth.master_key
        == "a-long-enough-master-key"
    )
    assert load_config(shipped).config.auth.master_key == "a-long-enough-master-key"
    monkeypatch.setenv("GATEWAY_MASTER_KEY", "short")
    with pytest.raises(ConfigError, match="master_key must be at least 16 characters"):
        load_config(write(tmp_path, "models: []\n"))


def test_tracing_without_opentelemetry_installed_fails_at_load_naming_file_and_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # As if the `otel` extra were not installed: `gateway serve` and `check-config` then stop
    # with this message instead of a traceback from the tracer's start.
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    path = tmp_path / "gw.yaml"
    path.write_text("tracing: {otlp_endpoint: 'http://127.0.0.1:4318/v1/traces'}\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(path) in str(raised.value)
    assert "tracing.otlp_endpoint" in str(raised.value)
    assert "gateway[otel]" in str(raised.value)


def test_a_tracing_endpoint_must_be_otlp_over_http(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("tracing: {otlp_endpoint: 'collector:4317'}\n")
    with pytest.raises(ConfigError, match=r"tracing\.otlp_endpoint.*http://"):
        load_config(path)


def test_a_field_an_unset_variable_left_wrong_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_BASE", raising=False)
    monkeypatch.delenv("GW_PORT", raising=False)
    text = (
        "server: {port: '${GW_PORT}'}\n"
        "models: [{name: a, deployments: [{provider: openai, api_base: '${AZURE_BASE}'}]}]\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    lines = str(caught.value).splitlines()
    assert any("server.port" in line and "(${GW_PORT} is not set)" in line for line in lines)
    assert any(
        "models[0].deployments[0]" in line and "(${AZURE_BASE} is not set)" in line
        for line in lines
    )
    assert len(lines) == 2  # every error of the file at once


@pytest.mark.parametrize(
    "text", ["", "\n", "# only a comment\n"], ids=["empty", "blank", "comment"]
)
def test_an_empty_file_is_refused(text: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="the file is empty"):
        load_config(write(tmp_path, text))


def test_every_error_of_a_file_is_said_at_once(tmp_path: Path) -> None:
    text = (
        "server: {port: 99999}\n"
        "models:\n"
        "  - {name: a, fallbacks: [nope], deployments: [{provider: demo, bogus: 1}]}\n"
        "  - {name: a, deployments: [{provider: demo}]}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, text))
    said = str(caught.value)
    for error in (
        "models[1].name: model alias 'a' is defined twice",
        "models[0].fallbacks: model 'a': fallback alias 'nope' is not defined",
        "server.port: Input should be less than or equal to 65535",
        "models[0].deployments[0].bogus: unknown field",
    ):
        assert error in said
    assert len(said.splitlines()) == 4
