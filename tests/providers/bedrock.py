"""A fake Amazon Bedrock runtime: Converse and ConverseStream, as litellm calls them.

ConverseStream answers in AWS's event-stream binary framing (each message: a prelude of total
and header lengths with its CRC32, typed headers, a JSON payload, the message's CRC32), the
event named by its `:event-type` header; an in-band error is an `exception` message. Every
request must be signed with SigV4 (`Authorization: AWS4-HMAC-SHA256 Credential=<key id>/<date>/
<region>/bedrock/aws4_request, ...`): the fake keeps the region each was signed for.
"""

from __future__ import annotations

import json
import re
import struct
import zlib
from typing import Any, ClassVar

from aiohttp import web

from tests.fakes import COMPLETION_TOKENS, PROMPT_TOKENS, FakeServer, Reply

ACCESS_KEY_ID = "AKIAFAKEBEDROCK00001"
SECRET_ACCESS_KEY = "fake/secret/access/key/of/forty/chars/00"
REGION = "eu-west-3"
_SCOPE = re.compile(
    r"^AWS4-HMAC-SHA256 Credential=(?P<key>[^/]+)/(?P<date>\d{8})/(?P<region>[a-z0-9-]+)"
    r"/bedrock/aws4_request, SignedHeaders=(?P<signed>[a-z0-9;-]+), Signature=[0-9a-f]{64}$"
)
_STRING = 7  # the event-stream header value type of a UTF-8 string


def _header(name: str, value: str) -> bytes:
    raw_name, raw_value = name.encode(), value.encode()
    return (
        struct.pack("!B", len(raw_name))
        + raw_name
        + struct.pack("!BH", _STRING, len(raw_value))
        + raw_value
    )


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One message of AWS's event-stream encoding (application/vnd.amazon.eventstream)."""
    head = b"".join(_header(k, v) for k, v in headers.items())
    total = 12 + len(head) + len(payload) + 4
    prelude = struct.pack("!II", total, len(head))
    prelude += struct.pack("!I", zlib.crc32(prelude))
    body = prelude + head + payload
    return body + struct.pack("!I", zlib.crc32(body))


def event(kind: str, payload: dict[str, Any]) -> bytes:
    headers = {":event-type": kind, ":content-type": "application/json", ":message-type": "event"}
    return event_message(headers, json.dumps(payload).encode())


def exception(kind: str, message: str) -> bytes:
    headers = {
        ":exception-type": kind,
        ":content-type": "application/json",
        ":message-type": "exception",
    }
    return event_message(headers, json.dumps({"message": message}).encode())


def signed_region(request: web.Request) -> str:
    """The region a SigV4-signed request was signed for (AssertionError if it is not signed)."""
    authorization = request.headers.get("Authorization", "")
    match = _SCOPE.match(authorization)
    assert match, f"not a SigV4 Authorization header: {authorization[:80]!r}"
    assert match["key"] == ACCESS_KEY_ID
    assert "x-amz-date" in match["signed"].split(";")
    assert request.headers["X-Amz-Date"].startswith(match["date"])
    return match["region"]


class BedrockServer(FakeServer):
    """`POST /model/{modelId}/converse-stream` (and `/converse`), SigV4-signed, as litellm
    calls a `bedrock/converse/...` model with `api_base` set to the runtime endpoint."""

    provider = "litellm"
    bedrock_model = "anthropic.claude-3-7-sonnet-20250219-v1:0"
    model = f"bedrock/converse/{bedrock_model}"
    signature = "EqsDCpQBbedrock=="
    # litellm hands it on in `thinking_blocks`, where the gateway reads it for the record.
    reasoning_signature = signature
    region: ClassVar[str] = REGION

    def __init__(self) -> None:
        super().__init__()
        self.regions: list[str] = []  # the region each request was signed for

    def deployment(self, **extra: Any) -> dict[str, Any]:
        # No api_key: litellm would send it as a Bedrock API key (a bearer token), not sign.
        return {
            "provider": self.provider,
            "api_base": self.api_base(),
            "model": self.model,
            "aws_region": self.region,
            "aws_access_key_id": ACCESS_KEY_ID,
            "aws_secret_access_key": SECRET_ACCESS_KEY,
            **extra,
        }

    def add_routes(self, router: web.UrlDispatcher) -> None:
        router.add_post("/model/{model}/{action}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        self.regions.append(signed_region(request))
        return await super().handle(request)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.match_info["model"] == self.bedrock_model
        assert request.match_info["action"] == "converse-stream"
        assert self.regions[-1] == self.region
        assert "modelId" not in body and body["messages"]

    def question(self, body: dict[str, Any]) -> str:
        content = body["messages"][-1]["content"]
        return "".join(part.get("text", "") for part in content)

    async def start_sse(self, request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "application/vnd.amazon.eventstream"}
        )
        await response.prepare(request)
        return response

    def frames(self, reply: Reply, request: web.Request, body: dict[str, Any]) -> list[bytes]:
        out = [event("messageStart", {"role": "assistant"})]
        last = len(reply.blocks) - 1
        for index, block in enumerate(reply.blocks):
            if block.kind == "tool_call":
                start = {"toolUse": {"toolUseId": block.id, "name": block.name}}
                out.append(event("contentBlockStart", {"contentBlockIndex": index, "start": start}))
                deltas: list[dict[str, Any]] = [{"toolUse": {"input": p}} for p in block.parts]
            elif block.kind == "reasoning":
                deltas = [{"reasoningContent": {"text": p}} for p in block.parts]
                deltas.append({"reasoningContent": {"signature": self.signature}})
            else:
                deltas = [{"text": p} for p in block.parts]
            for delta in deltas:
                out.append(event("contentBlockDelta", {"contentBlockIndex": index, "delta": delta}))
            if reply.finish is not None or index < last:
                out.append(event("contentBlockStop", {"contentBlockIndex": index}))
        if reply.error_message is not None:
            out.append(exception("modelStreamErrorException", reply.error_message))
        if reply.finish is None:
            return out
        stop = "tool_use" if reply.finish == "tool_calls" else "end_turn"
        out.append(event("messageStop", {"stopReason": stop}))
        usage = {
            "inputTokens": PROMPT_TOKENS,
            "outputTokens": COMPLETION_TOKENS,
            "totalTokens": PROMPT_TOKENS + COMPLETION_TOKENS,
        }
        out.append(event("metadata", {"usage": usage, "metrics": {"latencyMs": 12}}))
        return out

    def error_body(self, status: int, message: str) -> dict[str, Any]:
        return {"message": message}

    def whole(self, text: str) -> None:
        """A Converse (non-streaming) answer: `text`, finished with end_turn, and usage."""

        async def script(request: web.Request) -> web.StreamResponse:
            assert request.match_info["action"] == "converse"
            message = {"role": "assistant", "content": [{"text": text}]}
            usage = {
                "inputTokens": PROMPT_TOKENS,
                "outputTokens": COMPLETION_TOKENS,
                "totalTokens": PROMPT_TOKENS + COMPLETION_TOKENS,
            }
            body = {
                "output": {"message": message},
                "stopReason": "end_turn",
                "usage": usage,
                "metrics": {"latencyMs": 12},
            }
            return web.json_response(body)

        self.push(script)


class BedrockServerElsewhere(BedrockServer):
    """The same fake, its deployment in another region (two regions under one alias)."""

    region = "ap-northeast-1"
