"""Minimal ASGI responses for the hot path (no Starlette objects per request).

A response is an object with `status`, `headers` and `async __call__(send, receive)`. Header lists are
`(bytes, bytes)` pairs, lower-case names, as ASGI wants them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Protocol

from engines.errors import ApiError

Message = MutableMapping[str, Any]
#: an error as one client API writes it: (HTTP status, body). OpenAI's is `openai_error`
ErrorRenderer = Callable[[ApiError], tuple[int, bytes]]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

#: marks a response start whose body follows at once: uvicorn's cycle then writes both together
#: (gateway/edge/http_cycle.py; other ASGI servers ignore the key)
COALESCE = "gateway.coalesce"
#: scope["extensions"] key of a function that sets the callback for a client that leaves before the
#: response completed (gateway/edge/http_cycle.py); absent under other servers
DISCONNECT = "gateway.disconnect"

JSON = b"application/json"
SSE = b"text/event-stream"


class Response(Protocol):
    status: int
    headers: Headers

    async def __call__(self, send: Send, receive: Receive) -> None: ...


class BytesResponse:
    """A complete body sent in one message."""

    __slots__ = ("body", "headers", "status")

    def __init__(
        self, status: int, body: bytes, headers: Headers | None = None, content_type: bytes = JSON
    ) -> None:
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else []
        self.headers.append((b"content-type", content_type))

    async def __call__(self, send: Send, receive: Receive) -> None:
        self.headers.append((b"content-length", str(len(self.body)).encode()))
        await send(
            {"type": "http.response.start", "status": self.status, "headers": self.headers, COALESCE: True}
        )
        await send({"type": "http.response.body", "body": self.body})


def openai_error(err: ApiError) -> tuple[int, bytes]:
    """OpenAI's envelope (every API but Anthropic's Messages)."""
    return err.status, err.body()


def error_response(
    err: ApiError, headers: Headers | None = None, render: ErrorRenderer = openai_error
) -> BytesResponse:
    """`err` as a response, in the shape `render` writes (the request's API: `ctx.render_error`)."""
    out = headers if headers is not None else []
    for name, value in err.headers.items():
        out.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    status, body = render(err)
    return BytesResponse(status, body, out)


def safe_header_value(value: str) -> bytes:
    """A header value with anything that could split or smuggle headers removed."""
    return value.encode("latin-1", "replace").replace(b"\r", b"").replace(b"\n", b"")
