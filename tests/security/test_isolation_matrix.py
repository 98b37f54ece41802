"""Tenant isolation for every route of the app, from one table.

Team alpha writes data through every kind of write (a chat turn joined by `X-Conversation-Id`, a
branch, a stored Responses API response, Conversations API items, usage, an in-flight chat
stream and an in-flight response). Then every route of the router is called with team beta's
key on alpha's ids: beta gets 404 (as for an id that does not exist), or a list filtered to its
own team, or 403 on the admin API, and never one byte of alpha's data; alpha's key gets its 2xx.

The table must name every route the router has (HEAD aside: aiohttp adds one per GET and it
runs the same handler). A route added without a row here fails the test: decide what it shows
to another team, then add the row.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from multidict import CIMultiDictProxy

from tests.conftest import GatewayUnderTest, MakeGateway
from tests.fakes import FakeUpstream, chunk, frames

MASTER = "isolation-master-key-0123456789"
TAG = os.urandom(4).hex()
ALPHA, BETA = f"team-alpha-{TAG}", f"team-beta-{TAG}"
MARKER = f"ALPHA-PRIVATE-{TAG}"  # in every piece of content team alpha writes
CHAT_CONVERSATION = f"alpha-chat-{TAG}"  # a client-chosen conversation id

# What a route shows another team:
OWNED = "owned"  # one of alpha's objects, named in the path, a header or the body: 404
LISTED = "listed"  # a list or report: filtered to the caller's own team
SELF = "self"  # about the caller only (its principal, its models)
ADMIN = "admin"  # /v1/gateway/*: the master key's alone, 403 for every team key
PUBLIC = "public"  # no key, no tenant data (probes, metrics, the UI's static files)
CREATE = "create"  # makes the caller's own new data from nothing of another team's
CALL = "call"  # a model call of the caller's own, answered whatever way, naming nothing else


@dataclass
class Ids:
    """What team alpha made, and the keys."""

    alpha_key: str = ""
    alpha_key_id: str = ""
    beta_key: str = ""
    beta_key_id: str = ""
    chat: str = CHAT_CONVERSATION
    branch: str = ""
    response: str = ""
    response_conversation: str = ""
    items: str = ""
    at_seq: int = 0
    turn: str = ""
    history: list[dict[str, Any]] = field(default_factory=list)
    inflight_request: str = f"alpha-inflight-{TAG}"
    inflight_response: str = ""

    def alpha_only(self) -> list[str]:
        """Strings that only alpha's data contains."""
        return [
            MARKER,
            ALPHA,
            self.alpha_key_id,
            self.chat,
            self.branch,
            self.response,
            self.response_conversation,
            self.items,
        ]


Value = Callable[[Ids], Any]


@dataclass(frozen=True)
class Probe:
    method: str
    route: str  # the route's path as registered, e.g. /v1/conversations/{id}
    kind: str
    path: Value | str | None = None  # the concrete path; the route itself when None
    body: Value | None = None
    headers: Value | None = None
    owner: int | None = 200  # what alpha's own key gets; None: not asked (see `run`)

    def concrete(self, ids: Ids) -> tuple[str, Any, dict[str, str]]:
        path = self.path(ids) if callable(self.path) else (self.path or self.route)
        body = self.body(ids) if self.body is not None else None
        headers = self.headers(ids) if self.headers is not None else {}
        return path, body, headers


def chat_body(ids: Ids, model: str = "demo") -> dict[str, Any]:
    return {
        "model": model,
        "messages": [*ids.history, {"role": "user", "content": f"{MARKER} and then?"}],
    }


