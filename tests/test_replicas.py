"""Two gateway processes on one PostgreSQL and one Redis, as replicas behind a load balancer:
a conversation goes on across them, limits and budgets hold across them (and each replica
enforces them alone while Redis is down), and what one recorded the other reads."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from tests.conftest import MakeUpstream
from tests.fakes import USAGE, FakeUpstream, completion
from tests.postgres_server import PostgresServer
from tests.redis_server import RedisServer
from tests.test_cli import free_port

MASTER = "replica-test-master-key"
HELLO = [{"role": "user", "content": "hello"}]


class Replica:
    def __init__(self, process: asyncio.subprocess.Process, port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"

    def client(self, key: str) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0)

    async def call(self, method: str, path: str, body: Any = None, key: str = MASTER) -> Any:
        headers = {"Authorization": f"Bearer {key}"}
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, self.url + path, json=body, headers=headers) as response,
        ):
            assert response.status < 300, await response.text()
            return await response.json()

    async def metrics(self) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.url + "/metrics") as response,
        ):
            text = await response.text()
        return {
            (sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    async def logged(self, text: str, timeout: float = 20) -> None:
        """Wait until the replica logs a line holding `text`."""
        assert self.process.stderr is not None
        async with asyncio.timeout(timeout):
            while text.encode() not in (line := await self.process.stderr.readline()):
                assert line, f"the replica exited before logging {text!r}"


StartReplicas = Callable[..., Awaitable[tuple[Replica, Replica]]]


@pytest.fixture
async def replicas(
    postgres: PostgresServer, redis_url: str, tmp_path: Path
) -> AsyncIterator[StartReplicas]:
    started: list[Replica] = []
    database = postgres.create_database()
    prefix = f"rep{os.urandom(4).hex()}:"

    async def start(upstream: FakeUpstream, redis: str = redis_url) -> tuple[Replica, Replica]:
        async def one(n: int) -> Replica:
            port = free_port()
            config = tmp_path / f"replica{n}.yaml"
            config.write_text(
                json.dumps(
                    {
                        "store": {"url": database, "spool_path": str(tmp_path / f"spool{n}")},
                        "limits": {"redis_url": redis, "redis_prefix": prefix},
                        "auth": {"master_key": MASTER},
                        "models": [
                            {
                                "name": "fake",
                                "retry": {"max_attempts": 1},
                                "deployments": [
                                    {
                                        "provider": "openai",
                                        "model": "fake-model",
                                        "api_base": upstream.url,
                                        "api_key": "sk-up",
                                        # 1 USD per token: budgets in round numbers.
                                        "input_cost_per_mtok": 1_000_000,
                                        "output_cost_per_mtok": 1_000_000,
                                    }
                                ],
                            },
                            {
                                "name": "demo",
                                "deployments": [{"provider": "demo", "chunk_delay_ms": 30}],
                            },
                        ],
                    }
                )
            )
            process = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "gateway", "serve", "--config", str(config),
                "--port", str(port),
                stderr=asyncio.subprocess.PIPE,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )  # fmt: skip
            assert process.stderr is not None
            async with asyncio.timeout(60):
                while b"listening on" not in (line := await process.stderr.readline()):
                    assert line, "the replica exited before listening"
            replica = Replica(process, port)
            started.append(replica)
            return replica

        a, b = await asyncio.gather(one(1), one(2))
        return a, b

    yield start
    for replica in started:
        replica.process.terminate()
        await replica.process.wait()
        assert replica.process.returncode == 0


async def team_key(replica: Replica, limits: dict[str, Any] | None = None) -> str:
    team = f"team-{os.urandom(3).hex()}"
    await replica.call("POST", "/v1/gateway/teams", {"id": team, "name": team})
    body: dict[str, Any] = {"team_id": team}
    if limits:
        body["limits"] = limits
    return str((await replica.call("POST", "/v1/gateway/keys", body))["key"])


async def test_a_conversation_begun_on_one_replica_continues_on_the_other(
    replicas: StartReplicas, make_upstream: MakeUpstream
) -> None:
    upstream = await make_upstream()
    a, b = await replicas(upstream)
    key = await team_key(a)
    upstream.push(completion("first answer"), completion("second answer"))
    first = await a.client(key).chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "user", "content": "q1"}]
    )
    conversation = first.headers["X-Conversation-Id"]
    second = await b.client(key).chat.completions.with_raw_response.create(
        model="fake",
        messages=[
            {"role": "user", "content": "q1"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "q2"},
        ],
        extra_headers={"X-Conversation-Id": conversation},
    )
    assert second.headers["X-Conversation-Id"] == conversation  # the same one, not a branch
    assert [m["content"] for m in upstream.requests[-1]["messages"]] == [
        "q1",
        "first answer",
        "q2",
    ]
    history = await a.call("GET", f"/v1/conversations/{conversation}/messages", key=key)
    assert [m["content"] for m in history["data"]] == ["q1", "first answer", "q2", "second answer"]

    # The Responses API: previous_response_id made on A, continued on B.
    upstream.push(completion("third answer"), completion("fourth answer"))
    one = await a.client(key).responses.create(model="fake", input="q3")
    two = await b.client(key).responses.create(
        model="fake", input="q4", previous_response_id=one.id
    )
    assert two.output_text == "fourth answer"
    assert [m["content"] for m in upstream.requests[-1]["messages"]] == [
        "q3",
        "third answer",
        "q4",
    ]


async def test_an_rpm_limit_and_a_hard_budget_hold_across_replicas(
    replicas: StartReplicas, make_upstream: MakeUpstream
) -> None:
    upstream = await make_upstream()
    a, b = await replicas(upstream)
    limited = await team_key(a, {"rpm": 4})
    outcomes = []
    for n in range(6):
        try:
            await (
                (a, b)[n % 2].client(limited).chat.completions.create(model="demo", messages=HELLO)
            )
            outcomes.append(200)
        except openai.RateLimitError as error:
            outcomes.append(error.status_code)
    assert outcomes == [200, 200, 200, 200, 429, 429]

    per_request = USAGE["prompt_tokens"] + USAGE["completion_tokens"]  # USD, at 1 USD a token
    budget = per_request * 2.5
    spender = await team_key(b, {"budget": {"usd": budget, "period": "total", "mode": "hard"}})
    upstream.push(*[completion("ok")] * 6)
    spent_on: list[int] = []
    refused = None
    for n in range(6):
        try:
            await (
                (a, b)[n % 2]
                .client(spender)
                .chat.completions.create(
                    model="fake", messages=HELLO, max_tokens=USAGE["completion_tokens"]
                )
            )
            spent_on.append(n % 2)
        except openai.RateLimitError as error:
            refused = error
            break
    assert refused is not None and refused.code == "budget_exceeded"
    assert len(spent_on) <= 3 and set(spent_on) == {0, 1}  # both replicas spent from it
    for replica in (a, b):  # and now both refuse it
        with pytest.raises(openai.RateLimitError, match="budget"):
            await replica.client(spender).chat.completions.create(
                model="fake", messages=HELLO, max_tokens=USAGE["completion_tokens"]
            )


async def test_what_one_replica_recorded_of_a_cancelled_stream_the_other_reads(
    replicas: StartReplicas, make_upstream: MakeUpstream
) -> None:
    upstream = await make_upstream()
    a, b = await replicas(upstream)
    key = await team_key(a)
    received = ""
    stream = await a.client(key).chat.completions.with_raw_response.create(
        model="demo", messages=HELLO, stream=True
    )
    conversation = stream.headers["X-Conversation-Id"]
    chunks = 0
    async for chunk in stream.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            received += chunk.choices[0].delta.content
            chunks += 1
            if chunks == 3:
                break
    await stream.parse().close()  # the client leaves mid-answer

    async with asyncio.timeout(20):  # until B sees the turn recorded by A
        while True:
            events = (await b.call("GET", f"/v1/conversations/{conversation}/events", key=key))[
                "data"
            ]
            if any(e["type"] == "turn/end" for e in events):
                break
            await asyncio.sleep(0.05)
    message = next(e for e in events if e["type"] == "assistant/message")["payload"]
    assert message["interrupted"] is True
    assert message["content"][0]["text"] == received
    history = await b.call("GET", f"/v1/conversations/{conversation}/messages", key=key)
    assert history["data"][-1] == {"role": "assistant", "content": received}


async def listening(redis: Redis, prefix: str, replicas: int) -> None:
    """Until `replicas` replicas listen for cancels."""
    async with asyncio.timeout(20):
        while (await redis.pubsub_numsub(f"{prefix}cancel"))[0][1] < replicas:
            await asyncio.sleep(0.05)


async def both_listening(redis_url: str, prefix: str) -> None:
    """Until both replicas listen for cancels."""
    redis = Redis.from_url(redis_url)
    try:
        await listening(redis, prefix, 2)
    finally:
        await redis.aclose()


async def stalling_replicas(
    replicas: StartReplicas, make_upstream: MakeUpstream, tmp_path: Path
) -> tuple[Replica, Replica, str, str]:
    """Two replicas whose upstream stalls after "Hello there ", a team key, the Redis prefix."""
    upstream = await make_upstream()
    upstream.stall_after(["Hello ", "there "])
    a, b = await replicas(upstream)
    key = await team_key(a)
    prefix = json.loads((tmp_path / "replica1.yaml").read_text())["limits"]["redis_prefix"]
    return a, b, key, prefix


async def kept_interrupted(replica: Replica, key: str, conversation: str, received: str) -> None:
    """The conversation's answer is recorded interrupted, holding exactly what was received."""
    events = await replica.call("GET", f"/v1/conversations/{conversation}/events", key=key)
    message = next(e for e in events["data"] if e["type"] == "assistant/message")["payload"]
    assert message["interrupted"] is True
    assert message["content"][0]["text"] == received


