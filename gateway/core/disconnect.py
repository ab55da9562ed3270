"""Noticing a client that leaves mid-request: `ClientWatch`.

Under our uvicorn cycle (gateway/edge/http_cycle.py) the server calls a callback when the connection is
lost before the response completed; under another ASGI server the watch parks a task on `receive()`
until `http.disconnect`. Used while the proxy waits for the engine (gateway/upstream/proxy.py) and while a
stream is relayed (gateway/upstream/relay.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from gateway.core.context import RequestContext


class ClientWatch:
    """Calls `on_leave` when the client disconnects, until `stop()`."""

    __slots__ = ("_setter", "_task")

    def __init__(self, ctx: RequestContext, on_leave: Callable[[], None]) -> None:
        self._setter = ctx.on_disconnect
        self._task: asyncio.Task[None] | None = None
        if self._setter is not None:
            self._setter(on_leave)
        else:
            self._task = asyncio.get_running_loop().create_task(_watch(ctx.receive, on_leave))

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        elif self._setter is not None:
            self._setter(None)


async def _watch(receive: Callable[[], Awaitable[Any]], on_leave: Callable[[], None]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            on_leave()
            return
