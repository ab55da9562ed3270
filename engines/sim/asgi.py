"""Minimal raw-ASGI helpers shared by both dialects (no framework on the hot path).

`Disconnect` is the contract for prompt cancellation: after the body is read, `watch_disconnect`
starts a task that waits on `receive()`; when the client goes away (`http.disconnect`) it cancels the
request's task, so a handler sleeping in the cost model or writing a stream stops within one event-loop
turn. The handler must call `stop()` when it finishes normally.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import orjson

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
TEXT_HEADERS = [(b"content-type", b"text/plain; version=0.0.4; charset=utf-8")]
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]
DONE = b"data: [DONE]\n\n"


async def read_body(receive: Receive) -> bytes:
    """The whole request body."""
    msg = await receive()
    body: bytes = msg.get("body", b"")
    if not msg.get("more_body"):
        return body
    parts = [body]
    while msg.get("more_body"):
        msg = await receive()
        parts.append(msg.get("body", b""))
    return b"".join(parts)


async def read_json(receive: Receive) -> dict[str, Any]:
    """The body parsed as a JSON object ({} when empty or not an object)."""
    raw = await read_body(receive)
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        return {}
    return body if isinstance(body, dict) else {}


async def send_bytes(
    send: Send, status: int, body: bytes, headers: list[tuple[bytes, bytes]] = JSON_HEADERS
) -> None:
    """A complete response with a content-length."""
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*headers, (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, obj: Any) -> None:
    """A JSON response (orjson)."""
    await send_bytes(send, status, orjson.dumps(obj))


async def start_sse(send: Send) -> None:
    """Send the 200 header of an event stream."""
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})


async def send_chunk(send: Send, data: bytes) -> None:
    """One piece of a streamed body."""
    await send({"type": "http.response.body", "body": data, "more_body": True})


async def end_stream(send: Send) -> None:
    """Finish a streamed body."""
    await send({"type": "http.response.body", "body": b""})


def sse(obj: Any) -> bytes:
    """`data: <json>\\n\\n`."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class Disconnect:
    """Cancels the current task when the client disconnects; see the module docstring."""

    __slots__ = ("_task", "disconnected")

    def __init__(self, receive: Receive) -> None:
        self.disconnected = False
        target = asyncio.current_task()
        self._task = asyncio.create_task(self._watch(receive, target))

    async def _watch(self, receive: Receive, target: asyncio.Task[Any] | None) -> None:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                self.disconnected = True
                if target is not None:
                    target.cancel()
                return

    def stop(self) -> None:
        """Stop watching (the response is complete)."""
        self._task.cancel()


def transport_of(scope: Scope) -> asyncio.Transport | None:
    """The connection's transport when the simulator's protocol class put it in the scope."""
    ext = scope.get("extensions") or {}
    t = ext.get("sim.transport")
    return t if hasattr(t, "close") else None  # uvloop's transports are not asyncio.Transport subclasses


async def cut_connection(scope: Scope, receive: Receive) -> None:
    """Close the TCP connection mid-response (the client sees a truncated body)."""
    transport = transport_of(scope)
    if transport is None:
        raise ConnectionAbortedError("simulated crash")
    transport.close()
    # wait for uvicorn to notice, so it does not log an incomplete response
    while (await receive())["type"] != "http.disconnect":
        pass
