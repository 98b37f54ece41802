"""Deployment cooldowns shared through a real Redis: two Routers with a CooldownSync each are
two replicas."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from gateway.config import parse_config
from gateway.metrics import REGISTRY
from gateway.routing.cooldowns import CooldownSync
from gateway.routing.health import DeploymentHealth
from gateway.routing.router import Router
from gateway.upstream.pool import UpstreamPool

BODY = {"messages": [{"role": "user", "content": "Hello"}]}
INTERVAL_S = 0.5  # the default poll interval
# Names of their own: the deployment metrics are process-wide, other tests count theirs.
A, B = "cooldowns-a", "cooldowns-b"


def poll_errors() -> float:
    """Failed cooldown polls of Redis, as /metrics exports them."""
    value = REGISTRY.get_sample_value("gateway_redis_errors_total", {"operation": "cooldown_poll"})
    return value or 0.0


class Replica:
    def __init__(self, router: Router, sync: CooldownSync) -> None:
        self.router = router
        self.sync = sync

    def plan(self) -> list[str]:
        return [d.name for d in self.router.plan(self.router.alias("m"), BODY)]

    def health(self, name: str) -> DeploymentHealth:
        return next(d.health for d in self.router.deployments() if d.name == name)


MakeReplica = Callable[..., Awaitable[Replica]]


@pytest.fixture
async def replica(redis_url: str, redis_prefix: str) -> AsyncIterator[MakeReplica]:
    made: list[Replica] = []

    async def make(
        cooldown_s: float = 1.0, url: str = redis_url, interval_s: float = INTERVAL_S
    ) -> Replica:
        config = parse_config(
            {
                "models": [
                    {
                        "name": "m",
                        "cooldown": {"failures": 2, "window_s": 60, "cooldown_s": cooldown_s},
                        "deployments": [
                            {"provider": "demo", "name": A},
                            {"provider": "demo", "name": B, "priority": 1},
                        ],
                    }
                ]
            }
        ).config
        router = Router(config, UpstreamPool())  # demo deployments never use the pool
        healths = [d.health for d in router.deployments()]
        sync = CooldownSync(url, redis_prefix, healths, interval_s=interval_s)
        sync.start()
        made.append(Replica(router, sync))
        return made[-1]

    yield make
    for one in made:
        await one.sync.close()


async def until(condition: Callable[[], Any], timeout: float) -> float:
    """Seconds until `condition()` holds, checked every 10 ms; fails after `timeout`."""
    started = time.monotonic()
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.01)
    return time.monotonic() - started


async def test_a_deployment_cooling_on_one_replica_is_skipped_by_the_other(
    replica: MakeReplica,
) -> None:
    one, two = await replica(cooldown_s=1.5), await replica(cooldown_s=1.5)
    assert one.plan() == two.plan() == [A, B]
    one.health(A).failed("http_500")
    one.health(A).failed("http_500")
    assert one.plan() == [B]
    waited = await until(lambda: two.plan() == [B], timeout=2 * INTERVAL_S + 0.5)
    assert waited <= INTERVAL_S + 0.25  # within one poll (and the publish's round trip)
    snapshot = two.health(A).snapshot()
    assert snapshot["state"] == "cooling" and 0.5 < snapshot["cooldown_remaining_s"] <= 1.5
    # The cooldown ends on both: one request may probe a again.
    await until(lambda: two.plan() == [A, B], timeout=3)
    assert two.health(A).state == "half_open"
    assert one.plan() == [A, B]


async def test_a_successful_probe_ends_the_cooldown_everywhere(replica: MakeReplica) -> None:
    one, two = await replica(cooldown_s=60), await replica(cooldown_s=60)
    a = one.health(A)
    a.failed("http_500")
    a.failed("http_500")
    await until(lambda: two.plan() == [B], timeout=2)
    # On replica one the cooldown is over (as a minute later) and its probe succeeds.
    assert a.available(now=time.monotonic() + 61) and a.state == "half_open"
    a.acquire()
    a.succeeded(120.0)
    a.release()
    assert one.plan() == [A, B]
    await until(lambda: two.plan() == [A, B], timeout=2)
    assert two.health(A).state == "half_open"  # two probes it once itself


async def test_a_probe_clears_only_the_cooldown_it_knows_of(replica: MakeReplica) -> None:
    one = await replica(cooldown_s=60, interval_s=3600)  # polls once, at its start
    two = await replica(cooldown_s=60)
    a = one.health(A)
    a.failed("http_500")
    a.failed("http_500")
    await until(lambda: two.plan() == [B], timeout=2)
    # Two probes a (as a minute later) and fails: a newer cooldown, which one has not read.
    elsewhere = two.health(A)
    assert elsewhere.available(now=time.monotonic() + 61)
    elsewhere.acquire()
    elsewhere.failed("http_500")
    elsewhere.release()
    await two.sync.flush()
    # One's own probe succeeds: it may end its cooldown, not the one two started since.
    assert a.available(now=time.monotonic() + 61)
    a.acquire()
    a.succeeded(100.0)
    a.release()
    await one.sync.flush()
    assert one.plan() == [A, B]
    three = await replica(cooldown_s=60)
    await until(lambda: three.plan() == [B], timeout=2)


async def test_redis_down_keeps_cooldowns_local(
    replica: MakeReplica, unused_tcp_port: int, caplog: pytest.LogCaptureFixture
) -> None:
    errors = poll_errors()
    with caplog.at_level(logging.WARNING, logger="gateway.routing.cooldowns"):
        # A cooldown that outlasts the polls waited for, however slow the machine.
        one = await replica(url=f"redis://127.0.0.1:{unused_tcp_port}/0", cooldown_s=60.0)
        one.health(A).failed("http_500")
        one.health(A).failed("http_500")
        assert one.plan() == [B]
        await until(lambda: poll_errors() >= errors + 2, timeout=3)
    assert one.plan() == [B]
    warnings = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert len(warnings) == 1
