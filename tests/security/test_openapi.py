"""GET /openapi.json stays true to the gateway: every route and method, a valid OpenAPI 3.1
document, and examples that validate against their schemas and succeed on a live gateway."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate

from gateway.app import create_app
from gateway.config import parse_config
from gateway.http.openapi import document
from tests.conftest import GatewayUnderTest, MakeGateway

MASTER = "sk-master-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {MASTER}"}
METHODS = {"GET", "POST", "PUT", "PATCH", "DELETE"}


def _app_routes() -> dict[str, set[str]]:
    app = create_app(parse_config({}).config)
    routes: dict[str, set[str]] = {}
    for route in app.router.routes():
        if route.method in METHODS and route.resource is not None:
            routes.setdefault(route.resource.canonical, set()).add(route.method)
    return routes


def _doc_routes(doc: dict[str, Any]) -> dict[str, set[str]]:
    return {path: {m.upper() for m in ops} for path, ops in doc["paths"].items()}


def schema_validator(doc: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    """A validator for `schema`, its $refs resolved in the document's components."""
    return Draft202012Validator({**schema, "components": doc["components"]})


def test_every_route_is_documented_with_its_methods_and_nothing_else() -> None:
    assert _doc_routes(document(["demo"])) == _app_routes()


def test_the_document_is_valid_openapi_3_1() -> None:
    doc = document(["demo", "fake"])
    validate(doc)
    assert doc["openapi"].startswith("3.1")
    schemes = doc["components"]["securitySchemes"]
    assert schemes["bearer"]["scheme"] == "bearer"
    assert schemes["apiKey"] == {"type": "apiKey", "in": "header", "name": "x-api-key"}


def test_every_error_status_has_the_error_shape_of_its_dialect() -> None:
    doc = document(["demo"])
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            for status, response in op["responses"].items():
                if status == "default" or int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    anthropic = path.startswith("/v1/messages")
                    shape = "AnthropicError" if anthropic else "Error"
                    assert schema == {"$ref": f"#/components/schemas/{shape}"}, (path, method)


EXAMPLES = {
    "/v1/chat/completions": "ChatCompletionRequest",
    "/v1/messages": "MessagesRequest",
    "/v1/responses": "ResponsesRequest",
    "/v1/embeddings": "EmbeddingsRequest",
    "/v1/completions": "CompletionRequest",
    "/v1/conversations": "NewConversation",
}


def test_examples_validate_against_their_schemas() -> None:
    doc = document(["demo"])
    schemas = doc["components"]["schemas"]
    for path, name in EXAMPLES.items():
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"] == {"$ref": f"#/components/schemas/{name}"}
        example = schemas[name]["example"]
        schema_validator(doc, body["schema"]).validate(example)
    # ... and the schemas are not vacuous: a body without its required fields fails.
    for name in ("ChatCompletionRequest", "MessagesRequest", "ResponsesRequest"):
        assert not schema_validator(doc, schemas[name]).is_valid({"model": "demo"})


@pytest.fixture
async def locked(make_gateway: MakeGateway) -> GatewayUnderTest:
    return await make_gateway(auth={"master_key": MASTER})


async def test_the_document_is_served_without_a_key(locked: GatewayUnderTest) -> None:
    async with aiohttp.ClientSession() as session:
        async with session.get(locked.url + "/openapi.json") as response:
            assert response.status == 200
            assert response.content_type == "application/json"
            served = await response.json()
        async with session.get(locked.url + "/v1/models") as response:
            assert response.status == 401  # the API itself still needs a key
    assert served == document([])  # and no alias is named without one


def model_examples(doc: dict[str, Any]) -> dict[str, list[str] | None]:
    """The `model` examples of each request schema that has them."""
    schemas = doc["components"]["schemas"]
    names = ("ChatCompletionRequest", "MessagesRequest", "ResponsesRequest", "EmbeddingsRequest")
    return {n: schemas[n]["properties"]["model"].get("examples") for n in names}


