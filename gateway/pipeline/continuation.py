"""continue_on_failure: the request that asks the next deployment to finish an answer.

The delivered text goes to the next deployment as the start of the assistant's turn, so its
output can be spliced after what the client already has, with nothing repeated.
"""

from __future__ import annotations

from typing import Any

from gateway.conversations.recorder import Segment
from gateway.providers.wire import ANTHROPIC
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import TEXT

# For an OpenAI-compatible deployment: the delivered text as the assistant's message, then this.
CONTINUE_PROMPT = (
    "Your previous reply was cut off. Continue it exactly where it stopped: do not repeat"
    " anything, start with the next character."
)


def sent_text(segments: list[Segment]) -> str:
    """The text the client received from the failed attempts, in order."""
    parts = []
    for attempt, frames in segments:
        blocks = BlockAssembler.of(attempt.log.events(attempt.log.cut(frames))).blocks()
        parts += [b.text for b in blocks if b.kind == TEXT]
    return "".join(parts)


def continuation_body(body: dict[str, Any], segments: list[Segment], wire: str) -> dict[str, Any]:
    sent = sent_text(segments)
    messages = list(body.get("messages") or [])
    if wire == ANTHROPIC:
        # Anthropic continues a trailing assistant message (prefill); it refuses one that ends
        # in white space.
        messages.append({"role": "assistant", "content": sent.rstrip()})
    else:
        messages += [
            {"role": "assistant", "content": sent},
            {"role": "user", "content": CONTINUE_PROMPT},
        ]
    return {**body, "messages": messages}
