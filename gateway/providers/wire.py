"""Upstream wire formats by name: the stream parser and the whole-body parser of each."""

from __future__ import annotations

from typing import Any, Protocol

from gateway.providers import openai_chat
from gateway.stream.events import StreamEvent
from gateway.stream.sse import SSEFrame

OPENAI_CHAT = "openai_chat"
OPENAI_RESPONSES = "openai_responses"
OPENAI_COMPLETIONS = "openai_completions"
ANTHROPIC = "anthropic"
# OpenAI chat as Groq sends it (gateway.providers.groq_chat): rendered for the client, never
# relayed as it came (its reasoning is `delta.reasoning`, its `x_groq` extras its own).
GROQ_CHAT = "groq_chat"
MISTRAL_CHAT = "mistral_chat"
COHERE_V2 = "cohere_v2"
# The litellm adapter's chunks for a Claude model, read with their thinking signatures
# (gateway.providers.litellm_signed).
LITELLM_SIGNED = "litellm_signed"


class StreamParser(Protocol):
    done: bool  # the wire format's own end marker was seen
    finished: bool  # the answer's finish (reason) was seen
    # The id the upstream gave its answer, once a frame said it: what a client sees when the
    # stream's bytes are relayed unchanged.
    response_id: str | None

    def feed(self, frame: SSEFrame) -> tuple[list[StreamEvent], str]: ...


def stream_parser(wire: str) -> StreamParser:
    if wire == OPENAI_RESPONSES:
        from gateway.providers.openai_responses import ResponsesStreamParser

        return ResponsesStreamParser()
    if wire == ANTHROPIC:
        from gateway.providers.anthropic_messages import AnthropicStreamParser

        return AnthropicStreamParser()
    if wire == OPENAI_COMPLETIONS:
        from gateway.providers.openai_completions import CompletionsStreamParser

        return CompletionsStreamParser()
    if wire == LITELLM_SIGNED:
        from gateway.providers.litellm_signed import SignedChatParser

        return SignedChatParser()
    if wire == GROQ_CHAT:
        from gateway.providers.groq_chat import GroqStreamParser

        return GroqStreamParser()
    if wire == MISTRAL_CHAT:
        from gateway.providers.mistral_chat import MistralStreamParser

        return MistralStreamParser()
    if wire == COHERE_V2:
        from gateway.providers.cohere_chat import CohereStreamParser

        return CohereStreamParser()
    return openai_chat.ChatStreamParser()


def parse_body(wire: str, obj: dict[str, Any]) -> list[StreamEvent]:
    if wire == OPENAI_RESPONSES:
        from gateway.providers.openai_responses import parse_response

        return parse_response(obj)
    if wire == ANTHROPIC:
        from gateway.providers.anthropic_messages import parse_message

        return parse_message(obj)
    if wire == OPENAI_COMPLETIONS:
        from gateway.providers.openai_completions import parse_text_completion

        return parse_text_completion(obj)
    if wire == LITELLM_SIGNED:
        from gateway.providers.litellm_signed import parse_signed_completion

        return parse_signed_completion(obj)
    if wire == MISTRAL_CHAT:
        from gateway.providers.mistral_chat import parse_mistral_completion

        return parse_mistral_completion(obj)
    if wire == COHERE_V2:
        from gateway.providers.cohere_chat import parse_cohere_response

        return parse_cohere_response(obj)
    return openai_chat.parse_completion(obj)