def item(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def joining(ids: Ids) -> dict[str, str]:
    return {"X-Conversation-Id": CHAT_CONVERSATION}  # as alpha's client named it


TABLE: list[Probe] = [
    # -- completions: a new turn of the caller's own, or joining alpha's conversation ------------
    Probe("POST", "/v1/chat/completions", CREATE, body=lambda i: {
        "model": "demo", "messages": [{"role": "user", "content": "beta's own question"}]}),
    # Alpha's conversation id names beta's own conversation: ids are each team's (a turn of
    # beta's, with nothing of alpha's in it).
    Probe("POST", "/v1/chat/completions", CREATE, headers=joining, body=lambda i: {
        "model": "demo", "messages": [{"role": "user", "content": "beta's own question"}]}),
    Probe("POST", "/v1/completions", CREATE, body=lambda i: {
        "model": "demo", "prompt": "beta's own prompt"}),
    Probe("POST", "/v1/messages", CREATE, body=lambda i: {
        "model": "demo", "max_tokens": 64,
        "messages": [{"role": "user", "content": "beta's own question"}]}),
    Probe("POST", "/v1/messages", CREATE, headers=joining, body=lambda i: {
        "model": "demo", "max_tokens": 64,
        "messages": [{"role": "user", "content": "beta's own question"}]}),
    Probe("POST", "/v1/messages/count_tokens", SELF, body=lambda i: {
        "model": "demo", "messages": [{"role": "user", "content": "beta's own question"}]}),
    Probe("POST", "/v1/chat/completions/{request_id}/cancel", OWNED,
          path=lambda i: f"/v1/chat/completions/{i.inflight_request}/cancel", owner=None),
    # -- the Responses API --------------------------------------------------------------------
    Probe("POST", "/v1/responses", CREATE, body=lambda i: {"model": "demo", "input": "beta's"}),
    Probe("POST", "/v1/responses", OWNED, body=lambda i: {
        "model": "demo", "input": f"{MARKER} go on", "previous_response_id": i.response}),
    Probe("POST", "/v1/responses", OWNED, body=lambda i: {
        "model": "demo", "input": f"{MARKER} go on", "conversation": i.items}),
    Probe("GET", "/v1/responses/{id}", OWNED, path=lambda i: f"/v1/responses/{i.response}"),
    Probe("GET", "/v1/responses/{id}/input_items", OWNED,
          path=lambda i: f"/v1/responses/{i.response}/input_items"),
    Probe("POST", "/v1/responses/{id}/cancel", OWNED,
          path=lambda i: f"/v1/responses/{i.inflight_response}/cancel", owner=None),
    Probe("DELETE", "/v1/responses/{id}", OWNED, path=lambda i: f"/v1/responses/{i.response}"),
    # -- conversations ------------------------------------------------------------------------
    Probe("POST", "/v1/conversations", CREATE, body=lambda i: {"items": [item("beta's item")]}),
    Probe("GET", "/v1/conversations/{id}", OWNED, path=lambda i: f"/v1/conversations/{i.items}"),
    Probe("GET", "/v1/conversations/{id}", OWNED, path=lambda i: f"/v1/conversations/{i.chat}"),
    Probe("POST", "/v1/conversations/{id}", OWNED, path=lambda i: f"/v1/conversations/{i.chat}",
          body=lambda i: {"metadata": {"topic": "isolation"}}),
    Probe("GET", "/v1/conversations/{id}/items", OWNED,
          path=lambda i: f"/v1/conversations/{i.items}/items"),
    Probe("POST", "/v1/conversations/{id}/items", OWNED,
          path=lambda i: f"/v1/conversations/{i.items}/items",
          body=lambda i: {"items": [item(f"{MARKER} added")]}),
    Probe("GET", "/v1/conversations/{id}/events", OWNED,
          path=lambda i: f"/v1/conversations/{i.chat}/events"),
    Probe("GET", "/v1/conversations/{id}/events", OWNED,
          path=lambda i: f"/v1/conversations/{i.branch}/events"),
    Probe("GET", "/v1/conversations/{id}/messages", OWNED,
          path=lambda i: f"/v1/conversations/{i.chat}/messages"),
    Probe("GET", "/v1/conversations/{id}/messages", OWNED,
          path=lambda i: f"/v1/conversations/{i.response_conversation}/messages"),
    Probe("POST", "/v1/conversations/{id}/branches", OWNED, owner=201,
          path=lambda i: f"/v1/conversations/{i.chat}/branches",
          body=lambda i: {"at_seq": i.at_seq}),
    # The owner's turn completed: its owner can truncate it to what was shown (200).
    Probe("POST", "/v1/conversations/{id}/turns/{turn_id}/truncate", OWNED, owner=200,
          path=lambda i: f"/v1/conversations/{i.chat}/turns/{i.turn}/truncate",
          body=lambda i: {"content_chars": 0}),
    # The owner's turn has ended: a cancel of it is a 409, another team's a 404.
    Probe("POST", "/v1/conversations/{id}/turns/{turn_id}/cancel", OWNED, owner=409,
          path=lambda i: f"/v1/conversations/{i.chat}/turns/{i.turn}/cancel"),
    # The owner's turn has ended: its live view answers the end at once.
    Probe("GET", "/v1/conversations/{id}/turns/{turn_id}/live", OWNED,
          path=lambda i: f"/v1/conversations/{i.chat}/turns/{i.turn}/live"),
    Probe("GET", "/v1/conversations/{id}/usage", OWNED,
          path=lambda i: f"/v1/conversations/{i.chat}/usage"),
    Probe("GET", "/v1/conversations/{id}/usage", OWNED,
          path=lambda i: f"/v1/conversations/{i.branch}/usage"),
    Probe("DELETE", "/v1/conversations/{id}", OWNED,
          path=lambda i: f"/v1/conversations/{i.items}"),
    # -- lists and reports: whatever is asked, only the caller's team ---------------------------
    Probe("GET", "/v1/conversations", LISTED),
    Probe("GET", "/v1/conversations", LISTED, path=lambda i: f"/v1/conversations?team_id={ALPHA}"),
    Probe("GET", "/v1/conversations", LISTED,
          path=lambda i: f"/v1/conversations?key_id={i.alpha_key_id}"),
    Probe("GET", "/v1/conversations", LISTED, path=lambda i: f"/v1/conversations?q={MARKER}"),
    Probe("GET", "/v1/conversations", LISTED, path=lambda i: f"/v1/conversations?id={i.chat}"),
    Probe("GET", "/v1/conversations", LISTED,
          path=lambda i: f"/v1/conversations?parent_id={i.chat}"),
    Probe("GET", "/v1/usage", LISTED),
    Probe("GET", "/v1/usage", LISTED, path=lambda i: f"/v1/usage?team_id={ALPHA}"),
    Probe("GET", "/v1/usage", LISTED, path="/v1/usage?group_by=key"),
    Probe("GET", "/v1/usage", LISTED, path="/v1/usage?group_by=user"),
    Probe("GET", "/v1/usage", LISTED, path="/v1/usage?group_by=model&granularity=hour"),
    Probe("GET", "/v1/usage", LISTED, path=lambda i: f"/v1/usage?team_id={ALPHA}&format=csv"),
    Probe("GET", "/v1/usage", LISTED, path=lambda i: f"/v1/usage?team_id={ALPHA}&group_by=tag:p"),
    Probe("GET", "/v1/usage/latency", LISTED),
    Probe("GET", "/v1/usage/latency", LISTED,
          path=lambda i: f"/v1/usage/latency?team_id={ALPHA}&group_by=team"),
    Probe("GET", "/v1/usage/requests", LISTED),
    Probe("GET", "/v1/usage/requests", LISTED,
          path=lambda i: f"/v1/usage/requests?team_id={ALPHA}&format=jsonl"),
    # -- about the caller -----------------------------------------------------------------------
    Probe("GET", "/v1/requests", LISTED),
    Probe("GET", "/v1/requests", LISTED, path=lambda i: f"/v1/requests?team_id={ALPHA}"),
    # Calls to a model: the caller's own, with nothing of another team's (the demo serves
    # none of them, so each is a 400 naming the endpoint, for every key alike).
    *(
        Probe("POST", route, CALL, body=lambda i: {"model": "demo", "prompt": "x"}, owner=400)
        for route in ("/v1/images/generations", "/v1/moderations", "/v1/audio/speech")
    ),
    Probe("POST", "/v1/rerank", CALL, owner=400,
          body=lambda i: {"model": "demo", "query": "q", "documents": ["d"]}),
    *(
        Probe("POST", route, CALL, owner=400)
        for route in ("/v1/images/edits", "/v1/images/variations", "/v1/audio/transcriptions",
                      "/v1/audio/translations")
    ),
    # Files and batches: each team's own (tests/http/test_files_batches.py makes real ones and
    # asks for another team's); here, lists are the caller's and an id is only ever a 404.
    Probe("GET", "/v1/files", LISTED),
    Probe("GET", "/v1/batches", LISTED),
    Probe("POST", "/v1/files", CALL, owner=400),
    Probe("POST", "/v1/batches", CALL, owner=404,
          body=lambda i: {"input_file_id": "file-alpha", "endpoint": "/v1/chat/completions",
                          "completion_window": "24h"}),
    *(
        Probe(method, route, OWNED, path=path, owner=None)
        for method, route, path in (
            ("GET", "/v1/files/{id}", "/v1/files/file-alpha"),
            ("GET", "/v1/files/{id}/content", "/v1/files/file-alpha/content"),
            ("GET", "/v1/batches/{id}", "/v1/batches/batch-alpha"),
            ("POST", "/v1/batches/{id}/cancel", "/v1/batches/batch-alpha/cancel"),
        )
    ),
    # (A delete of another team's file is refused, the file kept: test_files_batches.py.)
    Probe("DELETE", "/v1/files/{id}", CALL, path="/v1/files/file-alpha", owner=None),
    Probe("GET", "/v1/me", SELF),
    Probe("GET", "/v1/models", SELF),
    Probe("GET", "/v1/models/{id}", SELF, path="/v1/models/demo"),
    Probe("POST", "/v1/embeddings", CREATE, body=lambda i: {"model": "demo", "input": "beta"}),
    # -- the admin API --------------------------------------------------------------------------
    Probe("GET", "/v1/gateway/deployments", ADMIN),
    Probe("GET", "/v1/gateway/teams", ADMIN),
    Probe("POST", "/v1/gateway/teams", ADMIN, body=lambda i: {"name": "sneaky"}),
    Probe("PATCH", "/v1/gateway/teams/{id}", ADMIN, path=lambda i: f"/v1/gateway/teams/{ALPHA}",
          body=lambda i: {"limits": {"rpm": 1}}),
    Probe("GET", "/v1/gateway/keys", ADMIN, path=lambda i: f"/v1/gateway/keys?team_id={ALPHA}"),
    Probe("POST", "/v1/gateway/keys", ADMIN, body=lambda i: {"team_id": ALPHA}),
    Probe("GET", "/v1/gateway/keys/{id}", ADMIN,
          path=lambda i: f"/v1/gateway/keys/{i.alpha_key_id}"),
    Probe("PATCH", "/v1/gateway/keys/{id}", ADMIN,
          path=lambda i: f"/v1/gateway/keys/{i.alpha_key_id}", body=lambda i: {"models": []}),
    Probe("POST", "/v1/gateway/keys/{id}/rotate", ADMIN,
          path=lambda i: f"/v1/gateway/keys/{i.alpha_key_id}/rotate"),
    Probe("DELETE", "/v1/gateway/keys/{id}", ADMIN,
          path=lambda i: f"/v1/gateway/keys/{i.alpha_key_id}"),
    # -- public ---------------------------------------------------------------------------------
    Probe("GET", "/health/live", PUBLIC),
    Probe("GET", "/health/ready", PUBLIC),
    Probe("GET", "/metrics", PUBLIC),
    Probe("GET", "/openapi.json", PUBLIC),
    Probe("GET", "/ui", PUBLIC, owner=308),
    Probe("GET", "/ui/", PUBLIC),
    Probe("GET", "/ui/{file}", PUBLIC, path="/ui/app.js"),
]  # fmt: skip


Response = tuple[int, bytes, CIMultiDictProxy[str]]


class Caller:
    def __init__(self, gw: GatewayUnderTest, session: aiohttp.ClientSession) -> None:
        self.gw = gw
        self.session = session

    async def __call__(
        self,
        method: str,
        path: str,
        key: str | None,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> Response:
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        async with self.session.request(
            method, self.gw.url + path, json=body, headers=sent, allow_redirects=False
        ) as response:
            return response.status, await response.read(), response.headers

    async def ok(self, method: str, path: str, key: str | None, body: Any = None) -> Any:
        status, raw, _ = await self(method, path, key, body)
        assert 200 <= status < 300, (method, path, status, raw[:500])
        return json.loads(raw)


def test_the_table_names_every_route() -> None:
    from gateway.app import create_app
    from gateway.config import parse_config

    app = create_app(
        parse_config({"models": [{"name": "demo", "deployments": [{"provider": "demo"}]}]}).config
    )
    routes = {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD" and route.resource is not None
    }
    tabled = {(p.method, p.route) for p in TABLE}
    missing = sorted(routes - tabled)
    assert not missing, (
        f"routes without a row in the isolation table: {missing}. Decide what each shows to"
        " another team (OWNED: 404, LISTED: filtered, SELF, ADMIN: 403, PUBLIC, CREATE, CALL)"
        " and add a Probe."
    )
    assert not sorted(tabled - routes), "rows for routes the router no longer has"


async def make_alpha_data(gw: GatewayUnderTest, upstream: FakeUpstream, call: Caller) -> Ids:
    ids = Ids()
    for team in (ALPHA, BETA):
        await call.ok("POST", "/v1/gateway/teams", MASTER, {"id": team, "name": team})
    made = await call.ok("POST", "/v1/gateway/keys", MASTER, {"team_id": ALPHA, "user": "al"})
    ids.alpha_key, ids.alpha_key_id = made["key"], made["id"]
    made = await call.ok("POST", "/v1/gateway/keys", MASTER, {"team_id": BETA, "user": "bo"})
    ids.beta_key, ids.beta_key_id = made["key"], made["id"]
    alpha = ids.alpha_key

    # A chat turn in a conversation named by the client.
    question = {"role": "user", "content": f"{MARKER}: what is the plan?"}
    status, raw, _ = await call(
        "POST",
        "/v1/chat/completions",
        alpha,
        {"model": "demo", "messages": [question]},
        {"X-Conversation-Id": ids.chat},
    )
    assert status == 200, raw
    answer = json.loads(raw)["choices"][0]["message"]["content"]
    # A team's client-chosen id is stored in its namespace (docs/recording.md): the probes name
    # alpha's conversation as stored, which is alpha's alone (beta's own use of the same
    # string names a conversation of beta's).
    ids.chat = f"{CHAT_CONVERSATION}~{ALPHA}"
    events = await gw.wait_turn_end(ids.chat)
    ids.at_seq = next(e["seq"] for e in events if e["type"] == "turn/end")
    ids.turn = events[-1]["turn_id"]
    ids.history = [question, {"role": "assistant", "content": answer}]
    # A branch of it.
    branch = await call.ok(
        "POST", f"/v1/conversations/{ids.chat}/branches", alpha, {"at_seq": ids.at_seq}
    )
    ids.branch = branch["id"]
    # A stored response.
    response = await call.ok(
        "POST", "/v1/responses", alpha, {"model": "demo", "input": f"{MARKER} tips", "store": True}
    )
    ids.response = response["id"]
    ids.response_conversation = (
        await call.ok("GET", f"/v1/conversations?q={MARKER}%20tips", MASTER)
    )["data"][0]["id"]
    # Conversations API items.
    conversation = await call.ok(
        "POST",
        "/v1/conversations",
        alpha,
        {"items": [item(f"{MARKER} remember this")], "metadata": {"note": MARKER}},
    )
    ids.items = conversation["id"]
    await call.ok(
        "POST", f"/v1/conversations/{ids.items}/items", alpha, {"items": [item(f"{MARKER} also")]}
    )
    await gw.flush()
    # Usage: alpha's turns above are metered to it. Beta has some of its own, so that its
    # filtered lists are not trivially empty.
    await call.ok("POST", "/v1/chat/completions", ids.beta_key, {
        "model": "demo", "messages": [{"role": "user", "content": "beta here"}]})  # fmt: skip
    await gw.flush()
    return ids


async def open_stream(
    call: Caller, path: str, key: str, body: dict[str, Any], headers: dict[str, str]
) -> tuple[aiohttp.ClientResponse, bytes]:
    """Start a streaming request and read until its first SSE frame; the caller closes it."""
    sent = {"Authorization": f"Bearer {key}", **headers}
    response = await call.session.post(call.gw.url + path, json=body, headers=sent)
    assert response.status == 200, await response.text()
    first = b""
    while b"\n\n" not in first:
        piece = await response.content.readany()
        assert piece, first
        first += piece
    return response, first


def leaked(body: bytes, forbidden: list[str], asked: str) -> list[str]:
    """Alpha's strings in a response to beta, other than what beta itself asked for."""
    text = body.decode("utf-8", "replace")
    return [s for s in forbidden if s and s not in asked and s in text]


@pytest.fixture
async def gw(make_gateway: MakeGateway, upstream: FakeUpstream) -> GatewayUnderTest:
    return await make_gateway(upstream=upstream, auth={"master_key": MASTER})


async def test_another_team_sees_nothing_of_alphas_data_on_any_route(
    gw: GatewayUnderTest, upstream: FakeUpstream
) -> None:
    async with aiohttp.ClientSession() as session:
        call = Caller(gw, session)
        ids = await make_alpha_data(gw, upstream, call)
        forbidden = ids.alpha_only()

        # In-flight work of alpha's, for the cancel routes: a chat stream and a response.
        upstream.push(frames(chunk(f"{MARKER} partial"), then="stall"))
        chat_stream, _ = await open_stream(
            call,
            "/v1/chat/completions",
            ids.alpha_key,
            {"model": "fake", "stream": True, "messages": [{"role": "user", "content": MARKER}]},
            {"X-Request-Id": ids.inflight_request},
        )
        upstream.push(frames(chunk(f"{MARKER} partial"), then="stall"))
        response_stream, first = await open_stream(
            call,
            "/v1/responses",
            ids.alpha_key,
            {"model": "fake", "stream": True, "store": True, "input": MARKER},
            {},
        )
        found = re.search(rb'"id":\s*"(resp_[^"]+)"', first)
        assert found, first
        ids.inflight_response = found.group(1).decode()
        await gw.flush()

        deletes = [p for p in TABLE if p.method == "DELETE" and p.kind == OWNED]
        for probe in [p for p in TABLE if p not in deletes] + deletes:
            path, body, headers = probe.concrete(ids)
            # A 404 names the id beta asked for; nothing else of alpha's may appear.
            asked = path + json.dumps(body) + json.dumps(headers) if probe.kind == OWNED else ""
            where = f"{probe.method} {path} ({probe.kind})"
            status, raw, _ = await call(probe.method, path, ids.beta_key, body, headers)
            assert not leaked(raw, forbidden, asked), (where, raw[:500])
            if probe.kind == OWNED:
                assert status == 404, (where, status, raw[:300])
                if probe.method == "GET":
                    head, _, _ = await call("HEAD", path, ids.beta_key, None, headers)
                    assert head == 404, where
                if probe.method == "DELETE":  # beta's delete did nothing
                    still, _, _ = await call("GET", path, ids.alpha_key)
                    assert still == 200, where
            elif probe.kind == LISTED:
                assert status == 200, (where, status, raw[:300])
            elif probe.kind == ADMIN:
                assert status == 403, (where, status, raw[:300])
                owner, _, _ = await call(probe.method, path, ids.alpha_key, body, headers)
                assert owner == 403, where
                continue  # the master key's own use of these is tested in tests/http/test_auth
            elif probe.kind == PUBLIC:
                anonymous, raw, _ = await call(probe.method, path, None)
                assert anonymous == probe.owner, where
                assert not leaked(raw, forbidden, asked), (where, raw[:500])
                continue
            elif probe.kind == CALL:
                assert status < 500, (where, status, raw[:300])
            else:  # SELF, CREATE: the caller's own
                assert 200 <= status < 300, (where, status, raw[:300])
            if probe.owner is not None:
                owner, raw, _ = await call(probe.method, path, ids.alpha_key, body, headers)
                assert owner == probe.owner, (where, "alpha", owner, raw[:300])

        # The cancels, by the owner: beta's 404 above left alpha's requests running.
        status, raw, _ = await call(
            "POST", f"/v1/chat/completions/{ids.inflight_request}/cancel", ids.alpha_key
        )
        assert status == 200, raw
        assert b"[DONE]" in await chat_stream.read()
        status, raw, _ = await call(
            "POST", f"/v1/responses/{ids.inflight_response}/cancel", ids.alpha_key
        )
        assert status == 200, raw
        await response_stream.read()
        chat_stream.close()
        response_stream.close()

        # Beta's lists are its own: every conversation listed is beta's.
        listed = await call.ok("GET", "/v1/conversations?limit=100", ids.beta_key)
        assert listed["data"] and {c["team_id"] for c in listed["data"]} == {BETA}
        usage = await call.ok("GET", f"/v1/usage?team_id={ALPHA}", ids.beta_key)
        assert usage["data"] and {r["group"] for r in usage["data"]} == {BETA}
        mine = await call.ok("GET", "/v1/me", ids.beta_key)
        assert (mine["team_id"], mine["key_id"]) == (BETA, ids.beta_key_id)
        # ... and alpha's are alpha's, so the filtering above is not an empty answer for all.
        listed = await call.ok("GET", "/v1/conversations?limit=100", ids.alpha_key)
        assert {c["team_id"] for c in listed["data"]} == {ALPHA}
        assert {ids.chat, ids.branch, ids.response_conversation} <= {
            c["id"] for c in listed["data"]
        }
        usage = await call.ok("GET", "/v1/usage", ids.alpha_key)
        assert {r["group"] for r in usage["data"]} == {ALPHA}
