"""An asyncio event loop on virtual time, for testing what time drives without a stopwatch.

The loop's clock starts at 0 and moves only when the loop has nothing ready to run: it then jumps to
the next timer, so `asyncio.sleep(30)`, `asyncio.timeout(0.05)` and `loop.call_at` take no wall time
and happen in exactly the order their times say. `advance(s)` moves the clock without running
anything, as a host that stopped this process for `s` seconds would (a deadline then fires late).
Real sockets still work (the selector is polled), but a test that waits on another thread or process
would see its timers jump ahead: use it for in-process fakes, as uvicorn's MockLoop is used.

    @on_virtual_time
    async def test_probe_times_out() -> None:
        loop = virtual_loop()
        ...
        assert loop.time() == 0.05
"""

from __future__ import annotations

import asyncio
import functools
import selectors
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec

P = ParamSpec("P")


class _Selector(selectors.DefaultSelector):
    """Polls the real file descriptors without blocking; when none is ready and the loop would wait
    for a timer, moves the loop's clock to that timer instead."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout is None:
            return ready or super().select(None)
        if timeout > 0 and self.loop is not None:
            self.loop.advance(timeout)
        return ready


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose `time()` is virtual (module docstring)."""

    def __init__(self) -> None:
        selector = _Selector()
        super().__init__(selector)
        selector.loop = self
        self._now = 0.0
        self._clock_resolution = 1e-9

    def time(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward without running anything (a stall of this process)."""
        assert seconds >= 0, seconds
        self._now += seconds


def virtual_loop() -> VirtualTimeLoop:
    """The running loop, which must be a `VirtualTimeLoop` (inside an `on_virtual_time` test)."""
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualTimeLoop), loop
    return loop


def run_virtual(main: Awaitable[Any]) -> Any:
    """Run `main` to its end on a fresh `VirtualTimeLoop`; its result."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main)
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def on_virtual_time(test: Callable[P, Awaitable[None]]) -> Callable[P, None]:
    """An async test run on its own `VirtualTimeLoop` (a plain test to pytest; fixtures still apply)."""

    @functools.wraps(test)
    def run(*args: P.args, **kwargs: P.kwargs) -> None:
        run_virtual(test(*args, **kwargs))

    return run


async def elapse(seconds: float) -> None:
    """Let `seconds` of virtual time pass, running everything that falls due meanwhile (a timer on
    the virtual clock: it returns at once in wall time)."""
    loop = asyncio.get_running_loop()
    due: asyncio.Future[None] = loop.create_future()
    timer = loop.call_later(seconds, due.set_result, None)
    try:
        await due
    finally:
        timer.cancel()  # a cancelled wait leaves no timer behind