async def stalled_stream(replica: Replica, key: str) -> tuple[str, str, str, Any]:
    """A stream on `replica` whose upstream stalled after "Hello there ": its conversation and
    turn ids, the text received, and the rest of the stream."""
    stream = await replica.client(key).chat.completions.with_raw_response.create(
        model="fake", messages=HELLO, stream=True
    )
    received = ""
    chunks = stream.parse()
    async for chunk in chunks:
        if chunk.choices and chunk.choices[0].delta.content:
            received += chunk.choices[0].delta.content
        if received == "Hello there ":
            break
    return (
        stream.headers["X-Conversation-Id"],
        stream.headers["X-Gateway-Turn-Id"],
        received,
        chunks,
    )


async def test_a_cancel_landing_on_the_other_replica_stops_the_turn(
    replicas: StartReplicas, make_upstream: MakeUpstream, redis_url: str, tmp_path: Path
) -> None:
    """The admin UI's Stop button lands on either replica: the one that does not run the turn
    passes the cancel on through Redis, and answers once the turn has ended."""
    a, b, key, prefix = await stalling_replicas(replicas, make_upstream, tmp_path)
    await both_listening(redis_url, prefix)
    conversation, turn, received, chunks = await stalled_stream(a, key)
    path = f"/v1/conversations/{conversation}/turns/{turn}/cancel"
    cancelled = await b.call("POST", path, key=key)
    assert cancelled["status"] == "interrupted"
    async for _ in chunks:  # the client's stream ends
        pass
    await kept_interrupted(b, key, conversation, received)
    # Ended: a second cancel, on either replica, says so.
    for replica in (a, b):
        async with (
            aiohttp.ClientSession() as session,
            session.post(replica.url + path, headers={"Authorization": f"Bearer {key}"}) as r,
        ):
            assert r.status == 409, await r.text()


