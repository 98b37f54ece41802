"""What the pipeline needs from a client-facing dialect (OpenAI chat, Anthropic messages, ...)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from gateway.errors import GatewayError
from gateway.stream.assembler import BlockAssembler
from gateway.stream.events import StreamEvent


class StreamRenderer(Protocol):
    """Stream events in the client's SSE format; one object per response."""

    # The id the client's answer has when the gateway renders it (a stream, or a whole body).
    response_id: str
    # What a provider's usage report costs (set by the relay where the gateway meters): a
    # dialect whose stream has a usage chunk adds it there as `cost_usd`.
    price: Callable[[dict[str, Any]], float | None] | None

    def render(self, events: list[StreamEvent]) -> bytes: ...

    def track(self, events: list[StreamEvent]) -> None:
        """Events whose bytes were relayed unchanged, so that `cancelled()` can close them."""
        ...

    def done(self) -> bytes:
        """The frames that end a finished stream."""
        ...

    def error(self, error: GatewayError) -> bytes:
        """The frame that ends a stream that failed after it began."""
        ...

    def cancelled(self) -> bytes:
        """The frames that end a stream stopped by an explicit cancel."""
        ...

    def shutdown(self, message: str) -> bytes:
        """The frame that ends a stream the gateway cuts as it stops: the dialect's error
        event, of type `shutdown`."""
        ...


class Dialect(Protocol):
    name: str  # as recorded and in metrics, e.g. "openai.chat"
    wire: str  # the upstream wire format whose bytes it relays unchanged

    def renderer(self, body: Mapping[str, object]) -> StreamRenderer:
        """A renderer for one answer to `body` (a `ChatBody`)."""
        ...

    def body(self, model: str, assembler: BlockAssembler, response_id: str) -> bytes:
        """A whole (non-streaming) answer, with the id `response_id`."""
        ...

    def error_body(self, error: GatewayError) -> dict[str, Any]: ...
