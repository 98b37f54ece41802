"""Traces: the gateway's spans, exported over OTLP/HTTP to an in-process collector, and the
`traceparent` an upstream receives (gateway.tracing; docs/operations.md, "Traces")."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1 import trace_pb2

from gateway.config import ConfigError, TracingConfig
from gateway.tracing import TRACING
from gateway.tracing import start as start_tracing
from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import API_KEY, COMPLETION_TOKENS, DONE, PROMPT_TOKENS, USAGE, chunk, paused

QUESTION = [{"role": "user", "content": "Tell me more."}]
FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05}
SERVER = trace_pb2.Span.SPAN_KIND_SERVER
CLIENT = trace_pb2.Span.SPAN_KIND_CLIENT
ERROR = trace_pb2.Status.STATUS_CODE_ERROR


@dataclass
class Span:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]
    status: int
    resource: dict[str, Any]


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


class Collector:
    """An OTLP/HTTP traces endpoint: `POST /v1/traces` with a protobuf body, as a collector
    answers it; every span received is kept, decoded."""

    def __init__(self) -> None:
        self.app = web.Application()
        self.app.router.add_post("/v1/traces", self.handle)
        self.spans: list[Span] = []
        self.headers: list[dict[str, str]] = []
        self.url = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.read())
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Span(
                            span.name,
                            span.kind,
                            span.trace_id.hex(),
                            span.span_id.hex(),
                            span.parent_span_id.hex(),
                            {a.key: _value(a.value) for a in span.attributes},
                            span.status.code,
                            resource,
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )


@pytest.fixture
async def collector(aiohttp_server: Callable[..., Awaitable[TestServer]]) -> Collector:
    collector = Collector()
    server = await aiohttp_server(collector.app)
    collector.url = str(server.make_url("/v1/traces"))
    return collector


async def traced(
    make_gateway: MakeGateway, collector: Collector, deployments: list[dict[str, Any]]
) -> GatewayUnderTest:
    tracing = {
        "otlp_endpoint": collector.url,
        "service_name": "gateway-under-test",
        "headers": {"x-collector-key": "collector-secret"},
    }
    models = [{"name": "m", "deployments": deployments, "retry": FAST}]
    return await make_gateway(models=models, tracing=tracing)


async def exported(gw: GatewayUnderTest, collector: Collector) -> list[Span]:
    """Every span ended so far, once the exporter has sent them (its own thread posts them to
    the collector, which this event loop serves)."""
    assert await asyncio.to_thread(gw.app[TRACING].flush, 10.0)
    return collector.spans


def one(spans: list[Span], kind: int) -> Span:
    found = [s for s in spans if s.kind == kind]
    assert len(found) == 1, found
    return found[0]


def traceparent(request: web.Request) -> tuple[str, str, str, bool]:
    """The version, trace id, parent id and sampled flag of the request's `traceparent` (the
    other flags are the SDK's: W3C level 2 adds one that says the trace id is random)."""
    version, trace_id, span_id, flags = request.headers["traceparent"].split("-")
    return version, trace_id, span_id, bool(int(flags, 16) & 1)


async def test_a_streamed_turn_is_a_turn_span_with_its_attempt_as_a_child(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, collector: Collector
) -> None:
    fake = await make_upstream()
    gw = await traced(make_gateway, collector, [fake.deployment(name="primary")])
    fake.text(["Hello", " there."])
    response = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in response.parse() if c.choices])
    assert text == "Hello there."

    spans = await exported(gw, collector)
    turn, attempt = one(spans, SERVER), one(spans, CLIENT)
    assert turn.name == "chat m"
    assert turn.parent_id == ""  # no traceparent from the client: the trace begins here
    assert turn.resource["service.name"] == "gateway-under-test"
    assert turn.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.conversation.id": response.headers["X-Conversation-Id"],
        "gen_ai.usage.input_tokens": PROMPT_TOKENS,
        "gen_ai.usage.output_tokens": COMPLETION_TOKENS,
        "gen_ai.response.finish_reasons": ["stop"],
        "gateway.request.id": response.headers["X-Request-Id"],
        "gateway.dialect": "openai.chat",
        "gateway.turn.id": response.headers["X-Gateway-Turn-Id"],
        "gateway.turn.status": "completed",
        "gateway.attempts": 1,
        "gateway.delivered_tokens": COMPLETION_TOKENS,
        "gateway.usage.source": "provider",
    }
    assert turn.status != ERROR

    assert attempt.name == "chat fake-model"
    assert (attempt.trace_id, attempt.parent_id) == (turn.trace_id, turn.span_id)
    host, port = fake.url.split("//")[1].split("/")[0].split(":")
    first_token_ms = attempt.attributes.pop("gateway.first_token_ms")
    assert first_token_ms >= 0
    assert attempt.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": "fake-model",
        "gen_ai.conversation.id": response.headers["X-Conversation-Id"],
        "gen_ai.usage.input_tokens": PROMPT_TOKENS,
        "gen_ai.usage.output_tokens": COMPLETION_TOKENS,
        "gen_ai.response.finish_reasons": ["stop"],
        "server.address": host,
        "server.port": int(port),
        "gateway.deployment": "primary",
        "gateway.attempt": 1,
        "gateway.attempt.outcome": "completed",
        "gateway.delivered_events": attempt.attributes["gateway.delivered_events"],
    }
    assert attempt.attributes["gateway.delivered_events"] > 0
    assert attempt.status != ERROR

    # The upstream request named the attempt's span; the collector got the configured headers.
    assert traceparent(fake.seen[0]) == ("00", turn.trace_id, attempt.span_id, True)
    assert collector.headers[0]["x-collector-key"] == "collector-secret"
    # No credential of the upstream's in any span.
    assert API_KEY not in repr([(s.name, s.attributes, s.resource) for s in spans])