async def test_a_chat_cancel_by_request_id_on_the_other_replica_stops_the_stream(
    replicas: StartReplicas, make_upstream: MakeUpstream, redis_url: str, tmp_path: Path
) -> None:
    """`POST /v1/chat/completions/{request_id}/cancel` is the same cancel: sent to the replica
    that does not run the stream, it stops it, and the record keeps what the client got."""
    a, b, key, prefix = await stalling_replicas(replicas, make_upstream, tmp_path)
    await both_listening(redis_url, prefix)
    stream = await a.client(key).chat.completions.with_raw_response.create(
        model="fake", messages=HELLO, stream=True, extra_headers={"X-Request-Id": "stop-me-1"}
    )
    received, finish = "", None
    chunks = stream.parse()
    async for chunk in chunks:
        received += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        if received == "Hello there ":
            break
    cancelled = await b.call("POST", "/v1/chat/completions/stop-me-1/cancel", key=key)
    assert cancelled == {
        "id": "stop-me-1",
        "object": "chat.completion.cancellation",
        "status": "cancelled",
    }
    async for chunk in chunks:  # the stream ends, as a cancel on its own replica ends it
        if chunk.choices and chunk.choices[0].finish_reason:
            finish = chunk.choices[0].finish_reason
    assert finish == "cancelled"
    await kept_interrupted(b, key, stream.headers["X-Conversation-Id"], received)


async def test_a_response_cancel_on_the_other_replica_stops_the_response(
    replicas: StartReplicas, make_upstream: MakeUpstream, redis_url: str, tmp_path: Path
) -> None:
    """`POST /v1/responses/{id}/cancel` likewise, whichever replica it lands on."""
    a, b, key, prefix = await stalling_replicas(replicas, make_upstream, tmp_path)
    await both_listening(redis_url, prefix)
    events = await a.client(key).responses.create(model="fake", input="hello", stream=True)
    response_id, received = None, ""
    async for event in events:
        if event.type == "response.created":
            response_id = event.response.id
        elif event.type == "response.output_text.delta":
            received += event.delta
        if received == "Hello there ":
            break
    assert response_id is not None
    cancelled = await b.call("POST", f"/v1/responses/{response_id}/cancel", key=key)
    assert (cancelled["id"], cancelled["status"]) == (response_id, "cancelled")
    async for _ in events:  # the response's stream ends
        pass


