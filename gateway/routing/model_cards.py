"""What clients pick a model by, as `/v1/models` lists it: context window, output limit,
modalities and prices, from the bundled model map and each deployment's price.

An alias may send a request to any of its deployments, so its card holds what is true of all
of them: the smallest context window and output limit, the modalities every deployment takes,
and the dearest deployment's price per token (what a request may cost at most). A figure no
deployment knows is left out, never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gateway.metering.prices import map_entry
from gateway.routing.router import Deployment

# What the model map says a model takes, beside text, as the card names it.
_INPUTS = {
    "supports_vision": "image",
    "supports_audio_input": "audio",
    "supports_pdf_input": "file",
}
# What a model answers with, by the map's `mode`.
_OUTPUTS = {
    "chat": ["text"],
    "completion": ["text"],
    "responses": ["text"],
    "embedding": ["embedding"],
    "image_generation": ["image"],
    "audio_transcription": ["text"],
    "audio_speech": ["audio"],
    "rerank": ["score"],
    "moderation": ["moderation"],
}


def card(deployments: Sequence[Deployment]) -> dict[str, Any]:
    """The fields an alias's deployments add to its `model` object."""
    entries = [map_entry(d.upstream_model, d.provider_name) or {} for d in deployments]
    out: dict[str, Any] = {}
    context = _least(e.get("max_input_tokens") for e in entries)
    if context is not None:
        out["context_window"] = context
    limits = [d.price.max_output_tokens if d.price is not None else None for d in deployments]
    output = _least([*limits, *(e.get("max_output_tokens") for e in entries)])
    if output is not None:
        out["max_output_tokens"] = output
    known = [e for e in entries if e]
    if known:
        taken = ["text"] + [
            name for flag, name in _INPUTS.items() if all(e.get(flag) for e in known)
        ]
        out["input_modalities"] = taken
        modes = {str(e.get("mode")) for e in known}
        if len(modes) == 1 and (answers := _OUTPUTS.get(modes.pop())) is not None:
            audio = all(e.get("supports_audio_output") for e in known)
            out["output_modalities"] = (
                [*answers, "audio"] if audio and answers == ["text"] else answers
            )
    pricing = _pricing(deployments)
    if pricing is not None:
        out["pricing"] = pricing
    return out


def _least(values: Iterable[object]) -> int | None:
    counts = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v > 0]
    return min(counts) if counts else None


def _pricing(deployments: Sequence[Deployment]) -> dict[str, float] | None:
    """USD per million tokens, the dearest deployment's of each; None when any deployment is
    unpriced (a bound that leaves one out would understate it)."""
    prices = [d.price for d in deployments]
    if not prices or any(p is None for p in prices):
        return None
    priced = [p for p in prices if p is not None]
    out = {
        "input_per_mtok": max(p.input for p in priced),
        "output_per_mtok": max(p.output for p in priced),
    }
    reads = [p.cache_read if p.cache_read is not None else p.input for p in priced]
    if any(p.cache_read is not None for p in priced):
        out["cache_read_per_mtok"] = max(reads)
    # A prompt cache written (Anthropic's, 5 minutes), where a deployment prices it; one that
    # does not bills it as input.
    writes = [p.cache_write if p.cache_write is not None else p.input for p in priced]
    if any(p.cache_write is not None for p in priced):
        out["cache_write_per_mtok"] = max(writes)
    return {name: round(value * 1e6, 6) for name, value in out.items()}