async def test_a_fallback_is_two_attempt_spans_the_first_failed(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, collector: Collector
) -> None:
    a, b = await make_upstream(), await make_upstream()
    gw = await traced(make_gateway, collector, [a.deployment(name="a"), b.deployment(name="b")])
    a.http_error(503, "overloaded")
    b.text(["Fine."])
    stream = await gw.client().chat.completions.create(model="m", messages=QUESTION, stream=True)
    assert "".join([c.choices[0].delta.content or "" async for c in stream if c.choices]) == "Fine."

    spans = await exported(gw, collector)
    turn = one(spans, SERVER)
    first, second = sorted(
        (s for s in spans if s.kind == CLIENT), key=lambda s: s.attributes["gateway.attempt"]
    )
    assert turn.attributes["gateway.turn.status"] == "completed"
    assert turn.attributes["gateway.attempts"] == 2
    assert turn.status != ERROR
    assert first.parent_id == second.parent_id == turn.span_id
    assert first.attributes["gateway.deployment"] == "a"
    assert first.attributes["gateway.attempt.outcome"] == "error"
    assert first.attributes["error.type"] == "upstream_error"
    assert first.status == ERROR
    assert "gen_ai.usage.output_tokens" not in first.attributes
    assert second.attributes["gateway.deployment"] == "b"
    assert second.attributes["gateway.attempt.outcome"] == "completed"
    assert second.attributes["gen_ai.usage.output_tokens"] == COMPLETION_TOKENS
    assert "error.type" not in second.attributes
    assert second.status != ERROR
    # Each upstream was told of its own attempt's span.
    assert traceparent(a.seen[0])[1:3] == (turn.trace_id, first.span_id)
    assert traceparent(b.seen[0])[1:3] == (turn.trace_id, second.span_id)


async def test_a_client_that_leaves_mid_stream_makes_an_interrupted_turn(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, collector: Collector
) -> None:
    fake = await make_upstream()
    gw = await traced(make_gateway, collector, [fake.deployment()])
    fake.push(
        paused([chunk("One, "), chunk("two, ")], [chunk("three."), chunk(finish="stop"), DONE])
    )
    response = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, stream=True
    )
    stream = response.parse()
    seen = ""
    async for part in stream:
        seen += part.choices[0].delta.content or "" if part.choices else ""
        if seen == "One, two, ":
            break
    await stream.close()
    events = await gw.wait_turn_end(response.headers["X-Conversation-Id"])
    metered = events[-1]["payload"]["metered"]

    spans = await exported(gw, collector)
    turn, attempt = one(spans, SERVER), one(spans, CLIENT)
    assert turn.attributes["gateway.turn.status"] == "interrupted"
    assert turn.attributes["gateway.turn.reason"] == "client_disconnect"
    # What reached the client, as the turn's end records it.
    assert turn.attributes["gateway.delivered_tokens"] == metered["completion_delivered"] > 0
    assert "gen_ai.response.finish_reasons" not in turn.attributes  # the finish never came
    assert turn.status != ERROR
    assert attempt.attributes["gateway.attempt.outcome"] == "interrupted"
    assert attempt.attributes["gateway.delivered_events"] > 0
    assert attempt.status != ERROR


