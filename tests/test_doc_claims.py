"""The docs' mechanical claims, checked against the code that makes them true: what a store
outage answers, which states `/health/ready` reports, which limits Redis shares between
replicas (and the supervisor between the workers of `serve --workers N`), and which Redis calls
the error metric counts. Each claim is read out of the docs and
compared with what the code does (driven where it can be, parsed from it where the values are
literals), so a doc and the code cannot drift apart on these without a failure.

The replicas' behaviour through a Redis outage is tests/test_replicas.py's."""

from __future__ import annotations

import ast
import asyncio
import inspect
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from gateway.context import GATEWAY
from gateway.errors import LimitExceeded
from gateway.http import system
from gateway.metering import redis_limits
from gateway.metering.limits import Limiter, Limits
from gateway.metering.redis_limits import RedisLimiter
from gateway.metering.shared_limits import LimitServer, SharedLimiter
from gateway.pipeline import cancel_bus
from gateway.routing import cooldowns
from tests.conftest import GatewayUnderTest, MakeGateway
from tests.postgres_server import PostgresServer, throwaway_postgres

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def read(relative: str) -> str:
    return (ROOT / relative).read_text()


def section(text: str, heading: str) -> str:
    """The body of a `## heading` section, up to the next heading of that level or above."""
    start = text.index(f"\n{heading}\n") + len(heading) + 2
    level = heading.count("#")
    match = re.search(rf"\n#{{1,{level}}} ", text[start:])
    return text[start : start + match.start()] if match else text[start:]


def bullet(text: str, starting: str) -> str:
    """The list item that starts with `starting`, its continuation lines joined."""
    match = re.search(r"(?m)^- " + re.escape(starting) + r".*(?:\n  .*)*", text)
    assert match, starting
    return " ".join(match.group(0).split())


def mentions(code: str) -> Iterator[tuple[Path, str, str]]:
    """(doc, the text just before, the rest of its table row or paragraph) for every mention of
    an error code in the docs."""
    for path in DOCS:
        for block in re.split(r"\n\s*\n|\n(?=\|)", path.read_text()):
            flat = " ".join(block.split())
            for match in re.finditer(rf"\b{code}\b", flat):
                yield path, flat[: match.start()], flat[match.end() :]


# --- a store outage: 503 store_unavailable with Retry-After ------------------------------------


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A cluster of this test's own: it is stopped."""
    with throwaway_postgres("gw-pg-claims-") as server:
        yield server


async def test_a_store_outage_answers_what_the_docs_say(
    own_postgres: PostgresServer, make_gateway: MakeGateway
) -> None:
    gw = await make_gateway(store={"url": own_postgres.create_database()})
    await asyncio.to_thread(own_postgres.stop)
    async with aiohttp.ClientSession() as session:
        # A usage report cannot be made without the store.
        async with session.get(gw.url + "/v1/usage") as response:
            status = response.status
            retry_after = response.headers["Retry-After"]
            code = (await response.json())["error"]["code"]
        # The replica stays ready, saying what its store does.
        async with session.get(gw.url + "/health/ready") as response:
            assert response.status == 200
            assert (await response.json())["store"] in ("spooling", "unavailable")
    assert code == "store_unavailable"

    # Every status the docs give `store_unavailable`: a table row's status, or the one written
    # just before it (`503 store_unavailable`, `503` with code `store_unavailable`).
    statuses = []
    for path, before, _ in mentions(code):
        given = re.match(r"\| (\d{3}) \|", before) or re.search(
            r"(\d{3})`?,? (?:with code )?`?$", before
        )
        if given:
            statuses.append((path.name, int(given.group(1))))
    assert {name for name, _ in statuses} >= {"api.md", "operations.md", "README.md"}
    assert {s for _, s in statuses} == {status}, statuses

    # And every `Retry-After` they give it.
    waits = []
    for path, _, after in mentions(code):
        given = re.match(r"`?,? (?:with `Retry-After: (\d+)`|\((\d+) s\))", after)
        if given:
            waits.append((path.name, given.group(1) or given.group(2)))
    assert {name for name, _ in waits} >= {"api.md"}
    assert {w for _, w in waits} == {retry_after}, waits


# --- /health/ready ------------------------------------------------------------------------------


def ready_store_states() -> set[str]:
    """Every value the ready handler can put in its answer's `"store"`: the string constants of
    the expressions it gives that key, and of what it assigns to a name it gives it."""
    tree = ast.parse(inspect.getsource(system.ready))

    def strings(node: ast.AST) -> set[str]:
        return {
            n.value
            for n in ast.walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }

    assigned: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    assigned.setdefault(target.id, set()).update(strings(node.value))
    states: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == "store":
                    states |= strings(value)
                    if isinstance(value, ast.Name):
                        states |= assigned[value.id]
    return states


