"""What a chat body sends the model besides its messages, counted as prompt tokens.

Providers bill tool definitions and output schemas as input: `tools` and OpenAI's legacy
`functions`, the hosted tools a Responses client offers (`responses_extras`), and the JSON
schema of a `response_format`. Each is counted as the text of its JSON (cl100k, as
`gateway.metering.tokens` counts text), which is what the model is shown, give or take the
provider's own framing. An Anthropic deployment adds a system prompt of its own to any request
that offers tools: `ANTHROPIC_TOOL_PROMPT` tokens more.

Only the fields a body has are looked at: a request without any costs a few dict lookups, and
a count is made once, when a reservation or an estimate first needs it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from gateway.metering.tokens import count_text, tokenizer_ready
from gateway.providers.params import RESPONSES_EXTRAS

# Anthropic's tool-use system prompt ("Tool use with Claude", "Pricing"): 346 tokens for the
# Claude 4 models with `tool_choice` auto or none (313 with any or tool; Claude 3 models
# document fewer). The largest is taken, so that a reservation made with it still holds.
ANTHROPIC_TOOL_PROMPT = 346

_TOOLS = ("tools", "functions", RESPONSES_EXTRAS)


class PromptExtras:
    """The fields of one request that the model reads besides its messages."""

    __slots__ = ("_text", "tools", "values")

    def __init__(self, values: list[Any], tools: bool) -> None:
        self.values = values
        self.tools = tools  # the request offers tools
        self._text: int | None = None

    def tokens(self, vendor: str = "openai", *, wait: bool = True) -> int:
        """Their prompt tokens on a deployment of `vendor` (`tokens.vendor_of`). Without
        `wait`, at the rough rate while the tokenizer is loading (a reservation's count,
        which is not kept: what a turn is billed is counted exactly)."""
        text = self._text
        if text is None:
            exact = wait or tokenizer_ready()
            text = sum(count_text(orjson.dumps(v).decode(), wait=exact) for v in self.values)
            if exact:
                self._text = text
        framing = ANTHROPIC_TOOL_PROMPT if self.tools and vendor == "anthropic" else 0
        return text + framing


def prompt_extras(body: Mapping[str, Any]) -> PromptExtras | None:
    """What `body` sends besides its messages, None when nothing (the usual request)."""
    values: list[Any] = []
    for name in _TOOLS:
        value = body.get(name)
        if value:
            values.append(value)
    tools = bool(values)
    schema = _schema(body.get("response_format"))
    if schema is not None:
        values.append(schema)
    return PromptExtras(values, tools) if values else None


def _schema(response_format: Any) -> Any:
    """What of a `response_format` the model is shown: its JSON schema (with its name and
    description), or a JSON object's type; nothing for plain text."""
    if not isinstance(response_format, dict):
        return None
    kind = response_format.get("type")
    if kind == "json_schema":
        return response_format.get("json_schema") or None
    if kind == "json_object":
        return kind
    return None
