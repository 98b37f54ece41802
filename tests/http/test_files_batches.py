"""Files and batches through the openai SDK: kept by the deployment of the model they are for,
owned by the uploading key's team (another team's key gets 404 exactly as for an id that does not
exist), and a batch metered once its results are known, at the model's batch price."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import openai
import pytest
from aiohttp.test_utils import TestServer

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.http.openai_api import OpenAIAPI
from tests.http.test_auth import MASTER, admin, new_key
from tests.http.test_media_endpoints import request_log, sdk

MakeServer = Callable[..., Awaitable[TestServer]]


def batch_file(model: str, count: int = 3) -> bytes:
    lines = [
        {
            "custom_id": f"req-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": f"Question {i}"}]},
        }
        for i in range(count)
    ]
    return "\n".join(json.dumps(line) for line in lines).encode()


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest) -> dict[str, str]:
    """Owners are kept in the store: both of them."""
    return {"url": request.getfixturevalue("pg_url")} if request.param == "postgresql" else {}


async def setup(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, store: dict[str, str]
) -> tuple[GatewayUnderTest, OpenAIAPI, str, str]:
    api = await OpenAIAPI().start(aiohttp_server)
    gw = await make_gateway(
        models=[
            {"name": "gpt", "deployments": [api.deployment("gpt-4o-mini")]},
            {"name": "demo", "deployments": [{"provider": "demo"}]},
        ],
        auth={"master_key": MASTER},
        store=store,
    )
    for team in ("red", "blue"):
        await admin(gw, "POST", "/v1/gateway/teams", {"id": team, "name": team})
    red, blue = await new_key(gw, "red"), await new_key(gw, "blue")
    return gw, api, red["key"], blue["key"]


async def test_a_batch_from_upload_to_metered_results(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, store: dict[str, str]
) -> None:
    gw, api, red_key, blue_key = await setup(make_gateway, aiohttp_server, store)
    red, blue = sdk(gw, red_key), sdk(gw, blue_key)
    uploaded = await red.files.create(file=("batch.jsonl", batch_file("gpt")), purpose="batch")
    # Kept by the alias's deployment, each request naming the deployment's model.
    _, sent, _ = api.seen[-1].files["file"]
    assert [json.loads(line)["body"]["model"] for line in sent.splitlines()] == ["gpt-4o-mini"] * 3
    assert uploaded.purpose == "batch" and uploaded.id in api.files

    batch = await red.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert api.seen[-1].json == {
        "input_file_id": uploaded.id,
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    assert (await red.batches.retrieve(batch.id)).status == "validating"
    api.complete(batch.id, prompt=100, completion=20)
    done = await red.batches.retrieve(batch.id)
    assert done.status == "completed" and done.output_file_id
    await red.batches.retrieve(batch.id)  # metered once, however often it is read
    results = await red.files.content(done.output_file_id)
    assert [json.loads(line)["custom_id"] for line in results.text.splitlines()] == [
        "req-0",
        "req-1",
        "req-2",
    ]
    await gw.flush()
    rows = await request_log(gw, red_key)
    assert [r["endpoint"] for r in rows] == ["batches", "batches.create", "files.create"]
    metered = rows[0]
    assert (metered["prompt_tokens"], metered["completion_tokens"]) == (300, 60)
    assert metered["units"] == {"requests": 3, "batch": batch.id}
    # gpt-4o-mini's batch prices: half its own.
    assert metered["cost_usd"] == pytest.approx(300 * 7.5e-08 + 60 * 3e-07)
    assert metered["team_id"] == "red" and metered["model"] == "gpt"

    # Another team's key: every one of them is as unknown as an id that does not exist.
    for call in (
        blue.files.retrieve(uploaded.id),
        blue.files.content(done.output_file_id),
        blue.files.delete(uploaded.id),
        blue.batches.retrieve(batch.id),
        blue.batches.cancel(batch.id),
        blue.batches.create(
            input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
        ),
    ):
        with pytest.raises(openai.NotFoundError):
            await call
    assert [f.id async for f in blue.files.list()] == []
    assert [b.id async for b in blue.batches.list()] == []
    red_files = {f.id async for f in red.files.list()}
    assert red_files == {uploaded.id, done.output_file_id}
    assert [b.id async for b in red.batches.list()] == [batch.id]
    assert uploaded.id in api.files  # blue's delete reached nothing


async def test_files_need_their_model_and_a_key_allowed_it(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, store: dict[str, str]
) -> None:
    gw, api, red_key, _ = await setup(make_gateway, aiohttp_server, store)
    red = sdk(gw, red_key)
    with pytest.raises(openai.BadRequestError) as raised:
        await red.files.create(file=("notes.txt", b"hello"), purpose="assistants")
    assert raised.value.body["param"] == "model"  # type: ignore[index]
    made = await red.files.create(
        file=("notes.txt", b"hello"), purpose="assistants", extra_body={"model": "gpt"}
    )
    assert "model" not in api.seen[-1].fields  # the gateway's own field
    assert (await red.files.retrieve(made.id)).filename == "notes.txt"
    assert (await red.files.content(made.id)).content == b"hello"
    deleted = await red.files.delete(made.id)
    assert deleted.deleted and made.id not in api.files
    with pytest.raises(openai.NotFoundError):
        await red.files.retrieve(made.id)
    # A batch file naming two models, or a model with no deployment that keeps files.
    mixed = batch_file("gpt", 1) + b"\n" + batch_file("demo", 1)
    with pytest.raises(openai.BadRequestError):
        await red.files.create(file=("b.jsonl", mixed), purpose="batch")
    with pytest.raises(openai.BadRequestError) as raised:
        await red.files.create(file=("b.jsonl", batch_file("demo")), purpose="batch")
    assert "keeps files" in raised.value.body["message"]  # type: ignore[index]
    limited = sdk(gw, (await new_key(gw, "red", models=["demo"]))["key"])
    with pytest.raises(openai.NotFoundError):
        await limited.files.create(file=("b.jsonl", batch_file("gpt")), purpose="batch")


async def test_a_batch_can_be_cancelled_by_its_team(
    make_gateway: MakeGateway, aiohttp_server: MakeServer, store: dict[str, str]
) -> None:
    gw, _, red_key, _ = await setup(make_gateway, aiohttp_server, store)
    red = sdk(gw, red_key)
    uploaded = await red.files.create(file=("b.jsonl", batch_file("gpt")), purpose="batch")
    batch = await red.batches.create(
        input_file_id=uploaded.id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert (await red.batches.cancel(batch.id)).status == "cancelling"
    await gw.flush()
    assert (await request_log(gw, red_key))[0]["endpoint"] == "batches.cancel"
