"""The output bound each deployment is actually sent: what a reservation has to cover.

A chat body's own bound (`max_completion_tokens` or `max_tokens`) is what an OpenAI-compatible,
Responses or litellm upstream gets; an Anthropic upstream always gets a `max_tokens`, the
client's raised by the thinking budget a `reasoning_effort` becomes, else a default
(`anthropic_max_tokens`); the demo's answer, unbounded, has a known length. None: the upstream
is sent no bound, and may answer up to its model's own limit.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from gateway.providers.anthropic_messages import anthropic_max_tokens
from gateway.providers.demo import MAX_ANSWER_TOKENS


def output_bound(body: Mapping[str, Any]) -> int | None:
    """The most output tokens a (checked) chat body allows per choice, if it names a bound."""
    bound = body.get("max_completion_tokens") or body.get("max_tokens")
    return bound if isinstance(bound, int) and not isinstance(bound, bool) else None


class _Deployment(Protocol):
    @property
    def provider_name(self) -> str: ...


def sent_output_bound(body: Mapping[str, Any], deployment: _Deployment) -> int | None:
    """The most output tokens a choice of this (checked) chat body may take at `deployment`."""
    provider = deployment.provider_name
    if provider == "anthropic":
        return anthropic_max_tokens(body)
    bound = output_bound(body)
    if provider == "demo":
        # It answers the same whatever the bound; a bound given is taken as a real model's.
        return bound or MAX_ANSWER_TOKENS
    return bound
