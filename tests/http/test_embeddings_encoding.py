"""`encoding_format` and `dimensions` on POST /v1/embeddings, against every kind of embeddings
deployment: whatever form the upstream answers in, the client gets the one it asked for (base64
being OpenAI's little-endian float32 array), and both forms decode to the same vector.

Through the real `openai` SDK, which asks for base64 itself when the caller names no format
(and decodes it), as the Node SDK does.
"""

from __future__ import annotations

import array
import base64
import math
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import AzureUpstream, FakeUpstream, Script

FLOATS = [0.5, -0.5]  # what FakeUpstream's default answer holds, whatever was asked
EXACT = [0.25, -0.75, 0.125]  # float32-exact, as an upstream answering base64 sends


def b64(vector: list[float]) -> str:
    return base64.b64encode(array.array("f", vector).tobytes()).decode()


def decode(text: str) -> list[float]:
    return array.array("f", base64.b64decode(text)).tolist()


def answering(form: str) -> Script:
    """Embeddings of EXACT (cut to `dimensions` when asked), as `form`: `base64` always, or
    `asked`: as the request says (what OpenAI does)."""

    async def script(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        vector = EXACT[: body.get("dimensions") or len(EXACT)]
        as_base64 = form == "base64" or body.get("encoding_format") == "base64"
        embedding: Any = b64(vector) if as_base64 else vector
        data = [
            {"object": "embedding", "index": i, "embedding": embedding} for i in range(len(inputs))
        ]
        usage = {"prompt_tokens": 3, "total_tokens": 3}
        return web.json_response(
            {"object": "list", "data": data, "model": body["model"], "usage": usage}
        )

    return script


class Base64Upstream(FakeUpstream):
    """An OpenAI-compatible upstream that answers base64 whatever was asked."""

    def default(self, request: web.Request, body: dict[str, Any]) -> Script:
        return answering("base64")


class HonouringUpstream(FakeUpstream):
    """An OpenAI-compatible upstream that answers in the asked form, as OpenAI does."""

    def default(self, request: web.Request, body: dict[str, Any]) -> Script:
        return answering("asked")


KINDS = {
    # kind: (fake class or None for the demo provider, the vector every form decodes to)
    "openai-ignores-floats": (FakeUpstream, FLOATS),
    "openai-ignores-base64": (Base64Upstream, EXACT),
    "openai-honours": (HonouringUpstream, EXACT),
    "azure": (AzureUpstream, FLOATS),
    "demo": (None, None),
}

MakeServer = Callable[..., Awaitable[TestServer]]


async def deployment_of(
    kind: str, make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> tuple[GatewayUnderTest, FakeUpstream | None]:
    fake_class, _ = KINDS[kind]
    if fake_class is None:
        return await make_gateway(), None  # alias `demo`
    fake = await fake_class().start(aiohttp_server)
    gw = await make_gateway(models=[{"name": "embed", "deployments": [fake.deployment()]}])
    return gw, fake


@pytest.mark.parametrize("kind", list(KINDS))
async def test_base64_and_float_decode_to_the_same_vector(
    kind: str, make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, fake = await deployment_of(kind, make_gateway, aiohttp_server)
    model = "demo" if fake is None else "embed"
    client = gw.client()
    texts = ["one", "two"]
    as_float = await client.embeddings.create(model=model, input=texts, encoding_format="float")
    as_base64 = await client.embeddings.create(model=model, input=texts, encoding_format="base64")
    by_default = await client.embeddings.create(model=model, input=texts)  # the SDK asks base64

    floats = [d.embedding for d in as_float.data]
    assert all(isinstance(v, list) for v in floats)
    encoded: list[Any] = [d.embedding for d in as_base64.data]
    assert all(isinstance(v, str) for v in encoded)
    assert [decode(v) for v in encoded] == floats
    assert [d.embedding for d in by_default.data] == floats
    expected = KINDS[kind][1]
    if expected is not None:
        assert floats == [expected, expected]
    else:  # the demo's: 16 float32 components of a unit vector, one per text
        assert [len(v) for v in floats] == [16, 16] and floats[0] != floats[1]
        assert math.isclose(sum(x * x for x in floats[0]), 1.0, rel_tol=1e-6)
    if fake is not None:
        # The asked format is passed on: an upstream that honours it does the work itself.
        assert [r.get("encoding_format") for r in fake.requests] == ["float", "base64", "base64"]


async def test_no_encoding_format_answers_floats(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/embeddings", json={"model": "demo", "input": "x"}) as response,
    ):
        body = await response.json()
    assert response.status == 200
    assert isinstance(body["data"][0]["embedding"], list)


async def test_a_base64_answer_is_converted_for_a_client_that_asks_nothing(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, _ = await deployment_of("openai-ignores-base64", make_gateway, aiohttp_server)
    status, body = await gw.post("/v1/embeddings", {"model": "embed", "input": "x"})
    assert status == 200
    assert body["data"][0]["embedding"] == EXACT


async def test_an_answer_already_in_the_asked_form_is_relayed_byte_for_byte(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    fake = await FakeUpstream().start(aiohttp_server)
    gw = await make_gateway(models=[{"name": "embed", "deployments": [fake.deployment()]}])
    exact = b'{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5, -0.5]}]}'

    async def script(request: web.Request) -> web.StreamResponse:
        return web.Response(body=exact, content_type="application/json")

    fake.push(script)
    async with (
        aiohttp.ClientSession() as session,
        session.post(gw.url + "/v1/embeddings", json={"model": "embed", "input": "x"}) as response,
    ):
        assert await response.read() == exact


async def test_dimensions_are_passed_on(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, fake = await deployment_of("openai-honours", make_gateway, aiohttp_server)
    assert fake is not None
    result = await gw.client().embeddings.create(model="embed", input="x", dimensions=2)
    assert result.data[0].embedding == EXACT[:2]
    assert fake.requests[0]["dimensions"] == 2


async def test_dimensions_an_upstream_ignores_are_refused(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, _ = await deployment_of("openai-ignores-floats", make_gateway, aiohttp_server)
    with pytest.raises(openai.BadRequestError) as caught:
        await gw.client().embeddings.create(model="embed", input="x", dimensions=8)
    body: Any = caught.value.body
    assert body["param"] == "dimensions"
    assert "2-dimensional" in body["message"] and "not 8" in body["message"]


async def test_demo_honours_dimensions_up_to_16(make_gateway: MakeGateway) -> None:
    gw = await make_gateway()
    client = gw.client()
    full = await client.embeddings.create(model="demo", input="x", encoding_format="float")
    cut = await client.embeddings.create(model="demo", input="x", dimensions=4)
    vector = cut.data[0].embedding
    assert len(vector) == 4
    assert math.isclose(sum(x * x for x in vector), 1.0, rel_tol=1e-6)
    # The first components of the full vector, renormalised.
    head = full.data[0].embedding[:4]
    norm = math.sqrt(sum(x * x for x in head))
    assert all(math.isclose(a, b / norm, rel_tol=1e-5) for a, b in zip(vector, head, strict=True))
    with pytest.raises(openai.BadRequestError) as caught:
        await client.embeddings.create(model="demo", input="x", dimensions=17)
    body: Any = caught.value.body
    assert body["param"] == "dimensions" and "at most 16" in body["message"]


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"encoding_format": "int8"}, "encoding_format"),
        ({"encoding_format": 1}, "encoding_format"),
        ({"encoding_format": ["base64"]}, "encoding_format"),
        ({"dimensions": 0}, "dimensions"),
        ({"dimensions": -3}, "dimensions"),
        ({"dimensions": "8"}, "dimensions"),
        ({"dimensions": 1.5}, "dimensions"),
        ({"dimensions": True}, "dimensions"),
    ],
)
async def test_bad_encoding_format_or_dimensions_is_a_400_naming_it(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, extra: dict[str, Any], param: str
) -> None:
    fake = await FakeUpstream().start(aiohttp_server)
    gw = await make_gateway(models=[{"name": "embed", "deployments": [fake.deployment()]}])
    status, body = await gw.post("/v1/embeddings", {"model": "embed", "input": "x", **extra})
    assert status == 400
    assert body["error"]["param"] == param
    assert f"'{param}'" in body["error"]["message"]
    assert fake.requests == []  # refused before any upstream is called
