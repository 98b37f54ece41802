"""on_client_disconnect: cancel closes the upstream at once; drain reads on to learn usage."""

from __future__ import annotations

import asyncio

from tests.conftest import MakeGateway, MakeUpstream
from tests.fakes import DONE, USAGE, chunk, paused

QUESTION = [{"role": "user", "content": "Tell me more."}]


async def test_drain_records_the_providers_usage_and_only_the_delivered_prefix(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    fake = await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "on_client_disconnect": "drain",
                "deployments": [{"provider": "openai", "api_base": fake.url}],
            }
        ]
    )
    body_end = asyncio.Event()
    fake.push(
        paused(
            [chunk("One, "), chunk("two, ")],
            [chunk("three."), chunk(finish="stop"), chunk(usage=USAGE, no_choices=True), DONE],
            end=body_end,
        )
    )
    client = gw.client()
    response = await client.chat.completions.with_raw_response.create(
        model="m", messages=QUESTION, stream=True
    )
    stream = response.parse()
    seen = ""
    async for part in stream:
        seen += part.choices[0].delta.content or ""
        if seen == "One, two, ":
            break
    await stream.close()
    conversation_id = response.headers["X-Conversation-Id"]
    # The upstream finishes only after the client has left (whether the gateway noticed the
    # close first or fails its next write, the client's side never acknowledges more).
    fake.release.set()
    events = await gw.wait_turn_end(conversation_id)
    message = events[1]["payload"]
    assert message["interrupted"] is True
    assert message["content"] == [{"type": "text", "text": "One, two, "}]
    assert message["usage"] == USAGE  # the provider's own count of what it generated
    assert events[2]["payload"]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 7,
        "total_tokens": 12,
    }
    assert not fake.disconnected.is_set()  # read to its end, not cut
    # Drained to its [DONE], the body's end still to come: the connection is kept for reuse.
    body_end.set()
    async with asyncio.timeout(5):
        while gw.gateway.upstreams.idle_connections == 0:
            await asyncio.sleep(0.001)


async def test_cancel_is_the_default_and_closes_the_upstream(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    fake = await make_upstream()
    gw = await make_gateway(
        models=[{"name": "m", "deployments": [{"provider": "openai", "api_base": fake.url}]}]
    )
    fake.push(paused([chunk("One, ")], [chunk(finish="stop"), DONE]))
    stream = await gw.client().chat.completions.create(model="m", messages=QUESTION, stream=True)
    async for _ in stream:
        break
    await stream.close()
    await asyncio.wait_for(fake.disconnected.wait(), 5)
