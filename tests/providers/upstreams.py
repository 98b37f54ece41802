"""Every fake upstream the adapter contract suite (test_adapter_contract.py) runs over, by name.

Each speaks its provider's own wire format, in its own module: Anthropic Messages
(anthropic.py), the Gemini API (google.py), Vertex AI's Gemini and Anthropic endpoints
(vertex.py), Amazon Bedrock's Converse (bedrock.py), Groq (groq.py), Mistral (mistral.py) and
Cohere's v2 chat (cohere.py), beside the OpenAI-compatible `FakeUpstream` (tests/fakes.py). They
share `FakeServer`: the same scripted answers (`text`, `reasoning_then_text`, `tool_call`,
`http_error`, `error_mid_stream`, `cut_after`, `stall_after`), each rendered in the format's own
frames, the same record of requests, and the same `stalled` / `release` / `disconnected` events.
"""

from __future__ import annotations

from tests.fakes import AzureUpstream, FakeServer, FakeUpstream
from tests.providers.anthropic import AnthropicServer
from tests.providers.bedrock import BedrockServer
from tests.providers.cohere import CohereServer
from tests.providers.google import GeminiServer
from tests.providers.groq import GroqServer
from tests.providers.mistral import MistralServer
from tests.providers.vertex import VertexAnthropicServer, VertexGeminiServer

__all__ = ["SERVERS", "AnthropicServer", "GeminiServer"]

SERVERS: dict[str, type[FakeServer]] = {
    "openai": FakeUpstream,
    "azure": AzureUpstream,
    "anthropic": AnthropicServer,
    "gemini": GeminiServer,
    "bedrock": BedrockServer,
    "vertex-gemini": VertexGeminiServer,
    "vertex-anthropic": VertexAnthropicServer,
    "groq": GroqServer,
    "mistral": MistralServer,
    "cohere": CohereServer,
}
