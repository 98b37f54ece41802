"""aiohttp's private names the gateway relies on, all here (placeholder until the module is
written in full)."""

from __future__ import annotations

from aiohttp import web


class EventStreamResponse(web.StreamResponse):
    # Headers leave with the first frames, in one send.
    _send_headers_immediately = False


def payload_output_size(response: web.StreamResponse) -> int:
    writer = response._payload_writer
    return writer.output_size if writer is not None else 0
