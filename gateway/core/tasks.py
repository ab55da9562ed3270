"""Background loops that stop when asked, even when a library swallowed the request.

A loop around a redis-py call (`while True: sleep; try: command; except RedisError: log`) is stopped
with `task.cancel()`. redis-py does not always let that `CancelledError` through: its cluster client,
cancelled in the middle of a command or of closing a pub/sub connection, can turn it into a connection
error (reproduced: a `RedisStore` on a three-master cluster, stopped 60 times, kept its tasks alive
about one time in ten). The loop then logs, sleeps and carries on for ever, and whatever waits for it
— shutdown, or the test's event loop — waits for ever too.

`Task.cancelling()` still counts the request after the exception was swallowed, so a loop asks
`stop_requested()` where it would otherwise go round again; and whoever stops such tasks uses
`cancel_and_wait()`, which cancels again until they end, within a bound.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger("gateway")


def stop_requested() -> bool:
    """Whether the current task has been asked to stop (`cancel()`), swallowed or not."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


async def cancel_and_wait(
    tasks: Iterable[asyncio.Task[Any]], within_s: float, what: str = "background tasks"
) -> set[asyncio.Task[Any]]:
    """Cancel `tasks` and wait up to `within_s` s for them to end, cancelling again every 0.1 s those
    still running (a cancel swallowed inside a library call is not the end of it: redis-py's cluster
    pub/sub `listen()` lets the first one pass by, the second ends it). Logs and returns the tasks still alive."""
    pending = {t for t in tasks if not t.done()}
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while pending:
        for t in pending:
            t.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=min(0.1, left))
    if pending:
        log.warning(
            "%s still running %.0f s after the stop: %s", what, within_s, [t.get_name() for t in pending]
        )
    return pending
