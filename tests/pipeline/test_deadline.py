"""An attempt's Deadline (gateway.pipeline.deadline): moving it later costs no timer work, and
the timeout it guards expires once the time last set has passed, and only then.

The timer handle's own firing is driven by hand here (`_fire`, what the loop would call at
`_wake_at`), so no test waits on the clock except the last, which lets a real one run out.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.pipeline.deadline import Deadline


async def guarded() -> tuple[Deadline, asyncio.Task[None]]:
    """A task waiting forever inside `asyncio.timeout(None)`, and a Deadline on that timeout."""
    ready: asyncio.Future[Deadline] = asyncio.Future()

    async def wait() -> None:
        async with asyncio.timeout(None) as timeout:
            ready.set_result(Deadline(timeout, asyncio.get_running_loop()))
            await asyncio.Event().wait()

    task = asyncio.ensure_future(wait())
    return await ready, task


async def test_moving_the_deadline_later_keeps_the_one_timer_it_has() -> None:
    deadline, task = await guarded()
    now = asyncio.get_running_loop().time()
    deadline.set(now + 10)
    handle = deadline._handle
    for step in range(1, 100):  # a chunk after each other: the idle deadline moves on
        deadline.set(now + 10 + step)
    assert deadline._handle is handle and deadline._wake_at == now + 10
    assert deadline.when == now + 109
    deadline.set(None)  # a write to a slow client: no deadline meanwhile
    assert deadline._handle is handle
    deadline.close()
    task.cancel()


async def test_when_its_timer_fires_early_it_moves_to_the_deadline_as_it_stands() -> None:
    deadline, task = await guarded()
    now = asyncio.get_running_loop().time()
    deadline.set(now + 10)
    deadline.set(now + 30)
    deadline._fire()  # at now + 10, the deadline being now + 30
    assert deadline._wake_at == now + 30 and deadline._handle is not None
    assert deadline.timeout.when() is None and not task.done()
    deadline.close()
    task.cancel()


async def test_an_earlier_deadline_rearms_the_timer() -> None:
    deadline, task = await guarded()
    now = asyncio.get_running_loop().time()
    deadline.set(now + 30)
    deadline.set(now + 5)  # the total deadline comes before the idle one would
    assert deadline._wake_at == now + 5
    deadline.close()
    task.cancel()


async def test_no_deadline_when_the_timer_fires_then_the_next_set_arms_one() -> None:
    deadline, task = await guarded()
    now = asyncio.get_running_loop().time()
    deadline.set(now + 10)
    deadline.set(None)
    deadline._fire()
    assert deadline._handle is None and not task.done()
    deadline.set(now + 20)
    assert deadline._handle is not None and deadline._wake_at == now + 20
    deadline.close()
    task.cancel()


async def test_a_passed_deadline_expires_the_timeout() -> None:
    deadline, task = await guarded()
    deadline.set(asyncio.get_running_loop().time() - 1)
    deadline._fire()
    with pytest.raises(TimeoutError):
        await task
    assert deadline.timeout.expired()


async def test_expire_ends_the_wait_whatever_the_deadline() -> None:
    deadline, task = await guarded()
    deadline.set(asyncio.get_running_loop().time() + 3600)
    deadline.expire()  # an explicit cancel from another connection
    with pytest.raises(TimeoutError):
        await task
    deadline.close()


async def test_a_real_deadline_runs_out_after_its_last_move_and_not_before() -> None:
    loop = asyncio.get_running_loop()

    async def keep_moving(deadline: Deadline) -> None:
        for _ in range(5):  # five chunks 10 ms apart, each moving the deadline 50 ms on
            deadline.set(loop.time() + 0.05)
            await asyncio.sleep(0.01)

    with pytest.raises(TimeoutError):
        async with asyncio.timeout(None) as timeout:
            deadline = Deadline(timeout, loop)
            mover = asyncio.ensure_future(keep_moving(deadline))
            await asyncio.Event().wait()
    expired_at = loop.time()
    mover.cancel()
    deadline.close()
    assert deadline.when is not None and expired_at >= deadline.when
