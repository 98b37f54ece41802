"""Token estimates for when the provider's own count never came (a cancel, a cut stream).

Uses tiktoken's cl100k_base, loaded from the files litellm ships (no network); falls back to
about 4 characters a token if they are missing. An estimate is always flagged as one.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

import orjson

_UNLOADED = object()
_loaded: Any = _UNLOADED
_loading = threading.Lock()
_stopping = threading.Event()


def _encoding() -> Any:
    if _loaded is _UNLOADED:
        _load()
    return _loaded


def _load() -> None:
    global _loaded
    # One load at a time: an estimate needed while warm() is loading waits for it instead of
    # loading a second copy alongside.
    with _loading:
        if _loaded is _UNLOADED:
            _loaded = _read_encoding()


def _read_encoding() -> Any:
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


# warm() runs on a thread started with the app. The load holds the GIL for most of its
# time, so at once it would halve the speed of the end of startup and of the first requests
# (cold start to the first answer); a moment later the gateway is usually idle.
_WARM_DELAY_S = 0.5


def warm(delay_s: float = _WARM_DELAY_S) -> None:
    """Load the tokenizer so the first estimate does not stall a request."""
    if _loaded is not _UNLOADED:  # loaded already (an earlier app in this process)
        return
    if _stopping.wait(delay_s):
        return
    _load()


def skip_warm() -> None:
    """The process is stopping: a warm() still waiting returns without loading, so a gateway
    stopped right after it started does not wait for the load. An estimate needed while
    draining loads the tokenizer itself, as any estimate before the warm-up finished does."""
    _stopping.set()


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
