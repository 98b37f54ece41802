"""A deployment's cloud settings as the config takes them: each deployment's own AWS, Vertex AI
and Azure AD settings refused where they do not belong, handed to litellm with each call, and
their secrets scrubbed as API keys are. (Two Bedrock regions under one alias, each request
signed for its own: test_bedrock.py; the packages a provider needs: test_provider_extras.py.)"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from gateway import scrub
from gateway.config import ConfigError, parse_config
from gateway.providers import cloud
from tests.providers.test_adapter_contract import LITELLM_SKIP

GATEWAY = [sys.executable, "-m", "gateway"]
VERTEX = {"provider": "litellm", "model": "vertex_ai/gemini-2.5-flash"}
BEDROCK = {"provider": "litellm", "model": "bedrock/anthropic.claude-3-7-sonnet-20250219-v1:0"}
AZURE = {"provider": "litellm", "model": "azure/gpt-4o", "api_base": "https://x.openai.azure.com"}


def config_of(*deployments: dict[str, Any]) -> dict[str, Any]:
    return {"models": [{"name": "m", "deployments": list(deployments)}]}


def refused(*deployments: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as raised:
        parse_config(config_of(*deployments), "gw.yaml")
    return str(raised.value)


# -- the providers extra ---------------------------------------------------------------------


def test_entra_id_sign_in_needs_azure_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "azure.identity", None)
    entra = {"azure_tenant_id": "t", "azure_client_id": "c", "azure_client_secret": "s" * 20}
    assert "azure-identity" in refused({**AZURE, **entra})


# -- which settings, where -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deployment", "message"),
    [
        (
            {**VERTEX, "aws_region": "eu-west-1"},
            "aws_region: for litellm models bedrock/... or sagemaker/...",
        ),
        (
            {**BEDROCK, "vertex_project": "p"},
            "vertex_project: for litellm models vertex_ai/...",
        ),
        (
            {"provider": "openai", "api_base": "https://x.example/v1", "aws_region": "us-east-1"},
            "aws_region: only for provider 'litellm'",
        ),
        ({**BEDROCK, "aws_access_key_id": "AKIA0000000000000000"}, "set both, or neither"),
        ({**BEDROCK, "aws_session_token": "tok"}, "aws_session_token: goes with"),
        (
            {
                **BEDROCK,
                "aws_profile": "prod",
                "aws_access_key_id": "AKIA0000000000000000",
                "aws_secret_access_key": "s" * 40,
            },
            "aws_profile: set it or the access keys, not both",
        ),
        ({**AZURE, "azure_tenant_id": "t"}, "set all three"),
        ({**VERTEX, "vertex_credentials": "/nonexistent/key.json"}, "cannot read"),
        ({**VERTEX, "vertex_credentials": "{not json"}, "not JSON"),
    ],
)
def test_misplaced_or_incomplete_settings_are_refused_naming_the_field(
    deployment: dict[str, Any], message: str
) -> None:
    error = refused(deployment)
    assert "gw.yaml: models[0].deployments[0]" in error
    assert message in error


def test_vertex_credentials_as_a_file_or_as_json(tmp_path: Path) -> None:
    key = {"type": "service_account", "project_id": "p", "private_key": "-----BEGIN KEY-----"}
    path = tmp_path / "key.json"
    path.write_text(json.dumps(key))
    for value in (str(path), json.dumps(key)):
        loaded = parse_config(config_of({**VERTEX, "vertex_credentials": value})).config
        assert loaded.models[0].deployments[0].vertex_credentials == value


# -- passed to litellm with each call --------------------------------------------------------


def test_each_setting_becomes_litellms_argument() -> None:
    deployment = (
        parse_config(
            config_of(
                {
                    **BEDROCK,
                    "aws_region": "eu-central-1",
                    "aws_access_key_id": "AKIA1111111111111111",
                    "aws_secret_access_key": "a" * 40,
                    "aws_session_token": "FwoGZXIvYXdzE" + "b" * 40,
                }
            )
        )
        .config.models[0]
        .deployments[0]
    )
    assert cloud.arguments(deployment.__dict__) == {
        "aws_region_name": "eu-central-1",
        "aws_access_key_id": "AKIA1111111111111111",
        "aws_secret_access_key": "a" * 40,
        "aws_session_token": "FwoGZXIvYXdzE" + "b" * 40,
    }
    vertex = {"vertex_project": "p1", "vertex_location": "europe-west4"}
    deployment = parse_config(config_of({**VERTEX, **vertex})).config.models[0].deployments[0]
    assert cloud.arguments(deployment.__dict__) == vertex
    azure = {"azure_ad_token": "${AZURE_TOKEN:-eyJ0eXAiOiJKV1QiLCJhbGciOi}"}
    deployment = parse_config(config_of({**AZURE, **azure})).config.models[0].deployments[0]
    assert cloud.arguments(deployment.__dict__) == {"azure_ad_token": "eyJ0eXAiOiJKV1QiLCJhbGciOi"}


@pytest.mark.skipif(LITELLM_SKIP is not None, reason=LITELLM_SKIP or "")
async def test_the_adapter_passes_them_with_each_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two deployments of one alias, two projects: each call carries its own deployment's."""
    from gateway.config import DeploymentConfig
    from gateway.providers import litellm_adapter

    litellm = litellm_adapter.load_litellm()
    calls: list[dict[str, Any]] = []

    async def acompletion(**kwargs: Any) -> Any:
        calls.append(kwargs)
        return litellm.ModelResponse(choices=[{"message": {"content": "ok"}}])

    monkeypatch.setattr(litellm, "acompletion", acompletion)
    for project, location in (("p-eu", "europe-west4"), ("p-us", "us-central1")):
        config = DeploymentConfig.model_validate(
            {**VERTEX, "vertex_project": project, "vertex_location": location}
        )
        provider = litellm_adapter.LiteLLMProvider(config, VERTEX["model"])
        await provider.chat({"messages": [{"role": "user", "content": "hi"}]}, stream=False)
    assert [(c["vertex_project"], c["vertex_location"]) for c in calls] == [
        ("p-eu", "europe-west4"),
        ("p-us", "us-central1"),
    ]


