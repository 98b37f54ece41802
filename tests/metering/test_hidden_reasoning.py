"""A cancelled answer of a model that reasons out of sight (OpenAI's o-series, gpt-5), whether
or not the request asked it to: what it reasoned is in no event the gateway received, so the
turn is metered with the deployment's usual reasoning, as its provider reported it on earlier
answers, and flagged a floor (`estimated_lower_bound`). Each choice of an `n > 1` answer reasons
on its own: what is learnt and what is counted are a choice's."""

from __future__ import annotations

from typing import Any

import aiohttp
import orjson
from aiohttp import web

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import DONE, FakeUpstream, chunk, frames, sse
from tests.metering.test_n_choices import choice_chunk

QUESTION = [{"role": "user", "content": "Think, then answer."}]
REASONED = 4000


def reasoned_answer(upstream: FakeUpstream) -> Any:
    """A whole answer whose provider reports the reasoning it did."""

    async def script(request: web.Request) -> web.StreamResponse:
        usage = {
            "prompt_tokens": 12,
            "completion_tokens": REASONED + 3,
            "total_tokens": REASONED + 15,
            "completion_tokens_details": {"reasoning_tokens": REASONED},
        }
        message = {"role": "assistant", "content": "Done."}
        return web.json_response(
            {
                "id": "chatcmpl-o",
                "object": "chat.completion",
                "created": 1,
                "model": upstream.model,
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": usage,
            }
        )

    return script


async def cancelled(gw: GatewayUnderTest, upstream: FakeUpstream) -> str:
    """A stream its client leaves after two pieces (no usage ever comes)."""
    upstream.push(frames(chunk("First, "), chunk("the plan."), then="stall"))
    body = {"model": "o", "messages": QUESTION, "stream": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/chat/completions", json=body) as response,
    ):
        seen = ""
        async for line in response.content:
            if line.startswith(b"data: {"):
                seen += orjson.loads(line[6:])["choices"][0]["delta"].get("content") or ""
            if seen == "First, the plan.":
                break
    conversation_id = response.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    return conversation_id


async def gateway_for(make_gateway: MakeGateway, upstream: FakeUpstream, model: str) -> Any:
    deployment = {**upstream.deployment(), "model": model}
    return await make_gateway(
        [{"name": "o", "retry": {"max_attempts": 1}, "deployments": [deployment]}]
    )


def row(gw: GatewayUnderTest, conversation_id: str) -> tuple[int, int, str]:
    [found] = gw.query(
        "SELECT completion_tokens, reasoning_tokens, usage_source FROM usage"
        " WHERE conversation_id = ?",
        conversation_id,
    )
    return found  # type: ignore[no-any-return]


async def test_a_cancel_of_a_reasoning_model_counts_its_usual_reasoning(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await gateway_for(make_gateway, upstream, "o3")
    upstream.push(reasoned_answer(upstream))
    await gw.client().chat.completions.create(model="o", messages=QUESTION)  # type: ignore[arg-type]
    conversation_id = await cancelled(gw, upstream)  # the request asked for no reasoning
    await gw.flush()
    completion, reasoning, source = row(gw, conversation_id)
    assert source == "estimated_lower_bound"
    assert reasoning == REASONED and completion > REASONED  # its reasoning and what was seen


async def test_a_model_that_does_not_reason_is_estimated_as_seen(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await gateway_for(make_gateway, upstream, "gpt-4o")
    conversation_id = await cancelled(gw, upstream)
    await gw.flush()
    completion, reasoning, source = row(gw, conversation_id)
    assert (reasoning, source) == (0, "estimated") and 0 < completion < 20


def four_choices(*pieces: str) -> list[bytes]:
    """Each of four choices: its first chunk, then `pieces` of text, in turns."""
    out = [choice_chunk(i, {"role": "assistant", "content": ""}) for i in range(4)]
    for piece in pieces:
        out += [choice_chunk(i, {"content": f"{i}: {piece}"}) for i in range(4)]
    return out


async def cancelled_four(gw: GatewayUnderTest, upstream: FakeUpstream) -> str:
    """An `n: 4` stream its client leaves once each choice showed one piece."""
    upstream.push(frames(*four_choices("First,"), then="stall"))
    body = {"model": "o", "messages": QUESTION, "stream": True, "n": 4}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/chat/completions", json=body) as response,
    ):
        shown = set()
        async for line in response.content:
            if line.startswith(b"data: {"):
                (choice,) = orjson.loads(line[6:])["choices"]
                if choice["delta"].get("content"):
                    shown.add(choice["index"])
            if len(shown) == 4:
                break
    conversation_id = response.headers["X-Conversation-Id"]
    await gw.wait_turn_end(conversation_id)
    return conversation_id


async def test_a_cancel_of_n4_counts_the_usual_reasoning_of_each_choice(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await gateway_for(make_gateway, upstream, "o3")
    upstream.push(reasoned_answer(upstream))  # one choice, REASONED tokens of reasoning
    await gw.client().chat.completions.create(model="o", messages=QUESTION)  # type: ignore[arg-type]
    conversation_id = await cancelled_four(gw, upstream)
    await gw.flush()
    completion, reasoning, source = row(gw, conversation_id)
    assert source == "estimated_lower_bound"
    assert reasoning == 4 * REASONED and completion > 4 * REASONED


async def test_a_whole_n4_stream_teaches_the_reasoning_of_one_choice(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await gateway_for(make_gateway, upstream, "o3")
    usage = {
        "prompt_tokens": 12,
        "completion_tokens": 4 * (REASONED + 3),
        "total_tokens": 12 + 4 * (REASONED + 3),
        "completion_tokens_details": {"reasoning_tokens": 4 * REASONED},
    }
    finishes = [choice_chunk(i, {}, "stop") for i in range(4)]
    tail = sse({"id": "chatcmpl-n", "object": "chat.completion.chunk", "created": 1,
                "model": upstream.model, "choices": [], "usage": usage})  # fmt: skip
    upstream.push(frames(*four_choices("Done."), *finishes, tail, DONE))
    stream = await gw.client().chat.completions.create(
        model="o",
        messages=QUESTION,  # type: ignore[arg-type]
        stream=True,
        n=4,
        stream_options={"include_usage": True},
    )
    [_ async for _ in stream]
    conversation_id = await cancelled(gw, upstream)  # one choice
    await gw.flush()
    completion, reasoning, source = row(gw, conversation_id)
    assert source == "estimated_lower_bound"
    assert reasoning == REASONED and completion > REASONED