async def test_a_cancel_sent_while_the_runner_was_not_listening_still_stops_the_turn(
    replicas: StartReplicas, make_upstream: MakeUpstream, redis_url: str, tmp_path: Path
) -> None:
    """Pub/sub drops a message no one is subscribed to hear: the cancel also waits in Redis,
    and the replica running the turn finds it when it listens again."""
    a, b, key, prefix = await stalling_replicas(replicas, make_upstream, tmp_path)
    redis = Redis.from_url(redis_url)
    try:
        await listening(redis, prefix, 2)
        conversation, turn, received, chunks = await stalled_stream(a, key)
        # No replica can listen: subscribing is refused, and the listeners are cut off.
        await redis.acl_setuser("default", enabled=True, commands=["-subscribe"])
        try:
            await redis.client_kill_filter(_type="pubsub")
            assert (await redis.pubsub_numsub(f"{prefix}cancel"))[0][1] == 0
            path = f"/v1/conversations/{conversation}/turns/{turn}/cancel"
            cancel = asyncio.create_task(b.call("POST", path, key=key))
            async with asyncio.timeout(10):  # published (to no one) and left waiting
                while not await redis.exists(f"{prefix}cancel:{turn}"):
                    await asyncio.sleep(0.02)
        finally:
            await redis.acl_setuser("default", enabled=True, commands=["+subscribe"])
        cancelled = await cancel
    finally:
        await redis.aclose()
    assert cancelled["status"] == "interrupted"
    await a.logged("sent while this replica was not listening")
    async for _ in chunks:
        pass
    await kept_interrupted(b, key, conversation, received)


async def outcomes(calls: list[tuple[Replica, str]]) -> list[int]:
    """Each completion's status, in order; anything but 200 or 429 fails the test."""
    statuses = []
    for replica, key in calls:
        try:
            await replica.client(key).chat.completions.create(model="fake", messages=HELLO)
            statuses.append(200)
        except openai.RateLimitError as error:
            statuses.append(error.status_code)
    return statuses


def counted(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    return metrics.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_a_redis_outage_leaves_each_replica_its_own_limits_until_redis_returns(
    replicas: StartReplicas,
    make_upstream: MakeUpstream,
    start_redis: Callable[[int | None], RedisServer],
) -> None:
    redis = start_redis(None)
    upstream = await make_upstream()
    upstream.push(*[completion("ok")] * 12)  # one for each request admitted below
    a, b = await replicas(upstream, redis.url)
    key = await team_key(a, {"rpm": 3})
    # Shared: three requests a minute between both replicas.
    assert await outcomes([(a, key), (b, key), (a, key), (b, key)]) == [200, 200, 200, 429]

    redis.stop()
    # Every request is answered (no 5xx), and each replica holds the key to its RPM alone, as
    # docs/operations.md says: twice the limit across the two.
    during = await outcomes([(a, key)] * 4 + [(b, key)] * 4)
    assert during == [200, 200, 200, 429, 200, 200, 200, 429]
    for replica in (a, b):
        await replica.logged("rate limits and budgets fall back")
    async with asyncio.timeout(20):  # until each replica's probe has found Redis still away
        while not all(
            counted(m, "gateway_redis_errors_total", operation="probe") >= 1
            for m in [await a.metrics(), await b.metrics()]
        ):
            await asyncio.sleep(0.1)
    for replica in (a, b):
        metrics = await replica.metrics()
        assert counted(metrics, "gateway_limit_local_fallbacks_total") == 4
        assert counted(metrics, "gateway_redis_errors_total", operation="admit") >= 1

    start_redis(redis.port)  # the same address, empty: nothing was persisted
    for replica in (a, b):
        await replica.logged("rate limits and budgets are shared again")
    # Shared again: the limit holds across both replicas from Redis's own (new) window, and no
    # admission falls back any more.
    assert await outcomes([(b, key), (a, key), (b, key), (a, key), (b, key)]) == [
        200,
        200,
        200,
        429,
        429,
    ]
    for replica in (a, b):
        assert counted(await replica.metrics(), "gateway_limit_local_fallbacks_total") == 4
