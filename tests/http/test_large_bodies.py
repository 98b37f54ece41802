"""Large request bodies: parsed off the event loop, a few at a time per key, so that one team's
flood of them stalls neither another team's completions nor `/health/live`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import orjson
import pytest

from gateway.lanes import KeyLanes
from tests.conftest import MakeGateway
from tests.fakes import DONE, FakeUpstream, chunk, paused
from tests.floods import live, two_teams, while_flooding

BIG_MB = 12  # within server.max_body_mb (16)
FLOOD = 4


def big_body() -> bytes:
    words = " ".join(f"word{i % 5000}" for i in range(BIG_MB * 1_000_000 // 9))
    question = {"role": "user", "content": words}
    return orjson.dumps({"model": "fake", "stream": True, "messages": [question]})


async def test_a_flood_of_large_bodies_stalls_no_other_team(
    tmp_path: Path, upstream: FakeUpstream
) -> None:
    deployment = orjson.dumps(upstream.deployment()).decode()
    config = (
        f"store: {{url: 'sqlite:///{tmp_path}/gw.db'}}\n"
        f"models: [{{name: fake, deployments: [{deployment}]}}]\n"
    )
    body = big_body()
    async with two_teams(tmp_path, config) as teams:

        async def large() -> int:
            async with teams.session.post(
                teams.url + "/v1/chat/completions",
                data=body,
                headers={**teams.headers("a"), "Content-Type": "application/json"},
            ) as response:
                await response.read()
                return response.status

        async def other_team() -> None:
            async with teams.session.post(
                teams.url + "/v1/chat/completions",
                json={
                    "model": "fake",
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                },
                headers=teams.headers("b"),
            ) as response:
                assert response.status == 200
                await response.read()

        statuses, seen = await while_flooding(
            [large() for _ in range(FLOOD)], {"other": other_team, "live": live(teams)}
        )
    assert statuses == [200] * FLOOD
    # Unloaded, each takes milliseconds; with the bodies parsed on the loop, all four at
    # once, another team's median was over a second and /health/live stalled near one. What
    # is left is the work that follows a parse, in the body's size, one body of a key's at a
    # time: a loaded machine's margin over it.
    assert seen.median("other") < 0.25, seen.times
    assert seen.median("live") < 0.1, seen.times
    assert seen.worst("live") < 1.0, seen.times


async def test_a_keys_lane_lets_its_width_through_and_the_rest_wait_in_order() -> None:
    lanes = KeyLanes()
    order: list[str] = []
    inside = 0
    most = 0
    gate = asyncio.Event()

    async def work(key: str, name: str) -> None:
        nonlocal inside, most
        async with lanes.hold(key, 2):
            inside += 1
            most = max(most, inside)
            order.append(name)
            await gate.wait()
            inside -= 1

    tasks = [asyncio.ensure_future(work("a", f"a{i}")) for i in range(5)]
    tasks.append(asyncio.ensure_future(work("b", "b0")))
    await asyncio.sleep(0)
    assert sorted(order) == ["a0", "a1", "b0"]  # key b is not behind key a's queue
    gate.set()
    await asyncio.gather(*tasks)
    assert order[:2] == ["a0", "a1"] and order[-3:] == ["a2", "a3", "a4"]
    assert most == 3
    assert len(lanes) == 0  # nothing kept for keys with nothing waiting


async def test_a_place_held_past_its_time_lets_the_next_in() -> None:
    lanes = KeyLanes()
    done = asyncio.Event()

    async def long() -> None:
        async with lanes.hold("a", 1, hold_s=0.05):
            await done.wait()

    first = asyncio.ensure_future(long())
    await asyncio.sleep(0)
    async with asyncio.timeout(5), lanes.hold("a", 1):
        pass  # in, while the first still runs
    done.set()
    await first
    assert len(lanes) == 0
    with pytest.raises(TimeoutError):  # and a wait has its own limit
        async with lanes.hold("b", 1), lanes.hold("b", 1, wait_s=0.01):
            pass
    assert len(lanes) == 0


@pytest.mark.parametrize("chunked", [False, True])
async def test_a_large_body_is_answered_and_refused_as_a_small_one(
    make_gateway: MakeGateway, upstream: FakeUpstream, chunked: bool
) -> None:
    gw = await make_gateway(upstream=upstream, server={"large_body_kb": 1})
    question = "x" * 4096
    body = orjson.dumps(
        {"model": "fake", "stream": True, "messages": [{"role": "user", "content": question}]}
    )

    async def post(data: bytes) -> tuple[int, bytes]:
        async def pieces() -> AsyncIterator[bytes]:
            yield data

        async with (
            aiohttp.ClientSession() as session,
            session.post(
                gw.url + "/v1/chat/completions",
                data=pieces() if chunked else data,
                headers={"Content-Type": "application/json"},
            ) as response,
        ):
            return response.status, await response.read()

    status, answer = await post(body)
    assert status == 200 and b"[DONE]" in answer
    assert upstream.requests[-1]["messages"][-1]["content"] == question
    status, answer = await post(body.replace(b'"role":"user"', b'"role":"nobody"'))
    assert status == 400 and orjson.loads(answer)["error"]["param"] == "messages[0].role"


async def test_a_long_answer_leaves_its_keys_lane_while_it_streams(
    make_gateway: MakeGateway, upstream: FakeUpstream
) -> None:
    # A team's agents share a key: its large requests take turns to start, not to stream.
    gw = await make_gateway(
        upstream=upstream, server={"large_body_kb": 1, "large_body_hold_s": 0.5}
    )
    long_question = {"role": "user", "content": "x" * 4096}
    body = {"model": "fake", "stream": True, "messages": [long_question]}
    upstream.push(paused([chunk("first")], [chunk(finish="stop"), DONE]))
    async with aiohttp.ClientSession() as session:
        async with session.post(gw.url + "/v1/chat/completions", json=body) as held:
            assert held.status == 200
            await asyncio.wait_for(upstream.stalled.wait(), 10)
            began = time.monotonic()
            async with session.post(gw.url + "/v1/chat/completions", json=body) as second:
                assert second.status == 200
                assert b"[DONE]" in await asyncio.wait_for(second.read(), 10)
            assert 0.5 <= time.monotonic() - began < 0.5 + 5  # the first's start, no more
            upstream.release.set()
            assert b"[DONE]" in await held.read()
    assert len(gw.gateway.body_lanes) == 0
