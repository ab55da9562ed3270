"""gateway/core/tasks.py: background loops that stop even when a library swallowed the cancel."""

from __future__ import annotations

import asyncio
import contextlib

from gateway.core.tasks import cancel_and_wait, stop_requested


async def _swallows_one_cancel(log: list[str]) -> None:
    """Like redis-py's cluster pub/sub listen(): the first cancel is caught and it waits on."""
    try:
        await asyncio.sleep(30)
    except asyncio.CancelledError:
        log.append(f"swallowed, stop_requested={stop_requested()}")
    await asyncio.sleep(30)


async def test_a_swallowed_cancel_is_repeated_until_the_task_ends() -> None:
    log: list[str] = []
    task = asyncio.create_task(_swallows_one_cancel(log))
    await asyncio.sleep(0)
    left = await cancel_and_wait([task], within_s=2.0)
    assert left == set() and task.cancelled()
    assert log == ["swallowed, stop_requested=True"]


async def test_a_task_that_never_ends_is_returned_after_the_bound() -> None:
    give_up = asyncio.Event()

    async def stubborn() -> None:
        while not give_up.is_set():
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    start = loop.time()
    left = await cancel_and_wait([task], within_s=0.3)
    assert left == {task} and 0.25 <= loop.time() - start < 1.5
    give_up.set()
    task.cancel()
    await asyncio.wait_for(task, 1.0)


async def test_a_loop_checking_stop_requested_ends_after_a_swallowed_cancel() -> None:
    rounds: list[int] = []

    async def loop_like_the_stores() -> None:
        while not stop_requested():
            with contextlib.suppress(asyncio.CancelledError):  # what a library does to us
                await asyncio.sleep(0.01)
            rounds.append(1)

    task = asyncio.create_task(loop_like_the_stores())
    await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.wait_for(task, 1.0)  # ends by itself, no second cancel needed
    assert task.done() and not task.cancelled() and rounds


async def test_nothing_to_stop() -> None:
    assert await cancel_and_wait([], within_s=1.0) == set()
    done = asyncio.create_task(asyncio.sleep(0))
    await done
    assert await cancel_and_wait([done], within_s=1.0) == set()
