"""A simulator served in this process, to an httpx client, on the running event loop.

Run on a `tests.virtual_time` loop, a stream's chunks arrive at exactly the virtual times the cost
model schedules them, so its timing is asserted to the microsecond without a stopwatch. The body is
streamed chunk by chunk (httpx's own ASGITransport hands over the whole body at the end), and each
chunk sent may cost `send_s` of the clock, as writing it to a socket does, to show that the engine's
schedule does not drift with its writes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from engines.sim.app_base import SimApp
from engines.sim.config import parse_config
from engines.sim.server import build_app
from tests.virtual_time import virtual_loop

Message = dict[str, Any]


def sim_app(engine: str, *flags: str) -> SimApp:
    """The simulator `gateway sim --engine ENGINE FLAGS` would serve, its latencies read on the
    running loop's clock."""
    return build_app(
        parse_config(["--engine", engine, "--port", "1", *flags]), asyncio.get_running_loop().time
    )


class _Body(httpx.AsyncByteStream):
    def __init__(self, queue: asyncio.Queue[Message], task: asyncio.Task[None], gone: asyncio.Event) -> None:
        self._queue, self._task, self._gone = queue, task, gone
        #: the loop's time when the app sent the chunk last yielded
        self.sent_at = 0.0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            message = await self._queue.get()
            if message["type"] == "app.error":
                raise message["error"]
            if message.get("body"):
                self.sent_at = message["sent_at"]
                yield message["body"]
            if not message.get("more_body", False):
                return

    async def aclose(self) -> None:
        self._gone.set()  # the client went away: the app's receive() says so
        if not self._task.done():
            self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


class StreamingASGITransport(httpx.AsyncBaseTransport):
    """Runs `app` once per request as a task of the running loop; the response streams as sent."""

    def __init__(self, app: Any, send_s: float = 0.0) -> None:
        self.app = app
        self.send_s = send_s
        self.body: _Body | None = None  # the last request's response body

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = b"".join([chunk async for chunk in request.stream])  # type: ignore[union-attr]
        queue: asyncio.Queue[Message] = asyncio.Queue()
        gone = asyncio.Event()
        sent_body = False

        async def receive() -> Message:
            nonlocal sent_body
            if not sent_body:
                sent_body = True
                return {"type": "http.request", "body": body, "more_body": False}
            await gone.wait()
            return {"type": "http.disconnect"}

        async def send(message: Message) -> None:
            queue.put_nowait({**message, "sent_at": asyncio.get_running_loop().time()})
            if message["type"] == "http.response.body" and self.send_s:
                virtual_loop().advance(self.send_s)

        async def run() -> None:
            try:
                await self.app(scope, receive, send)
            except Exception as exc:
                queue.put_nowait({"type": "app.error", "error": exc})

        url = request.url
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": request.method,
            "scheme": url.scheme,
            "path": url.path,
            "raw_path": url.raw_path.split(b"?")[0],
            "query_string": url.query,
            "headers": [(k.lower(), v) for k, v in request.headers.raw],
            "client": ("127.0.0.1", 50000),
            "server": (url.host, url.port or 80),
        }
        task = asyncio.create_task(run())
        self.body = stream = _Body(queue, task, gone)
        start = await queue.get()
        if start["type"] == "app.error":
            raise start["error"]
        assert start["type"] == "http.response.start", start
        return httpx.Response(start["status"], headers=start.get("headers", []), stream=stream)


class SimClient(httpx.AsyncClient):
    """An httpx client of an in-process simulator, which knows when each chunk was sent."""

    def __init__(self, app: Any, send_s: float = 0.0) -> None:
        self.asgi = StreamingASGITransport(app, send_s)
        super().__init__(transport=self.asgi, base_url="http://sim", timeout=30)


def sim_client(app: Any, send_s: float = 0.0) -> SimClient:
    """An httpx client of the in-process simulator `app` (each chunk written costs `send_s`)."""
    return SimClient(app, send_s)


async def content_times(
    client: SimClient, body: dict[str, Any], path: str = "/v1/chat/completions"
) -> list[float]:
    """When the simulator sent each streamed event that carries content, from the request's start
    (the loop's clock)."""
    t0 = asyncio.get_running_loop().time()
    stamps: list[float] = []
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        sent = client.asgi.body
        assert sent is not None
        async for chunk in r.aiter_raw():
            for event in chunk.split(b"\n\n"):
                if b'"content":"' in event and b'"content":""' not in event:
                    stamps.append(sent.sent_at - t0)
    return stamps
