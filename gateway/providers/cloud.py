"""A deployment's own cloud settings (AWS, Google Vertex AI, Azure AD) as litellm's arguments.

Passed with each call rather than read from the process environment, so that deployments of one
alias can be in different regions, accounts and projects. Each group of fields belongs to the
litellm providers that read it; `problems` says what is wrong with a deployment's, for the
config to refuse at load.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gateway.providers.extras import provider_prefix

# The deployment's field -> litellm's completion() argument.
LITELLM_ARGUMENTS = {
    "aws_region": "aws_region_name",
    "aws_access_key_id": "aws_access_key_id",
    "aws_secret_access_key": "aws_secret_access_key",
    "aws_session_token": "aws_session_token",
    "aws_profile": "aws_profile_name",
    "vertex_project": "vertex_project",
    "vertex_location": "vertex_location",
    "vertex_credentials": "vertex_credentials",
    "azure_ad_token": "azure_ad_token",
    "azure_tenant_id": "tenant_id",
    "azure_client_id": "client_id",
    "azure_client_secret": "client_secret",
}

# Each group, and the litellm providers (`provider/model` prefixes) that read it.
_GROUPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "aws": (
        (
            "aws_region",
            "aws_access_key_id",
            "aws_secret_access_key",
            "aws_session_token",
            "aws_profile",
        ),
        ("bedrock", "sagemaker", "sagemaker_chat"),
    ),
    "vertex": (
        ("vertex_project", "vertex_location", "vertex_credentials"),
        ("vertex_ai", "vertex_ai_beta"),
    ),
    "azure": (
        ("azure_ad_token", "azure_tenant_id", "azure_client_id", "azure_client_secret"),
        ("azure", "azure_ai", "azure_text"),
    ),
}

# Taken out of every log line, error and stored text, as API keys are (gateway.scrub).
SECRET_FIELDS = (
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "azure_ad_token",
    "azure_client_secret",
)

_ENTRA = ("azure_tenant_id", "azure_client_id", "azure_client_secret")


def settings(values: dict[str, Any]) -> dict[str, str]:
    """The cloud fields set among a deployment's `values`."""
    return {k: v for k in LITELLM_ARGUMENTS if isinstance(v := values.get(k), str) and v}


def arguments(values: dict[str, Any]) -> dict[str, str]:
    """litellm's keyword arguments for the cloud fields set among `values`."""
    return {LITELLM_ARGUMENTS[k]: v for k, v in settings(values).items()}


def problems(provider: str, model: str | None, values: dict[str, Any]) -> list[str]:
    """What is wrong with a deployment's cloud fields (none set: nothing)."""
    given = settings(values)
    if not given:
        return []
    if provider != "litellm":
        return [f"{', '.join(given)}: only for provider 'litellm' (bedrock/..., vertex_ai/...)"]
    prefix = provider_prefix(model or "")
    out = []
    for fields, providers in _GROUPS.values():
        used = [f for f in fields if f in given]
        if used and prefix not in providers:
            models = " or ".join(f"{p}/..." for p in providers)
            out.append(f"{', '.join(used)}: for litellm models {models}, not {model!r}")
    keys = [given.get("aws_access_key_id"), given.get("aws_secret_access_key")]
    if keys.count(None) == 1:
        out.append("aws_access_key_id and aws_secret_access_key: set both, or neither")
    if "aws_session_token" in given and None in keys:
        out.append("aws_session_token: goes with aws_access_key_id and aws_secret_access_key")
    if "aws_profile" in given and keys != [None, None]:
        out.append("aws_profile: set it or the access keys, not both")
    entra = [f for f in _ENTRA if f in given]
    if entra and len(entra) != len(_ENTRA):
        out.append(f"{', '.join(_ENTRA)}: set all three (Entra ID client credentials), or none")
    if entra and "azure_ad_token" in given:
        out.append("azure_ad_token: set it or the Entra ID client credentials, not both")
    if "vertex_credentials" in given:
        problem = credentials_problem(given["vertex_credentials"])
        if problem:
            out.append(f"vertex_credentials: {problem}")
    return out


def credentials_problem(value: str) -> str | None:
    """Why `value` (a service-account JSON file's path, or the JSON itself) is unusable."""
    text = value.strip()
    if not text.startswith("{"):
        path = Path(text).expanduser()
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            return f"cannot read {str(path)!r}: {exc.strerror or exc}"
    try:
        parsed = json.loads(text)
    except ValueError:
        return "not JSON: give the path of a service-account key file, or its JSON"
    if not isinstance(parsed, dict) or "type" not in parsed:
        return "not Google credentials JSON (no `type`)"
    return None


def secrets(values: dict[str, Any]) -> list[str]:
    """The secrets among a deployment's cloud fields: keys, tokens, an inline key's parts."""
    given = settings(values)
    found = [given[f] for f in SECRET_FIELDS if f in given]
    inline = given.get("vertex_credentials", "").strip()
    if inline.startswith("{"):
        found.append(inline)
        try:
            parsed = json.loads(inline)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            found += [str(parsed[k]) for k in ("private_key", "private_key_id") if parsed.get(k)]
    return found


def needs_entra(values: dict[str, Any]) -> bool:
    """Whether the deployment signs in to Azure AD with client credentials (azure-identity)."""
    return all(settings(values).get(f) for f in _ENTRA)
