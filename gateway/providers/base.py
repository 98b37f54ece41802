"""What the pipeline needs from a provider adapter."""

from __future__ import annotations

from typing import Any, Protocol


class UpstreamResponse(Protocol):
    """An upstream answer whose status was a success; its body is read in pieces."""

    # True when the gateway added `stream_options.include_usage` itself, so the usage-only
    # chunk it brings is for the gateway's metering and not forwarded to the client.
    usage_injected: bool

    async def read(self) -> bytes:
        """The next piece of the body; b"" at the end. Raises `UpstreamError` on a fault."""
        ...

    def close(self, *, keep_alive: bool = False) -> None:
        """Drop the upstream connection now (the upstream sees its client go away). After the
        whole body has arrived the connection was already kept for reuse, and this is a no-op.
        `keep_alive`: the reader has all it needs (the stream's end came), so a body that has
        not ended yet may end in its own time and its connection be reused."""
        ...


class Provider(Protocol):
    # The wire format its responses come in (gateway.providers.wire).
    wire: str

    async def chat(self, body: dict[str, Any], *, stream: bool) -> UpstreamResponse:
        """Send an OpenAI chat completions body. Raises `UpstreamError` for an HTTP error
        status, a connection failure or a timeout before the response headers."""
        ...
