"""Groq's chat completions wire format: OpenAI's, read as OpenAI's but for its usage.

Groq repeats each stream's usage under `x_groq.usage` on the finish chunk, and sends it there
alone when the request did not ask for it in OpenAI's way (`stream_options.include_usage`);
that count is Groq's own, and is read as the provider's usage when no `usage` came beside it.
The rest (reasoning in `delta.reasoning`, an in-band error as an `event: error` frame whose
`code` is a string such as `tool_use_failed`) is OpenAI chat as `openai_chat` reads it.
"""

from __future__ import annotations

from typing import Any

from gateway.providers.openai_chat import ChatStreamParser
from gateway.stream.events import StreamEvent, Usage


class GroqStreamParser(ChatStreamParser):
    def chunk(self, obj: dict[str, Any]) -> list[StreamEvent]:
        events = super().chunk(obj)
        extra = obj.get("x_groq")
        if isinstance(extra, dict) and obj.get("usage") is None:
            usage = extra.get("usage")
            if isinstance(usage, dict) and isinstance(usage.get("prompt_tokens"), int):
                events.append(Usage(usage))
        return events
