"""Fake Vertex AI endpoints, as litellm calls them for `vertex_ai/...` models: Gemini's
(`publishers/google/models/{m}:streamGenerateContent?alt=sse`) and Anthropic's
(`publishers/anthropic/models/{m}:streamRawPredict`), under `v1/projects/{p}/locations/{l}`.

Vertex takes no API key: every request carries an OAuth access token, which a service account
gets by posting a JWT it signed with its private key to its `token_uri`. The fake is that token
endpoint too (the key file's `token_uri` points at it), so the whole exchange stays on loopback:
it checks the JWT's RS256 signature against the key it issued, and each model request's bearer
token against the one it handed out.
"""

from __future__ import annotations

import base64
import json
import secrets
from collections.abc import Awaitable, Callable
from functools import cache
from typing import Any, ClassVar
from urllib.parse import parse_qs

from aiohttp import web
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa

from tests.fakes import FakeServer
from tests.providers.anthropic import AnthropicServer
from tests.providers.google import GeminiServer

PROJECT = "fake-project-4711"
LOCATION = "europe-west4"
CLIENT_EMAIL = f"gateway@{PROJECT}.iam.gserviceaccount.com"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
# A service account's JWT names Google's token endpoint as its audience, whichever `token_uri`
# it is posted to (google-auth's service_account).
AUDIENCE = "https://oauth2.googleapis.com/token"
LOCATION_PATH = f"/v1/projects/{PROJECT}/locations/{LOCATION}"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@cache
def private_key() -> rsa.RSAPrivateKey:
    # One key for the session: generating RSA keys is slow enough to show in every test.
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _b64decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def check_assertion(assertion: str) -> None:
    """Assert that `assertion` is the service account's JWT, signed with the fake's key."""
    head, claims, signature = assertion.split(".")
    assert json.loads(_b64decode(head))["alg"] == "RS256"
    private_key().public_key().verify(
        _b64decode(signature),
        f"{head}.{claims}".encode(),
        padding.PKCS1v15(),
        hashes.SHA256(),
    )
    payload = json.loads(_b64decode(claims))
    assert payload["iss"] == CLIENT_EMAIL
    assert payload["aud"] == AUDIENCE
    assert SCOPE in payload["scope"].split()


class VertexAuth:
    """The OAuth side of a fake Vertex endpoint: a service-account key whose `token_uri` is the
    fake's own `/token`, and the access tokens handed out there."""

    url: str

    def __init__(self) -> None:
        self.tokens: list[str] = []  # every access token handed out
        self.token_requests = 0

    def add_vertex_routes(self, router: web.UrlDispatcher, handle: Handler) -> None:
        router.add_post("/token", self.token)
        router.add_post(f"{LOCATION_PATH}/publishers/{{rest:.+}}", handle)

    def token_uri(self) -> str:
        return self.url + "/token"

    def credentials(self) -> str:
        """The service-account key file's JSON, as `vertex_credentials` takes it inline."""
        pem = private_key().private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return json.dumps(
            {
                "type": "service_account",
                "project_id": PROJECT,
                # Learned as a configured secret by the scrubber: like no other test's text.
                "private_key_id": "fake-vertex-key-id-5c0ffee",
                "private_key": pem.decode(),
                "client_email": CLIENT_EMAIL,
                "client_id": "1234567890",
                "token_uri": self.token_uri(),
            }
        )

    async def token(self, request: web.Request) -> web.StreamResponse:
        form = parse_qs(await request.text())
        assert form["grant_type"] == [JWT_BEARER]
        check_assertion(form["assertion"][0])
        self.token_requests += 1
        self.tokens.append(f"ya29.fake-{secrets.token_urlsafe(12)}")
        return web.json_response(
            {"access_token": self.tokens[-1], "expires_in": 3599, "token_type": "Bearer"}
        )

    def check_bearer(self, request: web.Request) -> None:
        assert request.headers["Authorization"] == f"Bearer {self.tokens[-1]}"

    def vertex_deployment(self, server: FakeServer, **extra: Any) -> dict[str, Any]:
        # No api_key: litellm would send it as a Vertex express-mode key instead of the token.
        return {
            "provider": server.provider,
            "api_base": server.url,
            "model": server.model,
            "vertex_project": PROJECT,
            "vertex_location": LOCATION,
            "vertex_credentials": self.credentials(),
            **extra,
        }


def model_path(publisher: str, model: str, method: str) -> str:
    return f"{LOCATION_PATH}/publishers/{publisher}/models/{model}:{method}"


class VertexGeminiServer(GeminiServer, VertexAuth):
    """Vertex AI's Gemini endpoint: the Gemini API's stream, at Vertex's URL, with a token."""

    gemini_model = "gemini-2.5-flash"
    model = f"vertex_ai/{gemini_model}"

    def __init__(self) -> None:
        VertexAuth.__init__(self)
        GeminiServer.__init__(self)

    def deployment(self, **extra: Any) -> dict[str, Any]:
        return self.vertex_deployment(self, **extra)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        self.add_vertex_routes(router, self.handle)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == model_path("google", self.gemini_model, "streamGenerateContent")
        assert request.query.get("alt") == "sse"
        self.check_bearer(request)
        assert "x-goog-api-key" not in request.headers


class VertexAnthropicServer(AnthropicServer, VertexAuth):
    """Vertex AI's Anthropic endpoint: Anthropic's Messages stream at `:streamRawPredict`, the
    model in the URL (not the body) and `anthropic_version: vertex-2023-10-16` in the body."""

    provider = "litellm"
    claude_model = "claude-sonnet-4-5@20250929"
    model = f"vertex_ai/{claude_model}"
    # litellm hands Claude's thinking signature on in `thinking_blocks`, where the gateway reads
    # it for the record.
    reasoning_signature: ClassVar[str | None] = AnthropicServer.signature

    def __init__(self) -> None:
        VertexAuth.__init__(self)
        AnthropicServer.__init__(self)

    def deployment(self, **extra: Any) -> dict[str, Any]:
        return self.vertex_deployment(self, **extra)

    def add_routes(self, router: web.UrlDispatcher) -> None:
        self.add_vertex_routes(router, self.handle)

    def check_request(self, request: web.Request, body: dict[str, Any]) -> None:
        assert request.path == model_path("anthropic", self.claude_model, "streamRawPredict")
        self.check_bearer(request)
        # litellm's Anthropic client repeats the token as `x-api-key`, which Vertex ignores.
        assert request.headers.get("x-api-key", self.tokens[-1]) == self.tokens[-1]
        assert "model" not in body
        assert body["anthropic_version"] == "vertex-2023-10-16"
        assert body["max_tokens"] > 0
        assert body["stream"] is True
