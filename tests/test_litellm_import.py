"""`gateway import-litellm`: LiteLLM proxy configs written from LiteLLM's documented examples
(tests/fixtures/litellm) become configs `check-config` accepts, with the same model names
served by the same providers and models, routing and retries kept, and what has no
counterpart listed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

FIXTURES = Path(__file__).parent / "fixtures" / "litellm"
ENV = {
    "AZURE_API_BASE": "https://example-resource.openai.azure.com",
    "AZURE_API_KEY": "azure-test-key",
    "OPENAI_API_KEY": "openai-test-key",
    "ANTHROPIC_API_KEY": "anthropic-test-key",
    "GROQ_API_KEY": "groq-test-key",
    "LITELLM_MASTER_KEY": "master-test-key-of-length",
    "DATABASE_URL": "postgresql://user:pass@localhost:5432/gateway",
}


def gateway(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, **ENV}
    env.pop("GATEWAY_MASTER_KEY", None)
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], capture_output=True, text=True, env=env
    )


def imported(name: str, tmp_path: Path) -> tuple[dict[str, Any], list[str]]:
    """The converted config (checked by check-config) and the lines of what was not mapped."""
    out = tmp_path / "gateway.yaml"
    made = gateway("import-litellm", str(FIXTURES / name), "-o", str(out))
    assert made.returncode == 0, made.stderr
    checked = gateway("check-config", "--config", str(out))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert ": OK (" in checked.stdout
    return yaml.safe_load(out.read_text()), made.stderr.splitlines()


def served(config: dict[str, Any]) -> dict[str, list[tuple[str, str]]]:
    return {
        m["name"]: [(d["provider"], d["model"]) for d in m["deployments"]] for m in config["models"]
    }


def test_the_quick_start_keeps_its_models_keys_and_master_key(tmp_path: Path) -> None:
    config, unmapped = imported("quickstart.yaml", tmp_path)
    assert served(config) == {
        "gpt-3.5-turbo": [("azure", "my_azure_deployment")],
        "gpt-4o": [("openai", "gpt-4o")],
        "claude-3-5-sonnet": [("anthropic", "claude-3-5-sonnet-20240620")],
    }
    azure = config["models"][0]["deployments"][0]
    assert azure["api_base"] == "${AZURE_API_BASE}" and azure["api_key"] == "${AZURE_API_KEY}"
    assert azure["api_version"] == "2024-07-01-preview"
    assert all(m["drop_params"] is True for m in config["models"])
    # LiteLLM's example key is too short to be taken here: the operator sets one.
    assert config["auth"] == {"master_key": "${GATEWAY_MASTER_KEY}"}
    assert any("general_settings.master_key: shorter than" in line for line in unmapped)
    assert any("litellm_settings.success_callback" in line for line in unmapped)


def test_load_balancing_keeps_routing_retries_cooldowns_and_fallbacks(tmp_path: Path) -> None:
    config, unmapped = imported("load_balancing.yaml", tmp_path)
    assert served(config) == {
        "gpt-3.5-turbo": [("azure", "chatgpt-v-2"), ("openai", "gpt-3.5-turbo")],
        "gpt-4": [("openai", "gpt-4")],
    }
    shuffled, gpt4 = config["models"]
    assert shuffled["strategy"] == "weighted"
    assert shuffled["retry"] == {"max_attempts": 3}
    assert shuffled["cooldown"] == {"failures": 4, "cooldown_s": 30.0}
    assert shuffled["fallbacks"] == ["gpt-4"]
    assert shuffled["deployments"][0]["timeouts"] == {"total_s": 30.0}
    # A deployment's own timeout holds over the router's.
    assert gpt4["deployments"][0]["timeouts"] == {"total_s": 300.0, "first_token_s": 60.0}
    rpm = [line for line in unmapped if ".litellm_params.rpm" in line]
    assert len(rpm) == 2 and all("per key and team" in line for line in rpm)


def test_self_hosted_servers_go_through_litellm_or_as_openai_compatible(tmp_path: Path) -> None:
    config, unmapped = imported("self_hosted.yaml", tmp_path)
    assert served(config) == {
        "llama3": [("litellm", "ollama/llama3")],
        "my-vllm": [("openai", "facebook/opt-125m")],
        "groq-llama": [("litellm", "groq/llama3-8b-8192")],
    }
    assert config["models"][1]["deployments"][0]["api_base"] == "http://localhost:8000/v1"
    assert config["auth"] == {"master_key": "${LITELLM_MASTER_KEY}"}
    assert config["store"] == {"url": "${DATABASE_URL}"}
    assert any("model_list[2].model_info" in line for line in unmapped)
    assert any("general_settings.store_model_in_db" in line for line in unmapped)


@pytest.mark.parametrize(
    "text", ["model_list: 3\n", "not: litellm\n", "model_list: [\n"], ids=["list", "map", "yaml"]
)
def test_a_file_that_is_not_a_litellm_config_is_refused(text: str, tmp_path: Path) -> None:
    source = tmp_path / "config.yaml"
    source.write_text(text)
    made = gateway("import-litellm", str(source))
    assert made.returncode == 2 and made.stdout == ""
    assert str(source) in made.stderr


def test_check_config_on_a_litellm_config_says_how_to_convert_it(tmp_path: Path) -> None:
    checked = gateway("check-config", "--config", str(FIXTURES / "quickstart.yaml"))
    assert checked.returncode == 2
    assert "gateway import-litellm" in checked.stderr


def test_the_routers_redis_is_the_replicas_and_budgets_name_their_limits(
    tmp_path: Path,
) -> None:
    """LiteLLM's router Redis (its docs' `os.environ/REDIS_*` form) becomes `limits.redis_url`;
    its proxy-wide budgets, which live on teams and keys here, are each listed once with the
    `limits` that keep them; a router setting met by every alias is listed once."""
    source = tmp_path / "litellm.yaml"
    source.write_text(
        yaml.safe_dump(
            {
                "model_list": [
                    {"model_name": name, "litellm_params": {"model": f"openai/{name}"}}
                    for name in ("gpt-4o", "gpt-4o-mini")
                ],
                "router_settings": {
                    "routing_strategy": "usage-based-routing-v2",
                    "redis_host": "os.environ/REDIS_HOST",
                    "redis_password": "os.environ/REDIS_PASSWORD",
                    "redis_port": "os.environ/REDIS_PORT",
                },
                "litellm_settings": {
                    "max_budget": 100,
                    "budget_duration": "30d",
                    "max_end_user_budget": 0.5,
                },
            }
        )
    )
    out = tmp_path / "gateway.yaml"
    made = gateway("import-litellm", str(source), "-o", str(out))
    assert made.returncode == 0, made.stderr
    config = yaml.safe_load(out.read_text())
    assert config["limits"] == {
        "redis_url": "redis://:${REDIS_PASSWORD}@${REDIS_HOST}:${REDIS_PORT}/0"
    }
    unmapped = made.stderr.splitlines()
    [budget] = [line for line in unmapped if "litellm_settings.max_budget" in line]
    assert '`limits.budget` {"usd": 100, "period": "month", "mode": "hard"}' in budget
    [end_user] = [line for line in unmapped if "max_end_user_budget" in line]
    assert '`limits.end_user.budget` {"usd": 0.5, "period": "total"' in end_user
    assert not any("budget_duration" in line or "redis_" in line for line in unmapped)
    assert len([line for line in unmapped if "routing_strategy" in line]) == 1
    env = {"REDIS_HOST": "redis.internal", "REDIS_PORT": "6380", "REDIS_PASSWORD": "s3cret"}
    checked = subprocess.run(
        [sys.executable, "-m", "gateway", "check-config", "--config", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, **ENV, **env},
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
