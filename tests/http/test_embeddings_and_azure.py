"""POST /v1/embeddings through aliases and retries; Azure OpenAI's URL and key header."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import MakeGateway, MakeUpstream
from tests.fakes import status

FAST = {"backoff_s": 0.01, "max_backoff_s": 0.05}


async def test_embeddings_are_routed_with_fallback(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    a, b = await make_upstream(), await make_upstream()
    gw = await make_gateway(
        models=[
            {
                "name": "embed",
                "retry": FAST,
                "deployments": [
                    {
                        "provider": "openai",
                        "api_base": a.url,
                        "name": "a",
                        "model": "text-embedding-3-small",
                    },
                    {
                        "provider": "openai",
                        "api_base": b.url,
                        "name": "b",
                        "model": "text-embedding-3-small",
                    },
                ],
            }
        ]
    )
    a.push(status(503, {"error": {"message": "busy", "type": "server_error"}}))
    response = await gw.client().embeddings.with_raw_response.create(
        model="embed", input=["one", "two"]
    )
    result = response.parse()
    assert [d.embedding for d in result.data] == [[0.5, -0.5], [0.5, -0.5]]
    assert response.headers["X-Gateway-Deployment"] == "b"
    assert response.headers["X-Gateway-Attempts"] == "2"
    assert (b.requests[0]["model"], b.requests[0]["input"]) == (
        "text-embedding-3-small",
        ["one", "two"],
    )
    await gw.flush()
    assert gw.query("SELECT count(*) FROM turns") == [(0,)]  # embeddings are not conversations
    # In the request log, by the request id its client saw; one that failed everywhere too.
    request_id = response.headers["X-Request-Id"]
    status_code, log = await gw.get(f"/v1/requests?id={request_id}")
    assert status_code == 200 and [r["endpoint"] for r in log["data"]] == ["embeddings"]
    assert log["data"][0]["deployment"] == "b" and log["data"][0]["status"] == "completed"
    busy = status(503, {"error": {"message": "busy", "type": "server_error"}})
    a.push(busy, busy, busy)
    b.push(busy, busy, busy)
    with pytest.raises(openai.InternalServerError):
        await gw.client().embeddings.create(model="embed", input="three")
    await gw.flush()
    status_code, log = await gw.get("/v1/requests?status=error")
    [failed] = log["data"]
    assert failed["endpoint"] == "embeddings" and failed["error"].startswith("upstream_error")
    assert failed["cost_usd"] == 0.0


async def test_demo_embeddings_are_deterministic(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    client = gw.client()
    first = await client.embeddings.create(model="demo", input="hello", encoding_format="float")
    second = await client.embeddings.create(model="demo", input="hello", encoding_format="float")
    assert first.data[0].embedding == second.data[0].embedding
    assert len(first.data[0].embedding) == 16


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "x"}, "model"),
        ({"model": "demo"}, "input"),
        ({"model": "demo", "input": []}, "input"),
    ],
)
async def test_bad_embeddings_requests(
    make_gateway: MakeGateway, body: dict[str, object], param: str
) -> None:
    gw = await make_gateway()
    with pytest.raises(openai.BadRequestError) as caught:
        await gw.client().post("/embeddings", body=body, cast_to=object)
    assert caught.value.body["param"] == param  # type: ignore[index]


async def test_azure_deployment_url_and_key(
    make_gateway: MakeGateway, make_upstream: MakeUpstream
) -> None:
    fake = await make_upstream()
    base = fake.url.removesuffix("/v1")
    gw = await make_gateway(
        models=[
            {
                "name": "az",
                "deployments": [
                    {
                        "provider": "azure",
                        "api_base": base,
                        "api_key": "az-key",
                        "model": "my-gpt4o",
                        "api_version": "2024-10-21",
                    }
                ],
            }
        ]
    )
    stream = await gw.client().chat.completions.create(
        model="az", messages=[{"role": "user", "content": "hi"}], stream=True
    )
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert text == "The capital of the UK is London."
    request = fake.seen[0]
    assert request.path == "/openai/deployments/my-gpt4o/chat/completions"
    assert request.query["api-version"] == "2024-10-21"
    assert request.headers["api-key"] == "az-key"
    assert "Authorization" not in request.headers
    await gw.client().embeddings.create(model="az", input="x")
    assert fake.seen[1].path == "/openai/deployments/my-gpt4o/embeddings"


def test_azure_needs_a_deployment_name() -> None:
    from gateway.config import ConfigError, parse_config

    with pytest.raises(ConfigError, match="needs model"):
        parse_config(
            {
                "models": [
                    {"name": "az", "deployments": [{"provider": "azure", "api_base": "https://x"}]}
                ]
            }
        )
