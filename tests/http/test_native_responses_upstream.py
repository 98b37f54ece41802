"""A deployment that speaks the native Responses API upstream (`api: responses`)."""

from __future__ import annotations

import json

from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import replay

TEXT = "I\u2019ll check the capital lookup tool for \u201cPotatoLand.\u201d"
ARGUMENTS = '{"country":"PotatoLand"}'


async def gateway(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> tuple[GatewayUnderTest, object]:
    fake = await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "gpt",
                "deployments": [
                    {
                        "provider": "openai",
                        "api_base": fake.url,
                        "api": "responses",
                        "model": "gpt-5.5",
                    }
                ],
            }
        ]
    )
    return gw, fake


async def test_a_chat_client_gets_the_native_answer(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, fake = await gateway(make_gateway, make_upstream)
    fake.push(replay("openai-responses-text-function-call.sse"))  # type: ignore[attr-defined]
    stream = await gw.client().chat.completions.create(
        model="gpt",
        messages=[
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": "Capital?"},
        ],
        stream=True,
    )
    text, arguments, finish = "", "", None
    async for part in stream:
        delta = part.choices[0].delta if part.choices else None
        if delta is None:
            continue
        text += delta.content or ""
        for call in delta.tool_calls or ():
            arguments += call.function.arguments or "" if call.function else ""
        finish = part.choices[0].finish_reason or finish
    assert (text, arguments, finish) == (TEXT, ARGUMENTS, "tool_calls")
    sent = fake.requests[0]  # type: ignore[attr-defined]
    assert fake.seen[0].path == "/v1/responses"  # type: ignore[attr-defined]
    assert sent["instructions"] == "Use tools."
    assert sent["input"] == [{"role": "user", "content": "Capital?"}]
    assert sent["store"] is False  # the gateway keeps the state


async def test_a_responses_client_sees_the_gateways_ids(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    gw, fake = await gateway(make_gateway, make_upstream)
    fake.push(replay("openai-responses-text-function-call.sse"))  # type: ignore[attr-defined]
    api = gw.client()
    final = None
    stream = await api.responses.create(model="gpt", input="Capital?", stream=True)
    async for event in stream:
        if event.type == "response.completed":
            final = event.response
    assert final is not None
    assert final.output_text == TEXT
    stored = await api.responses.retrieve(final.id)  # the gateway's id, not the upstream's
    assert stored.output_text == TEXT
    calls = [i for i in stored.output if i.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_capital", {"country": "PotatoLand"})
    ]
