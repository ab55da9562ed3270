"""Limits on the request head that uvicorn's httptools protocol does not have: size and time.

(The gateway serves with `GatewayHttpProtocol`, gateway/edge/http_cycle.py: this guard plus our request
cycle.)

uvicorn 0.x with httptools accepts request heads of any size (an 8 MB header, or 20 000 headers,
are parsed and buffered; `h11_max_incomplete_event_size` applies to h11 only) and has no timeout
for reading a head: `timeout_keep_alive` is armed only after a response, and any byte cancels it,
so a connection that never sends anything, or sends its head one byte a minute (slowloris), stays
open for ever. `GuardedHttpToolsProtocol` adds both limits, below the ASGI app:

- a request head (request line + headers) larger than `max_header_bytes` is answered 431 in
  OpenAI's error shape and the connection closed. Bytes are counted as they arrive, so nothing
  past the limit is buffered (a head may overshoot by at most one socket read, ≤ 256 KiB);
- a head not complete within `HEADER_TIMEOUT_S` of the connection opening — or of its first byte,
  on a kept-alive connection — is answered 408 and the connection closed. Idle kept-alive
  connections stay uvicorn's business (`timeout_keep_alive`). A deadline that fires late measured
  this process's own stall, not the client (gateway/core/stalls.py): uvloop runs due timers before
  it reads the sockets, so a head the client sent during the stall would still be unread (a client
  cut so: tests/reliability/test_security.py). The deadline then looks again `GRACE_S` later,
  after the socket has been read.
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from engines.errors import ApiError
from gateway.core.stalls import held


def _raw_response(status: int, reason: str, err: ApiError) -> bytes:
    body = err.body()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


_TOO_LARGE = _raw_response(
    431,
    "Request Header Fields Too Large",
    ApiError(
        431, "The request headers are too large.", type="invalid_request_error", code="headers_too_large"
    ),
)
_TIMEOUT = _raw_response(
    408,
    "Request Timeout",
    ApiError(
        408, "The request headers were not received in time.", type="invalid_request_error", code="timeout"
    ),
)


#: a head deadline that measured this process's stall is looked at again this much later, once the
#: sockets have been read
GRACE_S = 0.25
#: seconds a request head may take: ample for any client on a slow link (a head is a few hundred
#: bytes), short enough that idle or dripping connections cannot pile up
HEADER_TIMEOUT_S = 10.0


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a size cap and a deadline on every request head."""

    #: the largest request head (request line + headers) in bytes, 431 above: nginx's and most
    #: proxies' limits are smaller, so no client that reaches the gateway through one needs more
    max_header_bytes = 64 * 1024

    _in_head = True
    _head_bytes = 0
    _head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._in_head = True
        self._head_bytes = 0
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_header_bytes:
            self._refuse(_TOO_LARGE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._head_timer is None:
            self._arm()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        self._disarm()
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        # What arrives next is the head of the next request (its deadline starts at its first byte).
        self._in_head = True
        self._head_bytes = 0

    def _arm(self, after_s: float | None = None) -> None:
        self._disarm()
        delay = HEADER_TIMEOUT_S if after_s is None else after_s
        self._head_timer = self.loop.call_later(delay, self._head_timeout)

    def _disarm(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timeout(self) -> None:
        timer, self._head_timer = self._head_timer, None
        if not self._in_head or self.transport.is_closing():
            return
        if timer is not None and held(timer.when(), self.loop.time()):  # our stall, not the client's
            self._arm(GRACE_S)
            return
        self._refuse(_TIMEOUT)

    def _refuse(self, response: bytes) -> None:
        self._disarm()
        self._in_head = False
        if self.transport.is_closing():
            return
        # Never in the middle of another response on this connection (pipelining): just close then.
        if self.cycle is None or self.cycle.response_complete:
            self.transport.write(response)
        self.transport.close()
