"""The Responses API's tools that are no function (hosted `web_search`, a `namespace` of
functions, ...): sent as the client wrote them to a deployment that speaks the Responses API
itself, refused by their place elsewhere, or dropped there under `drop_params`."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from tests.conftest import MakeGateway
from tests.fakes import FakeUpstream

FUNCTION = {
    "type": "function",
    "name": "exec_command",
    "description": "Run a command",
    "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}},
    "strict": False,
}
NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "tools": [{**FUNCTION, "name": "spawn"}],
}
WEB_SEARCH = {"type": "web_search", "external_web_access": True}
TOOLS: list[Any] = [FUNCTION, NAMESPACE, WEB_SEARCH]


async def test_a_chat_deployment_refuses_them_by_place_or_drops_them(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    gw = await make_gateway(
        models=[
            {"name": "strict", "deployments": [upstream.deployment()]},
            {"name": "lenient", "deployments": [upstream.deployment()], "drop_params": True},
        ]
    )
    client = gw.client()
    with pytest.raises(openai.BadRequestError) as raised:
        await client.responses.create(model="strict", input="Hi", tools=TOOLS)
    assert raised.value.body["param"] == "tools[1]"  # type: ignore[index]
    assert "drop_params" in raised.value.body["message"]  # type: ignore[index]
    assert upstream.requests == []
    raw = await client.responses.with_raw_response.create(
        model="lenient", input="Hi", tools=TOOLS, stream=True
    )
    async for _ in raw.parse():
        pass
    assert raw.headers["X-Gateway-Dropped-Params"] == "tools[1], tools[2]"
    sent = upstream.requests[-1]
    assert [t["function"]["name"] for t in sent["tools"]] == ["exec_command"]
    assert "responses_extras" not in sent
