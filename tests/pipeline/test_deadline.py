"""An attempt's Deadline (gateway.pipeline.deadline): a number that costs no timer work to move;
the loop's one Watchdog cancels the attempt's task once the time last set has passed, and only
then; the attempt tells its own deadline's cancellation from anyone else's.

The watchdog's tick is driven by hand here (`_tick`, what its timer calls), so no test waits on
the clock except the last, which lets a real one run out.
"""

from __future__ import annotations

import asyncio

import pytest

from gateway.pipeline.deadline import TICK_S, Deadline, Watchdog, watchdog


async def guarded(dog: Watchdog) -> tuple[Deadline, asyncio.Task[str]]:
    """A task waiting forever as an attempt does, under a deadline: it says how it ended (a
    timeout is a cancellation its deadline takes back)."""
    ready: asyncio.Future[Deadline] = asyncio.Future()

    async def attempt() -> str:
        deadline = dog.watch(asyncio.current_task())  # type: ignore[arg-type]
        ready.set_result(deadline)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if deadline.took_back():
                return "timed out"
            raise
        finally:
            deadline.close()
        return "never"

    task = asyncio.ensure_future(attempt())
    return await ready, task


async def test_moving_deadlines_touches_no_timer_and_one_timer_serves_them_all() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    first, one = await guarded(dog)
    handle = dog._handle
    second, two = await guarded(dog)
    now = dog.loop.time()
    for step in range(100):  # a chunk after another: the idle deadline moves on
        first.set(now + 10 + step)
        second.set(now + 20 + step)
    second.set(None)  # a write to a slow client: no deadline meanwhile
    assert dog._handle is handle and handle is not None and dog.watching() == 2
    one.cancel()
    two.cancel()
    await asyncio.gather(one, two, return_exceptions=True)
    assert dog.watching() == 0


async def test_a_passed_deadline_cancels_its_task_which_reads_it_as_a_timeout() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    passed, late = await guarded(dog)
    kept, waiting = await guarded(dog)
    passed.set(dog.loop.time() - 1)
    kept.set(dog.loop.time() + 3600)
    dog._tick()
    assert await late == "timed out"
    assert not waiting.done() and dog.watching() == 1
    waiting.cancel()


async def test_the_watchdog_wakes_for_a_deadline_before_its_tick_and_sleeps_when_idle() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    deadline, task = await guarded(dog)
    soon = dog.loop.time() + TICK_S / 5
    deadline.set(soon)
    dog._tick()
    assert dog._handle is not None and dog._handle.when() == soon
    deadline.set(None)
    dog._tick()  # no deadline now: it keeps watching at its own pace
    assert dog._handle is not None and not task.done()
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert dog._handle is not None
    dog._handle.cancel()
    dog._tick()  # nothing under way: no timer left behind
    assert dog._handle is None


async def test_expire_cancels_now_whatever_the_deadline_and_only_once() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    deadline, task = await guarded(dog)
    deadline.set(dog.loop.time() + 3600)
    deadline.expire()  # an explicit cancel from another connection
    deadline.expire()  # and the watchdog finding it passed: still one cancel request
    assert await task == "timed out"


async def test_a_cancel_from_anyone_else_is_not_taken_for_the_deadline() -> None:
    dog = Watchdog(asyncio.get_running_loop())
    deadline, task = await guarded(dog)
    deadline.expire()
    task.cancel()  # the client went away as well: the server cancels the handler
    with pytest.raises(asyncio.CancelledError):
        await task
    alone, other = await guarded(dog)
    other.cancel()  # only the client: the deadline never expired
    with pytest.raises(asyncio.CancelledError):
        await other
    assert not alone.expired


async def test_each_loop_has_its_own_watchdog() -> None:
    loop = asyncio.get_running_loop()
    assert watchdog(loop) is watchdog(loop)
    other = asyncio.new_event_loop()
    try:
        assert watchdog(other).loop is other
    finally:
        other.close()
    assert watchdog(loop).loop is loop


async def test_a_real_deadline_runs_out_after_its_last_move_and_not_before() -> None:
    loop = asyncio.get_running_loop()
    dog = watchdog(loop)
    deadline, task = await guarded(dog)

    async def keep_moving() -> None:
        for _ in range(5):  # five chunks 10 ms apart, each moving the deadline 50 ms on
            deadline.set(loop.time() + 0.05)
            await asyncio.sleep(0.01)

    await keep_moving()
    assert await task == "timed out"
    expired_at = loop.time()
    assert deadline.when is not None and expired_at >= deadline.when