async def test_a_drained_turn_ends_its_span_when_the_drain_ends(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, collector: Collector
) -> None:
    fake = await make_upstream()
    tracing = {"otlp_endpoint": collector.url}
    models = [{"name": "m", "on_client_disconnect": "drain", "deployments": [fake.deployment()]}]
    gw = await make_gateway(models=models, tracing=tracing)
    fake.push(
        paused(
            [chunk("One, "), chunk("two, ")],
            [chunk("three."), chunk(finish="stop"), chunk(usage=USAGE, no_choices=True), DONE],
        )
    )
    response = await gw.client().chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, stream=True
    )
    stream = response.parse()
    async for part in stream:
        if part.choices and part.choices[0].delta.content == "two, ":
            break
    await stream.close()
    conversation_id = response.headers["X-Conversation-Id"]
    # The handler is done; the turn goes on in the background until the upstream's end.
    async with asyncio.timeout(10):
        while gw.gateway.cancels:
            await asyncio.sleep(0.01)
    assert [s for s in await exported(gw, collector) if s.kind == SERVER] == []
    fake.release.set()
    await gw.wait_turn_end(conversation_id)

    spans = await exported(gw, collector)
    turn, attempt = one(spans, SERVER), one(spans, CLIENT)
    assert turn.attributes["gateway.turn.status"] == "interrupted"
    # The provider's count, read by the drain after the client had left.
    assert turn.attributes["gen_ai.usage.output_tokens"] == USAGE["completion_tokens"]
    assert turn.attributes["gateway.usage.source"] == "provider"
    assert turn.attributes["gateway.delivered_tokens"] < USAGE["completion_tokens"]
    assert attempt.attributes["gen_ai.usage.output_tokens"] == USAGE["completion_tokens"]
    assert attempt.attributes["gen_ai.response.finish_reasons"] == ["stop"]


async def test_a_clients_traceparent_is_continued_and_passed_upstream(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, collector: Collector
) -> None:
    fake = await make_upstream()
    gw = await traced(make_gateway, collector, [fake.deployment()])
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    fake.text(["Traced."])
    fake.text(["Not sampled."])
    async with aiohttp.ClientSession() as session:
        for flags in ("01", "00"):
            headers = {
                "traceparent": f"00-{client_trace}-{client_span}-{flags}",
                "tracestate": "vendor=opaque",
            }
            body = {"model": "m", "messages": QUESTION, "stream": True}
            async with session.post(
                gw.url + "/v1/chat/completions", json=body, headers=headers
            ) as response:
                assert response.status == 200
                await response.read()

    spans = await exported(gw, collector)
    turn, attempt = one(spans, SERVER), one(spans, CLIENT)  # the sampled request's only
    assert (turn.trace_id, turn.parent_id) == (client_trace, client_span)
    assert (attempt.trace_id, attempt.parent_id) == (client_trace, turn.span_id)
    sampled, unsampled = fake.seen
    assert traceparent(sampled) == ("00", client_trace, attempt.span_id, True)
    assert sampled.headers["tracestate"] == "vendor=opaque"
    # The client's decision not to sample is followed, and passed on.
    _, trace_id, span_id, sampled_flag = traceparent(unsampled)
    assert (trace_id, sampled_flag) == (client_trace, False)
    assert span_id not in {s.span_id for s in spans}


async def test_a_request_refused_before_its_turn_is_an_error_span(
    make_gateway: MakeGateway, make_upstream: MakeUpstream, collector: Collector
) -> None:
    fake = await make_upstream()
    gw = await traced(make_gateway, collector, [fake.deployment()])
    status, _ = await gw.post("/v1/chat/completions", {"model": "nope", "messages": QUESTION})
    assert status == 404
    spans = await exported(gw, collector)
    turn = one(spans, SERVER)
    assert turn.name == "chat nope"
    assert turn.attributes["gateway.turn.status"] == "error"
    assert turn.attributes["error.type"] == "model_not_found"
    assert turn.status == ERROR
    assert not [s for s in spans if s.kind == CLIENT] and not fake.seen


async def test_without_tracing_no_traceparent_goes_upstream(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    fake = await make_upstream()
    gw = await make_gateway(models=[{"name": "m", "deployments": [fake.deployment()]}])
    fake.text(["Untraced."])
    headers = {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    async with aiohttp.ClientSession() as session:
        body = {"model": "m", "messages": QUESTION, "stream": True}
        async with session.post(
            gw.url + "/v1/chat/completions", json=body, headers=headers
        ) as response:
            assert response.status == 200
            await response.read()
    assert TRACING not in gw.app
    assert "traceparent" not in fake.seen[0].headers


def test_without_tracing_nothing_of_opentelemetry_is_imported() -> None:
    code = (
        "import sys\n"
        "from gateway.app import create_app\n"
        "from gateway.config import parse_config\n"
        "create_app(parse_config({'store': {'url': 'sqlite:///:memory:'}}).config)\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == []


def test_tracing_without_the_extra_is_a_config_error_naming_the_field(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As if `gateway[otel]` were not installed: importing the exporter fails.
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter", None)
    config = TracingConfig(otlp_endpoint="http://127.0.0.1:4318/v1/traces")
    with pytest.raises(ConfigError, match=r"tracing\.otlp_endpoint.*gateway\[otel\]"):
        start_tracing(config)