# -- scrubbed --------------------------------------------------------------------------------


def test_cloud_secrets_are_scrubbed_as_api_keys_are() -> None:
    secret_key = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
    token = "IQoJb3JpZ2luX2VjEJr//////////wEaCXVzLWVhc3QtMSJHMEUCIQ"
    private_key = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n"
    inline = json.dumps({"type": "service_account", "private_key": private_key})
    config = parse_config(
        {
            "models": [
                {
                    "name": "m",
                    "deployments": [
                        {
                            **BEDROCK,
                            "aws_access_key_id": "AKIAIOSFODNN7EXAMPLE",
                            "aws_secret_access_key": secret_key,
                            "aws_session_token": token,
                        },
                        {**VERTEX, "vertex_credentials": inline},
                        {**AZURE, "azure_ad_token": "eyJ0eXAiOiJKV1QiLCJhbGciOiJSUzI1NiJ9.x"},
                    ],
                }
            ]
        }
    ).config
    secrets = scrub.config_secrets(config)
    for value in (secret_key, token, private_key, "AKIAIOSFODNN7EXAMPLE"):
        assert value in secrets
    scrub.learn(config)
    text = f"signing failed for {secret_key} with {token}; key {private_key!s}"
    cleaned = scrub.scrub(text)
    assert secret_key not in cleaned and token not in cleaned and private_key not in cleaned
    # An AWS key id nobody configured is still taken out, by its shape.
    assert scrub.scrub("the key AKIAZZZZZZZZZZZZZZZZ is not valid") == (
        "the key [redacted] is not valid"
    )
