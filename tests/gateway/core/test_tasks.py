"""gateway/core/tasks.py: background loops that stop even when a library swallowed the cancel. On
virtual time (tests/virtual_time.py): the bound of a stop is asserted to the tick, without a wait."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from gateway.core.tasks import cancel_and_wait, stop_requested
from tests.virtual_time import on_virtual_time


async def _forever() -> None:
    await asyncio.Event().wait()  # a library's wait that only a cancel ends


@on_virtual_time
async def test_a_swallowed_cancel_is_repeated_until_the_task_ends() -> None:
    log: list[str] = []
    waiting = asyncio.Event()

    async def swallows_one_cancel() -> None:
        """Like redis-py's cluster pub/sub listen(): the first cancel is caught and it waits on."""
        waiting.set()
        try:
            await _forever()
        except asyncio.CancelledError:
            log.append(f"swallowed, stop_requested={stop_requested()}")
        await _forever()

    task = asyncio.create_task(swallows_one_cancel())
    await waiting.wait()
    left = await cancel_and_wait([task], within_s=2.0)
    assert left == set() and task.cancelled()
    assert log == ["swallowed, stop_requested=True"]


@on_virtual_time
async def test_a_task_that_never_ends_is_returned_after_the_bound() -> None:
    give_up = asyncio.Event()
    waiting = asyncio.Event()
    cancels: list[float] = []
    loop = asyncio.get_running_loop()

    async def stubborn() -> None:
        while not give_up.is_set():
            waiting.set()
            try:
                await _forever()
            except asyncio.CancelledError:
                cancels.append(loop.time())
                continue

    task = asyncio.create_task(stubborn())
    await waiting.wait()
    start = loop.time()
    left = await cancel_and_wait([task], within_s=0.3)
    assert left == {task} and loop.time() - start == pytest.approx(0.3)
    # cancelled again every 0.1 s (the cancel at the bound is still pending when it returns)
    assert [t - start for t in cancels] == pytest.approx([0.0, 0.1, 0.2])
    give_up.set()
    task.cancel()
    await task


@on_virtual_time
async def test_a_loop_checking_stop_requested_ends_after_a_swallowed_cancel() -> None:
    rounds: list[int] = []
    waiting = asyncio.Event()

    async def loop_like_the_stores() -> None:
        while not stop_requested():
            waiting.set()
            with contextlib.suppress(asyncio.CancelledError):  # what a library does to us
                await _forever()
            rounds.append(1)

    task = asyncio.create_task(loop_like_the_stores())
    await waiting.wait()
    task.cancel()
    await task  # ends by itself, no second cancel needed
    assert task.done() and not task.cancelled() and rounds == [1]


@on_virtual_time
async def test_nothing_to_stop() -> None:
    assert await cancel_and_wait([], within_s=1.0) == set()
    done = asyncio.create_task(asyncio.Event().wait())
    done.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await done
    assert await cancel_and_wait([done], within_s=1.0) == set()