async def test_the_document_names_only_the_aliases_the_key_may_use(
    make_gateway: MakeGateway,
) -> None:
    demo = {"name": "demo", "deployments": [{"provider": "demo", "chunk_delay_ms": 0}]}
    models = [demo, {**demo, "name": "secret-model"}, {**demo, "name": "other"}]
    gw = await make_gateway(models, auth={"master_key": MASTER})
    async with aiohttp.ClientSession() as session:

        async def served(key: str | None) -> dict[str, list[str] | None]:
            headers = {"Authorization": f"Bearer {key}"} if key else {}
            async with session.get(gw.url + "/openapi.json", headers=headers) as response:
                assert response.status == 200
                return model_examples(await response.json())

        async with session.post(
            gw.url + "/v1/gateway/teams", json={"id": "t", "name": "T"}, headers=AUTH
        ) as response:
            assert response.status == 201
        body = {"team_id": "t", "models": ["demo", "other"]}
        async with session.post(gw.url + "/v1/gateway/keys", json=body, headers=AUTH) as r:
            team_key = (await r.json())["key"]

        everything = ["demo", "secret-model", "other"]
        assert all(v == everything for v in (await served(MASTER)).values())
        assert all(v == ["demo", "other"] for v in (await served(team_key)).values())
        for nobody in (None, "not-the-master-key-0123456789", "gw-not-a-key"):
            assert all(v is None for v in (await served(nobody)).values()), nobody


async def test_examples_succeed_against_a_live_gateway(locked: GatewayUnderTest) -> None:
    doc = document(["demo"])
    schemas = doc["components"]["schemas"]
    async with aiohttp.ClientSession(headers=AUTH) as session:
        for path, name in EXAMPLES.items():
            async with session.post(locked.url + path, json=schemas[name]["example"]) as response:
                ok = doc["paths"][path]["post"]["responses"]["200"]["content"]["application/json"]
                body = await response.json()
                assert response.status == 200, (path, body)
                schema_validator(doc, ok["schema"]).validate(body)
        # The admin bodies come from the pydantic models: a team, then a key of it.
        team = {"name": "Search", "id": "search"}
        async with session.post(locked.url + "/v1/gateway/teams", json=team) as response:
            assert response.status == 201, await response.text()
        key = {"team_id": "search", "models": ["demo"]}
        schema_validator(doc, schemas["NewKey"]).validate(key)
        async with session.post(locked.url + "/v1/gateway/keys", json=key) as response:
            assert response.status == 201, await response.text()
            assert (await response.json())["key"].startswith("gw-")


async def test_a_streamed_example_has_the_documented_content_type(locked: GatewayUnderTest) -> None:
    doc = document(["demo"])
    example = {**doc["components"]["schemas"]["ChatCompletionRequest"]["example"], "stream": True}
    documented = doc["paths"]["/v1/chat/completions"]["post"]["responses"]["200"]["content"]
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.post(locked.url + "/v1/chat/completions", json=example) as response:
            assert response.status == 200
            assert response.content_type in documented
            assert (await response.read()).endswith(b"data: [DONE]\n\n")


async def test_get_me_answers_as_its_schema_says_for_the_admin_and_a_budgeted_key(
    locked: GatewayUnderTest,
) -> None:
    doc = document(["demo"])
    get = doc["paths"]["/v1/me"]["get"]["responses"]["200"]["content"]["application/json"]
    validator = schema_validator(doc, get["schema"])
    async with aiohttp.ClientSession(headers=AUTH) as session:
        team = {"name": "Budgeted", "id": "budgeted", "limits": {"rpm": 5}}
        async with session.post(locked.url + "/v1/gateway/teams", json=team) as response:
            assert response.status == 201, await response.text()
        key = {"team_id": "budgeted", "limits": {"budget": {"usd": 2.5, "period": "day"}}}
        async with session.post(locked.url + "/v1/gateway/keys", json=key) as response:
            secret = (await response.json())["key"]
        async with session.get(locked.url + "/v1/me") as response:
            admin = await response.json()
        async with session.get(
            locked.url + "/v1/me", headers={"Authorization": f"Bearer {secret}"}
        ) as response:
            own = await response.json()
    validator.validate(admin)
    validator.validate(own)
    assert admin["budget"] is None
    assert own["budget"]["key"]["budget"]["usd"] == 2.5 and own["budget"]["key"]["spent_usd"] == 0
    assert own["budget"]["team"]["rpm"] == 5
    # The schema could fail: a field the gateway does not send is refused.
    bad = {**own, "budget": {**own["budget"], "key": {**own["budget"]["key"], "rpm": "five"}}}
    assert not validator.is_valid(bad)
