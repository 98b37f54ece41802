"""What a provider's prompt cache is known to hold for a conversation, for an estimate.

A stream cut before its usage came (OpenAI's comes last) says nothing of cache reads, and its
prompt, estimated, would be billed whole at the input price. One thing is known: the provider
reported, for this conversation's last answer on the same deployment, that so many tokens of
its prompt were read from the cache. A new prompt that begins with that whole prompt (the same
tools and schemas, the same messages) begins with those tokens, and a cache holds a prefix for
some minutes after its last use (OpenAI: five to ten minutes of inactivity, Anthropic: five), so
within `KEPT_S` of that report they are counted as read from the cache again. No more than
the provider reported (it may since have cached more of the prefix) and nothing otherwise: the
prompt is then billed at the input price, which over-states a cached prompt, never under-states
an uncached one.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from hashlib import blake2b
from typing import Any, NamedTuple

import orjson

KEPT_S = 300.0  # the shortest time a provider keeps an unused prefix (OpenAI's, Anthropic's)
_CONVERSATIONS = 10_000  # the most remembered, the least recently answered forgotten first


class _Read(NamedTuple):
    deployment: str
    messages: int  # how many messages the prompt had
    digest: bytes  # of its extras and messages
    cached: int  # the tokens the provider read from its cache
    at: float  # monotonic


def _digest(extras: list[Any] | None, messages: list[Any]) -> bytes | None:
    try:
        data = orjson.dumps([extras, messages])
    except TypeError:  # not JSON: nothing can be said of it
        return None
    return blake2b(data, digest_size=16).digest()


class PromptCacheReads:
    """Each conversation's last answer whose provider reported cache reads."""

    def __init__(self) -> None:
        self._reads: OrderedDict[str, _Read] = OrderedDict()

    def reported(
        self,
        conversation_id: str,
        deployment: str,
        extras: list[Any] | None,
        messages: list[Any],
        cached: int,
    ) -> None:
        """A whole answer's provider read `cached` tokens of this prompt from its cache."""
        digest = _digest(extras, messages)
        if digest is None:
            return
        reads = self._reads
        reads[conversation_id] = _Read(deployment, len(messages), digest, cached, time.monotonic())
        reads.move_to_end(conversation_id)
        if len(reads) > _CONVERSATIONS:
            reads.popitem(last=False)

    def known(
        self,
        conversation_id: str,
        deployment: str,
        extras: list[Any] | None,
        messages: list[Any],
    ) -> int:
        """The tokens of this prompt the provider's cache is known to hold (0: none known)."""
        read = self._reads.get(conversation_id)
        if (
            read is None
            or read.deployment != deployment
            or len(messages) <= read.messages
            or time.monotonic() - read.at > KEPT_S
        ):
            return 0
        return read.cached if _digest(extras, messages[: read.messages]) == read.digest else 0
