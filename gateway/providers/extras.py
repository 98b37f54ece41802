"""The packages litellm needs for some providers but does not install, and the extra that does.

litellm imports them only on a provider's first request, so without this check a missing one
passes `check-config` and the start, then fails every request with a 502. Light on purpose: the
config module asks it without importing litellm.
"""

from __future__ import annotations

import importlib

EXTRA = "providers"
INSTALL = f"pip install 'gateway[{EXTRA}]'"

# litellm's provider name (the prefix of `provider/model`) -> (module, the package that has it).
_GOOGLE = (("google.auth", "google-auth"),)
_AWS = (("botocore", "botocore"), ("boto3", "boto3"))
NEEDS: dict[str, tuple[tuple[str, str], ...]] = {
    "vertex_ai": _GOOGLE,
    "vertex_ai_beta": _GOOGLE,
    "bedrock": _AWS,
    "sagemaker": _AWS,
    "sagemaker_chat": _AWS,
}
# Azure AD sign-in with client credentials (`azure_tenant_id` and the rest), for azure/... models.
ENTRA_ID = "azure Entra ID"
NEEDS[ENTRA_ID] = (("azure.identity", "azure-identity"),)


def provider_prefix(model: str) -> str:
    """The provider litellm reads off `provider/model` (`bedrock/converse/...` -> bedrock)."""
    return model.split("/", 1)[0] if "/" in model else ""


def missing(provider: str) -> list[str]:
    """The packages `provider` needs that cannot be imported here, by their install names.

    Imported, not just found: an install missing one of their own dependencies counts too.
    """
    absent = []
    for module, package in NEEDS.get(provider, ()):
        try:
            importlib.import_module(module)
        except ImportError:
            absent.append(package)
    return absent


def check(provider: str) -> None:
    """ValueError naming the packages and the extra when `provider` cannot work here."""
    absent = missing(provider)
    if absent:
        raise ValueError(
            f"litellm's {provider} provider needs {', '.join(absent)}, which is not installed:"
            f" install the gateway with its {EXTRA} extra ({INSTALL})"
        )
