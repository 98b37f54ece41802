"""The most a batch may cost, read from its input file when it is created, so that a budget
holds against a batch as against any other request (gateway.pipeline.files).

Each request line counts its prompt as a request of its kind would be reserved (chat messages
by their provider's rules, with the tools and schemas they send; an embeddings or completions
input as text) and `n` times its output bound (`max_completion_tokens`, `max_tokens` or
`max_output_tokens`), else the model's own output limit; an embeddings request has no output.
A request with neither bound is `unbounded`: under a hard budget the batch is refused, as a
request with no bound on a model of unknown limit is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from gateway.metering.request_tokens import prompt_extras
from gateway.metering.tokens import count_embedding_input, count_messages, count_text

_BOUNDS = ("max_completion_tokens", "max_tokens", "max_output_tokens")


@dataclass
class BatchEstimate:
    requests: int = 0
    prompt: int = 0
    completion: int = 0  # the output bounds, each request's times its `n`
    unbounded: int = 0  # requests with no output bound, on a model of unknown output limit


def estimate_batch(
    content: bytes, vendor: str, model: str, max_output: int | None
) -> BatchEstimate:
    """The requests of a batch input file (JSON Lines), as prompt and output tokens at most."""
    out = BatchEstimate()
    for line in content.splitlines():
        try:
            request = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        body = request.get("body") if isinstance(request, dict) else None
        if not isinstance(body, dict):
            continue
        out.requests += 1
        out.prompt += _prompt(body, vendor, model)
        if str(request.get("url", "")).endswith("/embeddings"):
            continue
        # (Two bounds that disagree: the larger, which a provider may take.)
        bounds = [b for b in (_whole(body.get(name)) for name in _BOUNDS) if b is not None]
        bound = max(bounds) if bounds else max_output
        if bound is None:
            out.unbounded += 1
            continue
        out.completion += bound * (_whole(body.get("n")) or 1)
    return out


def _prompt(body: dict[str, Any], vendor: str, model: str) -> int:
    messages = body.get("messages")
    if isinstance(messages, list):
        extras = prompt_extras(body)
        prompt = count_messages(messages, vendor, model)
        return prompt + (extras.tokens(vendor) if extras is not None else 0)
    prompt = count_embedding_input(body.get("input") or body.get("prompt"))
    if not prompt and body.get("input") is not None:  # a Responses input of items
        prompt = count_text(orjson.dumps(body["input"]).decode())
    instructions = body.get("instructions")
    return prompt + (count_text(instructions) if isinstance(instructions, str) else 0)


def _whole(value: Any) -> int | None:
    """A count of at least one, else None."""
    return value if type(value) is int and value >= 1 else None
