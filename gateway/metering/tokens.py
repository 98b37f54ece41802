"""Token estimates for when the provider's own count never came (a cancel, a cut stream).

Uses tiktoken's cl100k_base, loaded from the files litellm ships (no network); falls back to
about 4 characters a token if they are missing. An estimate is always flagged as one.
"""

from __future__ import annotations

import importlib.util
import os
from functools import cache
from pathlib import Path
from typing import Any

import orjson


@cache
def _encoding() -> Any:
    spec = importlib.util.find_spec("litellm")
    if spec is not None and spec.submodule_search_locations:
        bundled = Path(next(iter(spec.submodule_search_locations)))
        os.environ.setdefault(
            "TIKTOKEN_CACHE_DIR", str(bundled / "litellm_core_utils" / "tokenizers")
        )
    try:
        import tiktoken

        return tiktoken.get_encoding("cl100k_base")
    except Exception:  # no tokenizer files: the rough estimate below
        return None


def warm() -> None:
    """Load the tokenizer (about 0.4 s) so the first estimate does not stall a request."""
    _encoding()


# Longer texts are estimated from a sample: tokenizing megabytes would stall the event loop
# (the estimate runs when a turn ends, inside the request's own handler).
_SAMPLE_CHARS = 8192


def count_text(text: str) -> int:
    if not text:
        return 0
    encoding = _encoding()
    if encoding is None:
        return max(1, len(text) // 4)
    if len(text) <= _SAMPLE_CHARS:
        return len(encoding.encode(text, disallowed_special=()))
    sample = len(encoding.encode(text[:_SAMPLE_CHARS], disallowed_special=()))
    return max(1, round(sample * len(text) / _SAMPLE_CHARS))


def count_messages(messages: list[Any]) -> int:
    """A chat request's prompt tokens: content plus a few tokens of framing per message."""
    total = 3
    for message in messages:
        if not isinstance(message, dict):
            continue
        content = message.get("content")
        text = content if isinstance(content, str) else orjson.dumps(content).decode()
        total += 4 + count_text(text or "")
        for call in message.get("tool_calls") or ():
            total += count_text(orjson.dumps(call).decode())
    return total