async def test_health_ready_reports_the_store_states_the_docs_list(gw: GatewayUnderTest) -> None:
    states = ready_store_states()
    assert "ok" in states and len(states) >= 3
    api = next(
        line for line in read("docs/api.md").splitlines() if line.startswith("| `GET /health/live`")
    )
    api_states = set(re.findall(r"`(\w+)`", api.split('`"store"`:', 1)[1].split(";")[0]))
    assert api_states == states
    operations = section(read("docs/operations.md"), "## Running several replicas")
    health = bullet(operations, "**Health.**")
    assert set(re.findall(r'`(?:"store": )?"(\w+)"`', health)) == states
    deploy = bullet(read("deploy/README.md"), "`GET /health/live`")
    assert set(re.findall(r'`(?:"store": )?"(\w+)"`', deploy)) <= states

    # The documented answers, from a live gateway: 200 with its store's state, 503 once it
    # begins to shut down.
    async with aiohttp.ClientSession() as session:
        async with session.get(gw.url + "/health/ready") as response:
            assert response.status == 200
            assert (await response.json())["store"] == "ok"
        gw.app[GATEWAY].state["shutting_down"] = True
        try:
            async with session.get(gw.url + "/health/ready") as response:
                assert response.status == 503
        finally:
            gw.app[GATEWAY].state["shutting_down"] = False
    # A store outage keeps the replica ready: no 503 is documented for it.
    for text in (health, deploy, api):
        assert re.search(r"`503` only while shutting down,? or", text), text


# --- limits shared through Redis ----------------------------------------------------------------

# For each limit, a value that lets one admission of TOKENS tokens costing COST through and
# refuses the next one that sees it.
TIGHT: dict[str, Any] = {
    "rpm": 1,
    "tpm": 10,
    "max_concurrent": 1,
    "budget": {"usd": 1.5, "period": "total", "mode": "hard"},
}
TOKENS, COST = 10, 1.0


async def _no_spend(kind: str, ident: str, since: float) -> float:
    return 0.0


async def shared_between(first: Limiter, second: Limiter, field: str) -> bool:
    """Whether an admission on `first` counts against the same key on `second`."""
    scopes = [
        (
            "key",
            f"claims-{field}-{os.urandom(4).hex()}",
            Limits.model_validate({field: TIGHT[field]}),
        )
    ]
    held = await first.admit(scopes, TOKENS, COST)
    try:
        other = await second.admit(scopes, TOKENS, COST)
    except LimitExceeded:
        return True
    finally:
        held.release()
    other.release()
    return False


async def test_the_limits_documented_as_shared_are_the_ones_shared(
    redis_url: str, redis_prefix: str, tmp_path: Path
) -> None:
    # `end_user` is no counter of its own: it holds these same limits for each end user,
    # each a scope of its own (tests/metering/test_end_user_limits.py).
    fields = set(Limits.model_fields) - {"end_user"}
    assert fields == set(TIGHT), "a new limit needs a TIGHT value here"
    replicas = [RedisLimiter(redis_url, _no_spend, prefix=redis_prefix) for _ in range(2)]
    try:
        in_redis = {f for f in fields if await shared_between(*replicas, f)}
    finally:
        for limiter in replicas:
            await limiter.close()
    supervisor = LimitServer(str(tmp_path / "limits.sock"))
    await supervisor.start()
    workers = [SharedLimiter(supervisor.path, _no_spend) for _ in range(2)]
    try:
        by_workers = {f for f in fields if await shared_between(*workers, f)}
    finally:
        for worker in workers:
            await worker.close()
        await supervisor.close()
    # The probe can tell: two in-process limiters share nothing, one refuses its own second.
    alone = Limiter(_no_spend)
    assert not any(
        [await shared_between(Limiter(_no_spend), Limiter(_no_spend), f) for f in fields]
    )
    assert all([await shared_between(alone, alone, f) for f in fields])

    limits = section(read("docs/operations.md"), "## Rate limits and budgets")
    # The limits the section describes, one bullet each ("- `rpm`, `tpm`: ...").
    bullets = re.findall(r"(?m)^- `(\w+)`(?:, `(\w+)`)?:", limits)
    documented = {name for names in bullets for name in names if name}
    assert documented == fields | {"end_user"}
    # "Without `limits.redis_url` these counters live ... for `serve --workers N` in its
    # supervisor, shared by the workers": every one of them.
    assert by_workers == fields
    claim = bullet(limits, "Without `limits.redis_url`")
    assert "for `serve --workers N` in its supervisor, shared by the workers" in claim
    kept = claim.split("With it,", 1)[1].split("are kept in Redis", 1)[0]
    assert set(re.findall(r"`(\w+)`", kept)) == in_redis


# --- the Redis error metric ---------------------------------------------------------------------


def redis_operations() -> set[str]:
    """The `operation` labels the code counts Redis failures under: the string given to
    `REDIS_ERRORS.labels(...)` or to the helpers that call it."""
    helpers = {"labels", "_lost", "_failed", "_spawn"}
    found: set[str] = set()
    for module in (redis_limits, cooldowns, cancel_bus):
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in helpers
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                found.add(node.args[0].value)
    return found


def test_the_redis_error_operations_documented_are_the_ones_counted() -> None:
    metrics = section(read("docs/operations.md"), "## Metrics")
    row = next(
        line for line in metrics.splitlines() if line.startswith("| `gateway_redis_errors_total`")
    )
    documented = set(re.findall(r"`(\w+)`", row.split("|")[3]))
    assert documented == redis_operations()
    assert {"admit", "probe", "cooldown_poll"} <= documented
