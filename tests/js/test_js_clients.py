"""JavaScript clients against the gateway: openai-node, the Vercel AI SDK (OpenAI and Anthropic
providers), @anthropic-ai/sdk and LangChain.js, each driven by a script in this directory.

Each test starts the gateway and a fake upstream on loopback (tests/conftest.py), runs one
`node` script (one process per flow) with the gateway's URL and key in its environment, and
checks both what the client got (the script prints it as one line of JSON) and what the gateway
recorded. The packages are pinned in package.json and installed by `make test` (`npm ci`);
the scripts run with `no-network.mjs` preloaded, which refuses any connection beyond loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from gateway.providers.demo import demo_answer
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, Script, replay
from tests.providers.upstreams import AnthropicServer

HERE = Path(__file__).parent
NODE = shutil.which("node")
TEXT = "The capital of the UK is London."  # the fake upstream's default (captured) answer
TIMEOUT_S = 60

pytestmark = pytest.mark.skipif(
    NODE is None or not (HERE / "node_modules").is_dir(),
    reason="needs node and tests/js/node_modules: `make test` installs both (npm ci)",
)

Json = dict[str, Any]


async def node(script: str, gw: GatewayUnderTest, **env: str) -> Json:
    """Run tests/js/`script` against `gw`; the result it printed."""
    assert NODE is not None
    environment = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", "/tmp"),
        "GATEWAY_URL": gw.url,
        "GATEWAY_KEY": "test-key",
        # Nothing may report anywhere: LangSmith tracing off, no proxies for loopback.
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "NODE_NO_WARNINGS": "1",
        **env,
    }
    process = await asyncio.create_subprocess_exec(
        NODE,
        "--import",
        "./no-network.mjs",
        script,
        cwd=HERE,
        env=environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(TIMEOUT_S):
            out, err = await process.communicate()
    except TimeoutError:
        process.kill()
        await process.wait()
        raise
    stderr = err.decode(errors="replace")
    assert "NETWORK:" not in stderr, f"{script} tried to reach the network:\n{stderr}"
    assert process.returncode == 0, f"{script} failed ({process.returncode}):\n{stderr}"
    lines = [line for line in out.decode().splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 1, f"{script} printed no result:\n{out.decode()}\n{stderr}"
    result: Json = json.loads(lines[0].removeprefix("RESULT "))
    return result


# -- what the gateway recorded -----------------------------------------------------------------


def conversation_ids(gw: GatewayUnderTest) -> list[str]:
    return [row[0] for row in gw.query("SELECT id FROM conversations ORDER BY created_at")]


async def only_conversation(gw: GatewayUnderTest, turns: int = 1) -> list[Json]:
    """The events of the one conversation recorded, once its `turns` turns have ended."""
    await gw.flush()
    ids = conversation_ids(gw)
    assert len(ids) == 1, ids
    return await gw.wait_turn_end(ids[0], turns)


def of_type(events: list[Json], kind: str) -> list[Json]:
    return [e["payload"] for e in events if e["type"] == kind]


def texts(payload: Json) -> str:
    return "".join(b.get("text", "") for b in payload["content"] if b["type"] == "text")


# -- upstream answers for non-streaming requests -----------------------------------------------


def chat_json(content: str | None = None, tool_calls: list[Json] | None = None) -> Script:
    """A whole `chat.completion`: text, or tool calls (finish reason `tool_calls`)."""

    async def script(request: web.Request) -> web.StreamResponse:
        message: Json = {"role": "assistant", "content": content}
        if tool_calls:
            message["tool_calls"] = tool_calls
        return web.json_response(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": "fake-model",
                "choices": [
                    {
                        "index": 0,
                        "message": message,
                        "finish_reason": "tool_calls" if tool_calls else "stop",
                    }
                ],
                "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
            }
        )

    return script


def call(call_id: str, name: str, arguments: Json) -> Json:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


# -- streaming chat ----------------------------------------------------------------------------


async def test_openai_node_streams_a_chat_completion(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    result = await node("openai_chat_stream.mjs", gw)
    assert (result["text"], result["finish"]) == (TEXT, "stop")
    events = await only_conversation(gw)
    assert result["conversationId"] == conversation_ids(gw)[0]
    assert [e["type"] for e in events] == ["user/message", "assistant/message", "turn/end"]
    assert of_type(events, "user/message")[0]["content"] == "Capital of the UK?"
    (answer,) = of_type(events, "assistant/message")
    assert texts(answer) == result["text"] and answer["interrupted"] is False
    assert of_type(events, "turn/end")[0]["status"] == "completed"


# -- tools: a multi-step loop ------------------------------------------------------------------


@pytest.mark.parametrize("api", ["responses", "chat"])
async def test_vercel_generate_text_runs_a_tool_loop_in_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream, api: str
) -> None:
    upstream.push(
        chat_json(tool_calls=[call("call_w1", "weather", {"city": "Paris"})]),
        chat_json("It is 18C in Paris."),
    )
    result = await node("vercel_tools.mjs", gw, API=api)
    assert result["text"] == "It is 18C in Paris."
    assert (result["steps"], result["executed"]) == (2, ["Paris"])
    assert result["toolCalls"] == [["call_w1", "weather"]]

    # The second step sent the upstream the call and its result, and nothing else.
    assert len(upstream.requests) == 2
    second = upstream.requests[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert second[1]["tool_calls"][0]["id"] == "call_w1"
    assert json.loads(second[2]["content"]) == {"city": "Paris", "celsius": 18}

    # Both steps are turns of one conversation (threaded by their history).
    events = await only_conversation(gw, turns=2)
    assert [e["type"] for e in events] == [
        "user/message",
        "assistant/message",
        "turn/end",
        "tool/result",
        "assistant/message",
        "turn/end",
    ]
    first, last = of_type(events, "assistant/message")
    assert [b["type"] for b in first["content"]] == ["tool_call"]
    assert json.loads(first["content"][0]["arguments"]) == {"city": "Paris"}
    (result_event,) = of_type(events, "tool/result")
    assert result_event["tool_call_id"] == "call_w1"
    assert texts(last) == result["text"]


async def test_vercel_tool_loop_on_a_stored_conversation_keeps_one_history(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """With `providerOptions.openai.conversation` the SDK sends the question again with the
    tool's result on the second step: recorded once, and the upstream gets one valid history
    (no synthetic result, no orphan tool message)."""
    upstream.push(
        chat_json(tool_calls=[call("call_w1", "weather", {"city": "Paris"})]),
        chat_json("It is 18C in Paris."),
    )
    conversation = await gw.client().conversations.create()
    result = await node("vercel_tools.mjs", gw, CONVERSATION=conversation.id)
    assert (result["text"], result["steps"]) == ("It is 18C in Paris.", 2)
    second = upstream.requests[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert "ABORTED_BEFORE_DISPATCH" not in json.dumps(second)
    await gw.flush()
    events = await gw.gateway.store.events(conversation.id)
    assert [e.type for e in events if e.type != "turn/end"] == [
        "user/message",
        "assistant/message",
        "tool/result",
        "assistant/message",
    ]


# -- structured output -------------------------------------------------------------------------

PLACE = {"city": "Paris", "country": "France"}


async def test_openai_node_zod_response_format(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(chat_json(json.dumps(PLACE)))
    result = await node("openai_structured.mjs", gw)
    assert result["parsed"] == PLACE
    response_format = upstream.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "place"
    assert response_format["json_schema"]["strict"] is True
    events = await only_conversation(gw)
    assert json.loads(texts(of_type(events, "assistant/message")[0])) == PLACE


async def test_vercel_generate_object(gw: GatewayUnderTest, upstream: FakeUpstream) -> None:
    upstream.push(chat_json(json.dumps(PLACE)))
    result = await node("vercel_object.mjs", gw)
    assert result["object"] == PLACE
    # The Responses request's text.format reached the upstream as a response_format.
    response_format = upstream.requests[0]["response_format"]
    assert response_format["type"] == "json_schema"
    assert response_format["json_schema"]["name"] == "place"
    assert set(response_format["json_schema"]["schema"]["properties"]) == {"city", "country"}
    events = await only_conversation(gw)
    assert json.loads(texts(of_type(events, "assistant/message")[0])) == PLACE


# -- Responses: multi-turn, store on and off ---------------------------------------------------


@pytest.mark.parametrize("store", ["true", "false"])
async def test_vercel_responses_second_turn(
    gw: GatewayUnderTest, upstream: FakeUpstream, store: str
) -> None:
    upstream.push(chat_json(TEXT), chat_json("Paris."))
    result = await node("vercel_responses_turns.mjs", gw, STORE=store)
    assert result["texts"] == [TEXT, "Paris."]
    answer_sent = result["sent"][1][1]  # the second request's input: question, answer, question
    if store == "true":  # the first answer went back by reference, to the id the gateway issued
        status, first = await gw.get(f"/v1/responses/{result['responseIds'][0]}")
        assert status == 200, first
        assert answer_sent == {"type": "item_reference", "id": first["output"][0]["id"]}
    else:  # inline, and the response is not kept
        assert answer_sent["role"] == "assistant"
        assert "item_reference" not in json.dumps(result["sent"])

    # Either way the upstream got the whole history, the first answer in place.
    assert upstream.requests[1]["messages"] == [
        {"role": "user", "content": "Capital of the UK?"},
        {"role": "assistant", "content": TEXT},
        {"role": "user", "content": "And of France?"},
    ]
    # And the gateway kept one conversation of two turns: the second added only the new
    # question (the referenced answer is the one already recorded).
    events = await only_conversation(gw, turns=2)
    assert [e["type"] for e in events] == [
        "user/message",
        "assistant/message",
        "turn/end",
        "user/message",
        "assistant/message",
        "turn/end",
    ]
    assert [p["content"] for p in of_type(events, "user/message")] == [
        "Capital of the UK?",
        "And of France?",
    ]
    assert [texts(p) for p in of_type(events, "assistant/message")] == [TEXT, "Paris."]
    stored = gw.query("SELECT id, store FROM responses ORDER BY created_at")
    assert stored == [(i, int(store == "true")) for i in result["responseIds"]]


# -- embeddings with the default encoding ------------------------------------------------------


async def test_embeddings_with_the_clients_default_encoding(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """openai-node asks for base64 by default; the demo provider and this fake answer floats
    whatever was asked, and the gateway converts: every form decodes to the same vectors."""
    result = await node("embeddings.mjs", gw, MODELS="demo,fake")
    status, demo = await gw.post(
        "/v1/embeddings",
        {"model": "demo", "input": ["The food was delicious.", "The service was slow."]},
    )
    assert status == 200
    expected = {"demo": [d["embedding"] for d in demo["data"]], "fake": [[0.5, -0.5]] * 2}
    for model, vectors in expected.items():
        got = result[model]
        assert got["byDefault"] == got["asFloat"] == got["vercel"] == vectors, model
    assert len(expected["demo"][0]) == 16 and expected["demo"][0] != expected["demo"][1]
    # What the SDKs asked the fake upstream for: base64 by default (openai-node), floats when
    # told (the Vercel AI SDK asks for them).
    assert [r.get("encoding_format") for r in upstream.requests] == ["base64", "float", "float"]
    await gw.flush()
    assert gw.query("SELECT count(*) FROM turns") == [(0,)]  # embeddings are not recorded


# -- cancel styles -----------------------------------------------------------------------------

STYLES = [
    "abort_controller",
    "controller_abort",
    "break",
    "helper_abort",
    "responses_break",
    "vercel_abort",
    "anthropic_abort",
]
PARTS = ["Once upon a time ", "there was a gateway ", "that remembered ", "what you read."]


async def interrupted_answer(gw: GatewayUnderTest) -> tuple[Json, Json]:
    """The interrupted assistant/message of the one conversation, and its turn/end."""
    events = await only_conversation(gw)
    (answer,) = of_type(events, "assistant/message")
    (end,) = of_type(events, "turn/end")
    return answer, end


@pytest.mark.parametrize("style", STYLES)
async def test_a_cancel_records_exactly_what_the_client_received(
    gw: GatewayUnderTest, upstream: FakeUpstream, style: str
) -> None:
    """The upstream sends PARTS, then nothing more until the gateway goes away; the client
    cancels once it has all of it. Nothing it did not read was ever sent, so the recorded
    prefix is exactly the text it received."""
    upstream.stall_after(PARTS)
    result = await node("cancel.mjs", gw, STYLE=style, CUT_AT=str(len("".join(PARTS))))
    assert result["received"] == "".join(PARTS)
    await asyncio.wait_for(upstream.disconnected.wait(), 10)  # the upstream request was closed
    answer, end = await interrupted_answer(gw)
    assert answer["interrupted"] is True
    assert texts(answer) == result["received"]
    assert end["status"] == "aborted"
    assert answer["delivery"] in ("acked", "sent")


@pytest.mark.parametrize("style", ["abort_controller", "break", "vercel_abort"])
async def test_a_cancel_mid_stream_records_a_prefix_consistent_with_what_was_received(
    make_gateway: MakeGateway, style: str
) -> None:
    """The demo provider keeps streaming while the client cancels. The gateway records what the
    client's kernel acknowledged (docs/recording.md, "Delivery levels"): never more than
    arrived there, which may be more than the script had read when it cancelled, and may be
    less only by what a reset inside the kernel's delayed-ACK window never reported. So the
    recorded text and the received text are both prefixes of the one answer."""
    slow = {"name": "slow", "deployments": [{"provider": "demo", "chunk_delay_ms": 5}]}
    gw = await make_gateway(models=[slow])
    result = await node("cancel.mjs", gw, STYLE=style, CUT_AT="120", MODEL="slow")
    received = result["received"]
    answer, end = await interrupted_answer(gw)
    full = demo_answer({"messages": [{"role": "user", "content": "Tell me a story."}]})
    recorded = texts(answer)
    assert len(received) >= 120 and full.startswith(received)
    assert answer["interrupted"] is True and end["status"] == "aborted"
    assert full.startswith(recorded) and recorded != full
    assert recorded.startswith(received) or received.startswith(recorded)


# -- Anthropic clients, and LangChain.js -------------------------------------------------------


async def test_anthropic_sdk_streams_from_an_anthropic_deployment(
    make_gateway: MakeGateway, aiohttp_server: Callable[..., Awaitable[TestServer]]
) -> None:
    claude = await AnthropicServer().start(aiohttp_server)
    gw = await make_gateway(models=[{"name": "claude", "deployments": [claude.deployment()]}])
    claude.text(["Hello", " from", " Claude."])
    result = await node("anthropic_stream.mjs", gw, MODEL="claude")
    assert result == {
        "deltas": "Hello from Claude.",
        "text": "Hello from Claude.",
        "stopReason": "end_turn",
    }
    sent = claude.requests[0]
    # The client's own body, as the SDK wrote it: an Anthropic deployment gets it unchanged.
    assert sent["messages"] == [{"role": "user", "content": "Say hello."}]
    assert (sent["max_tokens"], sent["stream"]) == (200, True)
    events = await only_conversation(gw)
    assert texts(of_type(events, "assistant/message")[0]) == "Hello from Claude."


async def test_vercel_anthropic_provider_runs_a_tool_loop_in_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """The Anthropic provider of the Vercel AI SDK on /v1/messages, an OpenAI upstream."""
    upstream.push(
        chat_json(tool_calls=[call("call_w1", "weather", {"city": "Paris"})]),
        chat_json("It is 18C in Paris."),
    )
    result = await node("vercel_anthropic.mjs", gw)
    assert result == {"text": "It is 18C in Paris.", "steps": 2, "executed": ["Paris"]}
    second = upstream.requests[1]["messages"]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert json.loads(second[2]["content"]) == {"city": "Paris", "celsius": 18}
    events = await only_conversation(gw, turns=2)
    assert [e["type"] for e in events if e["type"] != "turn/end"] == [
        "user/message",
        "assistant/message",
        "tool/result",
        "assistant/message",
    ]


async def test_anthropic_sdk_tool_runner_completes_in_one_conversation(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    """`client.beta.messages.toolRunner()` sends `thread` first; refused as
    `thread_unsupported_request`, it runs the loop on whole histories, one conversation."""
    upstream.push(
        chat_json(tool_calls=[call("call_w1", "weather", {"city": "Paris"})]),
        chat_json("It is 18C in Paris."),
    )
    result = await node("anthropic_tool_runner.mjs", gw)
    assert result == {
        "text": "It is 18C in Paris.",
        "stopReason": "end_turn",
        "executed": ["Paris"],
    }
    assert len(upstream.requests) == 2
    assert [m["role"] for m in upstream.requests[1]["messages"]] == ["user", "assistant", "tool"]
    events = await only_conversation(gw, turns=2)
    assert [e["type"] for e in events if e["type"] != "turn/end"] == [
        "user/message",
        "assistant/message",
        "tool/result",
        "assistant/message",
    ]


async def test_langchain_chat_openai_streams_and_calls_a_tool(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    upstream.push(
        replay("openai-chat-text-usage.sse"),
        chat_json(tool_calls=[call("call_w1", "weather", {"city": "Paris"})]),
    )
    result = await node("langchain_chat.mjs", gw)
    assert result["text"] == TEXT
    assert result["toolCalls"] == [["weather", {"city": "Paris"}]]
    assert upstream.requests[1]["tools"][0]["function"]["name"] == "weather"


async def test_the_scripts_cannot_reach_beyond_loopback() -> None:
    """no-network.mjs, which every script runs with, refuses any other host and says so."""
    assert NODE is not None
    code = (
        "await fetch('https://example.com/').catch(() => {});"
        "await fetch('http://192.0.2.1:81/').catch(() => {});"
    )
    process = await asyncio.create_subprocess_exec(
        NODE,
        "--import",
        "./no-network.mjs",
        "--input-type=module",
        "-e",
        code,
        cwd=HERE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(TIMEOUT_S):
        _, err = await process.communicate()
    assert err.decode().splitlines() == ["NETWORK: example.com", "NETWORK: 192.0.2.1"]
