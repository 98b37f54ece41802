"""Images, audio, moderations and rerank, driven by the openai SDK through the gateway: each sent
to the alias's deployment as OpenAI's API has it (the model replaced, a form's files intact),
answered unchanged, billed by its own unit at the model's price, and listed in the request log
for the calling key's team alone."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.http.openai_api import PNG, SPEECH, OpenAIAPI, wav
from tests.http.test_auth import MASTER, admin, new_key
from tests.providers.upstreams import AnthropicServer

MakeServer = Callable[..., Awaitable[TestServer]]


async def setup(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> tuple[GatewayUnderTest, OpenAIAPI, str, str]:
    api = await OpenAIAPI().start(aiohttp_server)
    claude = await AnthropicServer().start(aiohttp_server)
    quick = {"retry": {"max_attempts": 2, "backoff_s": 0.01}}
    gw = await make_gateway(
        models=[
            {"name": "img", "deployments": [api.deployment("gpt-image-1")], **quick},
            {"name": "stt", "deployments": [api.deployment("whisper-1")], **quick},
            {"name": "tts", "deployments": [api.deployment("tts-1")], **quick},
            {
                "name": "omni-moderation-latest",
                "deployments": [api.deployment("omni-moderation-latest")],
            },
            {"name": "reranker", "deployments": [api.deployment("rerank-english-v3.0")]},
            {"name": "claude", "deployments": [claude.deployment()]},
        ],
        auth={"master_key": MASTER},
    )
    for team in ("red", "blue"):
        status, _ = await admin(gw, "POST", "/v1/gateway/teams", {"id": team, "name": team})
        assert status == 201
    red, blue = await new_key(gw, "red"), await new_key(gw, "blue")
    return gw, api, red["key"], blue["key"]


def sdk(gw: GatewayUnderTest, key: str) -> openai.AsyncOpenAI:
    client = openai.AsyncOpenAI(base_url=gw.url + "/v1", api_key=key, max_retries=0)
    gw.clients.append(client)
    return client


async def request_log(gw: GatewayUnderTest, key: str, query: str = "") -> list[dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"{gw.url}/v1/requests{query}", headers={"Authorization": f"Bearer {key}"}
        ) as response,
    ):
        assert response.status == 200, await response.text()
        return (await response.json())["data"]  # type: ignore[no-any-return]


async def test_images_are_billed_per_image_by_size_and_quality(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, api, red, blue = await setup(make_gateway, aiohttp_server)
    client = sdk(gw, red)
    made = await client.images.generate(
        model="img", prompt="a lighthouse", n=2, size="1024x1024", quality="low"
    )
    assert [d.b64_json for d in made.data] == [PNG, PNG]
    assert api.seen[-1].json == {
        "model": "gpt-image-1",
        "prompt": "a lighthouse",
        "n": 2,
        "size": "1024x1024",
        "quality": "low",
    }
    # The provider's token count, where the answer has one, is exact.
    api.usage = {
        "input_tokens": 50,
        "output_tokens": 4160,
        "input_tokens_details": {"text_tokens": 50, "image_tokens": 0},
    }
    await client.images.generate(model="img", prompt="a lighthouse", size="1024x1024")
    await gw.flush()
    rows = await request_log(gw, red, "?endpoint=images.generations")
    assert [r["units"]["images"] for r in rows] == [1, 2]
    by_tokens, per_image = rows
    assert per_image["cost_usd"] == pytest.approx(2 * 0.011)  # low/1024-x-1024/gpt-image-1
    assert by_tokens["cost_usd"] == pytest.approx(50 * 5e-06 + 4160 * 4e-05)
    assert (by_tokens["prompt_tokens"], by_tokens["completion_tokens"]) == (50, 4160)
    assert per_image["status"] == "completed" and per_image["duration_ms"] > 0
    assert (
        per_image["deployment"] == "img/0-openai" and per_image["upstream_model"] == "gpt-image-1"
    )
    # Another team sees none of it.
    assert await request_log(gw, blue) == []


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's variations
async def test_an_image_edit_reaches_the_upstream_as_a_form_with_its_file_intact(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, api, red, _ = await setup(make_gateway, aiohttp_server)
    picture = bytes(range(256)) * 40
    made = await sdk(gw, red).images.edit(
        model="img", image=("photo.png", picture, "image/png"), prompt="add a hat", size="1024x1024"
    )
    assert made.data[0].b64_json == PNG
    seen = api.seen[-1]
    assert seen.path == "/v1/images/edits"
    assert seen.fields["model"] == "gpt-image-1" and seen.fields["prompt"] == "add a hat"
    assert seen.files["image"] == ("photo.png", picture, "image/png")
    variation = await sdk(gw, red).images.create_variation(
        model="img", image=("photo.png", picture, "image/png")
    )
    assert variation.data and api.seen[-1].path == "/v1/images/variations"
    await gw.flush()
    endpoints = [r["endpoint"] for r in await request_log(gw, red)]
    assert endpoints == ["images.variations", "images.edits"]


@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")  # the SDK's translations
async def test_audio_is_billed_per_second_and_per_character(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, api, red, _ = await setup(make_gateway, aiohttp_server)
    client = sdk(gw, red)
    clip = wav(2.5)
    api.usage = {"type": "duration", "seconds": 3}
    text = await client.audio.transcriptions.create(model="stt", file=("clip.wav", clip))
    assert text.text == "hello there"
    assert api.seen[-1].files["file"][1] == clip and api.seen[-1].fields["model"] == "whisper-1"
    # Without the provider's own seconds (a text answer), the file's: read from its header.
    api.usage = None
    plain = await client.audio.translations.create(
        model="stt", file=("clip.wav", clip), response_format="text"
    )
    assert plain.strip() == "hello there"
    async with client.audio.speech.with_streaming_response.create(
        model="tts", voice="alloy", input="Hello world"
    ) as speech:
        assert speech.headers["content-type"] == "audio/mpeg"
        audio = b"".join([c async for c in speech.iter_bytes()])
    assert audio == SPEECH  # relayed unchanged
    assert api.seen[-1].json == {"model": "tts-1", "voice": "alloy", "input": "Hello world"}
    await gw.flush()
    speech_row, translation, transcription = await request_log(gw, red)
    assert transcription["units"] == {"seconds": 3} and transcription["usage_source"] == "provider"
    assert transcription["cost_usd"] == pytest.approx(3 * 0.0001)  # whisper-1
    assert translation["units"] == {"seconds": 2.5} and translation["usage_source"] == "estimated"
    assert translation["cost_usd"] == pytest.approx(2.5 * 0.0001)
    assert speech_row["units"] == {"characters": 11}
    assert speech_row["cost_usd"] == pytest.approx(11 * 1.5e-05)  # tts-1


async def test_moderations_are_free_and_rerank_is_billed_per_search(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, api, red, _ = await setup(make_gateway, aiohttp_server)
    # No model named: OpenAI's default, served here by an alias of that name.
    moderation = await sdk(gw, red).moderations.create(input="I love my cat")
    assert moderation.results[0].flagged is False
    assert api.seen[-1].json["model"] == "omni-moderation-latest"
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + "/v1/rerank",
            json={
                "model": "reranker",
                "query": "pets",
                "documents": ["cats", "cars", "dogs"],
                "top_n": 2,
            },
            headers={"Authorization": f"Bearer {red}"},
        ) as response,
    ):
        assert response.status == 200
        ranked = await response.json()
    assert [r["index"] for r in ranked["results"]] == [0, 1]
    assert api.seen[-1].json["model"] == "rerank-english-v3.0"
    await gw.flush()
    rerank, moderated = await request_log(gw, red)
    assert moderated["cost_usd"] == 0.0 and moderated["endpoint"] == "moderations"
    assert rerank["units"] == {"searches": 1, "documents": 3}
    assert rerank["cost_usd"] == pytest.approx(0.002)


async def test_a_call_no_deployment_answers_is_logged_with_its_error(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, api, red, _ = await setup(make_gateway, aiohttp_server)
    api.failures = [500, 500]
    with pytest.raises(openai.InternalServerError):
        await sdk(gw, red).images.generate(model="img", prompt="x")
    assert len(api.seen) == 2  # retried once, as the alias says
    # A retry that succeeds is one completed call.
    api.failures = [503]
    await sdk(gw, red).images.generate(model="img", prompt="x")
    await gw.flush()
    done, failed = await request_log(gw, red)
    assert failed["status"] == "error" and failed["cost_usd"] == 0.0
    assert failed["error"].startswith("upstream_error: ") and "fake failure 500" in failed["error"]
    assert done["status"] == "completed"
    assert [r["id"] for r in await request_log(gw, red, "?status=error")] == [failed["id"]]
    # A call is found by the X-Request-Id its client saw.
    raw = await sdk(gw, red).images.with_raw_response.generate(model="img", prompt="y")
    await gw.flush()
    [found] = await request_log(gw, red, f"?id={raw.headers['X-Request-Id']}")
    assert found["id"] == raw.headers["X-Request-Id"] and found["endpoint"] == "images.generations"


async def test_an_endpoint_the_aliass_provider_cannot_serve_is_a_clear_400(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    gw, _, red, _ = await setup(make_gateway, aiohttp_server)
    with pytest.raises(openai.BadRequestError) as raised:
        await sdk(gw, red).images.generate(model="claude", prompt="x")
    message = raised.value.body["message"]  # type: ignore[index]
    assert "`claude`" in message and "/v1/images/generations" in message
    with pytest.raises(openai.NotFoundError):
        await sdk(gw, red).images.generate(model="nope", prompt="x")


async def test_a_hard_budget_refuses_a_call_it_cannot_price(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    api = await OpenAIAPI().start(aiohttp_server)
    gw = await make_gateway(
        models=[
            {"name": "img", "deployments": [api.deployment("my-own-image-model")]},
            {
                "name": "priced",
                "deployments": [
                    api.deployment(
                        "my-own-image-model",
                        price={
                            "input_cost_per_token": 0,
                            "output_cost_per_token": 0,
                            "input_cost_per_image": 0.5,
                        },
                    )
                ],
            },
        ],
        auth={"master_key": MASTER},
    )
    await admin(gw, "POST", "/v1/gateway/teams", {"id": "red", "name": "red"})
    key = (
        await new_key(gw, "red", limits={"budget": {"usd": 1.0, "period": "day", "mode": "hard"}})
    )["key"]
    with pytest.raises(openai.PermissionDeniedError) as raised:
        await sdk(gw, key).images.generate(model="img", prompt="x")
    assert raised.value.code == "price_unknown"
    assert api.seen == []
    await sdk(gw, key).images.generate(model="priced", prompt="x", n=2)  # $1.00: within
    await gw.flush()
    [row] = await request_log(gw, key)
    assert row["cost_usd"] == pytest.approx(1.0)
    with pytest.raises(openai.RateLimitError):  # the budget is spent
        await sdk(gw, key).images.generate(model="priced", prompt="x")


async def test_litellm_deployments_serve_images_audio_and_rerank_through_litellm(
    make_gateway: MakeGateway, aiohttp_server: MakeServer
) -> None:
    api = await OpenAIAPI().start(aiohttp_server)

    def through_litellm(model: str) -> dict[str, Any]:
        return {
            "provider": "litellm",
            "model": model,
            "api_base": api.url,
            "api_key": "sk-openai-api-fake-0123456789",
        }

    gw = await make_gateway(
        models=[
            {"name": "img", "deployments": [through_litellm("openai/gpt-image-1")]},
            {"name": "stt", "deployments": [through_litellm("openai/whisper-1")]},
            {"name": "tts", "deployments": [through_litellm("openai/tts-1")]},
            {
                "name": "rank",
                "deployments": [
                    {**through_litellm("cohere/rerank-english-v3.0"), "api_base": api.url[:-3]}
                ],
            },
        ]
    )
    client = gw.client()
    made = await client.images.generate(
        model="img", prompt="a lighthouse", size="1024x1024", quality="low"
    )
    assert made.data[0].b64_json == PNG
    assert (
        api.seen[-1].path == "/v1/images/generations"
        and api.seen[-1].json["model"] == "gpt-image-1"
    )
    text = await client.audio.transcriptions.create(model="stt", file=("clip.wav", wav(1.0)))
    assert text.text == "hello there"
    assert api.seen[-1].files["file"][1] == wav(1.0)
    speech = await client.audio.speech.create(model="tts", voice="alloy", input="Hi")
    assert speech.content == SPEECH
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gw.url + "/v1/rerank",
            json={"model": "rank", "query": "pets", "documents": ["cats", "cars"], "top_n": 1},
        ) as response,
    ):
        ranked = await response.json()
        assert response.status == 200, ranked
    assert ranked["results"][0]["index"] == 0
    assert api.seen[-1].json["documents"] == ["cats", "cars"]
    await gw.flush()
    rows = gw.query("SELECT endpoint, provider, model, cost_usd FROM usage ORDER BY created_at")
    assert [r[:3] for r in rows] == [
        ("images.generations", "litellm", "openai/gpt-image-1"),
        ("audio.transcriptions", "litellm", "openai/whisper-1"),
        ("audio.speech", "litellm", "openai/tts-1"),
        ("rerank", "litellm", "cohere/rerank-english-v3.0"),
    ]
    assert rows[0][3] == pytest.approx(0.011) and rows[2][3] == pytest.approx(2 * 1.5e-05)
    assert rows[3][3] == pytest.approx(0.002)
