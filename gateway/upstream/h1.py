"""HTTP/1.1 to the engines on raw asyncio: the gateway's `Transport`.

    H1Transport ── one _Origin per scheme://host:port ── LIFO stack of idle _Connection
                                                          (asyncio.Protocol + httptools parser)

A request is serialised into one `bytes` (the origin's precomputed `Host`/`Content-Type`/`Accept`
lines, then `Content-Length` and the body) and written with one `transport.write`. The response is
parsed with httptools; `request()` returns once the status line and headers are in, and the body is
then read whole (`read`) or as it arrives (`chunks`). Every socket has TCP_NODELAY.

Contract, on top of `gateway.upstream.transport.Transport`:
- A connection goes back to its pool only when `close()` is called after the response was read to
  the end, the engine did not ask to close it, and the request was fully written. Closing a response
  earlier aborts the socket: that is how an engine learns the client went away and stops generating.
- `close()` from any task wakes a pending `read()`/`chunks()` at once with `UpstreamError`.
- A streamed body never buffers without bound: past `HIGH_WATER` unconsumed bytes the socket stops
  being read until the consumer drains it below `LOW_WATER`. `read()` buffers the whole body (asked for).
- A request sent on a pooled connection that dies before any byte of the answer arrived (usually the
  engine closing the idle socket as the request went out) is sent once more on a new connection.
- Only connect has a timeout here (`UpstreamTimeout("connect")`); every other phase is bounded by the
  caller (`asyncio.timeout` around the awaits, or `close()` from a watchdog).
- Error messages never carry addresses: they may reach clients.
Idle connections expire after `KEEPALIVE_S`; at most `max_idle` are kept per origin. There is no cap
on concurrent connections (admission control bounds the gateway's concurrency).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import socket
import ssl
from collections.abc import Mapping
from typing import Final, cast
from urllib.parse import urlsplit

import httptools

from gateway.core.stalls import held
from gateway.upstream.transport import ConnectFailed, UpstreamError, UpstreamResponse, UpstreamTimeout

#: unconsumed streamed bytes above which the socket stops being read, and below which it resumes
HIGH_WATER: Final = 256 * 1024
LOW_WATER: Final = 64 * 1024
#: a TCP connect to an engine: one in the fleet's network accepts within milliseconds, so two seconds
#: without an answer mean it is not there (the request fails over)
CONNECT_TIMEOUT_S: Final = 2.0
#: an idle pooled connection is closed after 30 s: engines close theirs sooner or later, and a
#: request sent on one they closed goes once more on a new connection (see above)
KEEPALIVE_S: Final = 30.0
#: idle connections kept per backend: more than an engine's concurrent requests ever need again
MAX_IDLE_PER_BACKEND: Final = 1024

_DEFAULT_HEADERS: Final = b"Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
_WAIT_HEADERS, _WAIT_CHUNK, _WAIT_ALL = 0, 1, 2
_MAX_ROUTES = 4096


class _Extra(Exception):
    """Bytes after a complete answer, in the same read."""


class _Stale(ConnectFailed):
    """A pooled connection died before any byte of the answer: send the request again."""


class _Origin:
    """One scheme://host:port: where to connect, the request-header prefix, the idle connections."""

    __slots__ = ("host", "idle", "port", "prefix", "ssl")

    def __init__(self, host: str, port: int, authority: str, ssl_context: ssl.SSLContext | None) -> None:
        self.host = host
        self.port = port
        self.ssl = ssl_context
        self.prefix = b" HTTP/1.1\r\nHost: " + authority.encode("idna") + b"\r\n"
        self.idle: list[_Connection] = []  # LIFO: the end is the most recently used


class _Connection(asyncio.Protocol):
    """One socket. Holds the state of the response being received (one at a time, no pipelining)."""

    __slots__ = (
        "body",
        "buffered",
        "done",
        "error",
        "got_bytes",
        "headers",
        "headers_done",
        "idle_since",
        "in_use",
        "lost",
        "origin",
        "parser",
        "paused",
        "reusable",
        "reused",
        "status",
        "transport",
        "wait_for",
        "waiter",
    )

    def __init__(self, origin: _Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.waiter: asyncio.Future[None] | None = None
        self.wait_for = _WAIT_HEADERS
        self.body: list[bytes] = []
        self.buffered = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.headers_done = self.done = self.got_bytes = self.reusable = self.reused = False
        self.in_use = self.lost = self.paused = False
        self.error: UpstreamError | None = None
        self.idle_since = 0.0

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):  # not TCP (a unix socket)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        if not self.in_use:  # an engine has nothing to say between responses
            self.abort()
            return
        if self.done:  # bytes after a complete response: do not trust this socket again
            self.reusable = False
            return
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.fail(UpstreamError("upstream sent a malformed response"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.reusable = False
        if not self.in_use:
            idle = self.origin.idle
            if self in idle:
                idle.remove(self)
            return
        if self.done or self.error is not None:
            return
        if self.headers_done and exc is None and self._body_until_eof():
            self.done = True
        elif not self.got_bytes and self.reused:
            self.error = _Stale("upstream closed an idle connection")
        elif not self.headers_done:
            self.error = ConnectFailed("upstream closed the connection before answering")
        else:
            self.error = UpstreamError("upstream closed the connection mid-body")
        self.wake()

    # -- httptools callbacks ----------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        if self.done:  # a second answer to one request: stop parsing (the socket is retired)
            raise _Extra
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self.done:
            raise _Extra
        self.status = self.parser.get_status_code()
        if self.status >= 200:
            self.headers_done = True
            if self.wait_for == _WAIT_HEADERS:
                self.wake()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)
        self.buffered += len(body)
        if self.waiter is not None and self.wait_for == _WAIT_CHUNK:
            self.wake()
        elif self.buffered > HIGH_WATER and self.wait_for != _WAIT_ALL and not self.paused:
            self.paused = True
            assert self.transport is not None
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        if not self.headers_done:  # an interim 1xx answer: the real one follows
            self.headers = []
            return
        self.done = True
        self.reusable = self.parser.should_keep_alive()
        self.wake()

    # -- state ------------------------------------------------------------------------------------
    def _body_until_eof(self) -> bool:
        framed = (b"content-length", b"transfer-encoding")
        return all(name.lower() not in framed for name, _ in self.headers)

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, what: int) -> None:
        waiter = asyncio.get_running_loop().create_future()
        self.waiter = waiter
        self.wait_for = what
        try:
            await waiter
        except asyncio.CancelledError:
            self.abort()
            raise

    def resume(self, force: bool = False) -> None:
        if self.paused and (force or self.buffered <= LOW_WATER) and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    def fail(self, error: UpstreamError) -> None:
        if self.error is None and not self.done:
            self.error = error
        self.abort()

    def abort(self) -> None:
        self.reusable = False
        if self.transport is not None:
            self.transport.abort()
        self.wake()

    def start(self, reused: bool) -> None:
        """Reset the per-response state before a request goes out."""
        self.in_use = True
        self.reused = reused
        self.headers_done = self.done = self.got_bytes = self.reusable = False
        self.error = None
        self.status = self.buffered = 0
        self.wait_for = _WAIT_HEADERS
        if self.headers:
            self.headers = []


class _Response:
    """What `H1Transport.request` returns; `chunks()` returns the response itself (no async generator,
    so a consumer that stops early leaves nothing to finalise)."""

    __slots__ = ("_conn", "_reading", "_transport", "headers", "status")

    def __init__(self, conn: _Connection, transport: H1Transport) -> None:
        self._conn: _Connection | None = conn
        #: a read is waiting on the connection: `close()` (from another task) must then abort it, never
        #: release it — a released connection serves the next request while the waiting read would
        #: still be looking at it
        self._reading = False
        self._transport = transport
        self.status = conn.status
        #: raw (name, value) pairs as the engine sent them
        self.headers = conn.headers

    async def read(self) -> bytes:
        """The rest of the body, whole."""
        conn = self._conn
        if conn is None:
            raise UpstreamError("upstream response closed")
        if not conn.done:
            conn.resume(force=True)
            while not conn.done:
                if conn.error is not None:
                    raise UpstreamError(str(conn.error))
                await self._wait(conn, _WAIT_ALL)
        body = conn.body
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        conn.buffered = 0
        return data

    def chunks(self) -> _Response:
        return self

    def __aiter__(self) -> _Response:
        return self

    async def __anext__(self) -> bytes:
        conn = self._conn
        if conn is None:
            raise UpstreamError("upstream response closed")
        while True:
            body = conn.body
            if body:
                data = body[0] if len(body) == 1 else b"".join(body)
                body.clear()
                conn.buffered = 0
                if conn.paused:
                    conn.resume()
                return data
            if conn.done:
                raise StopAsyncIteration
            if conn.error is not None:
                raise UpstreamError(str(conn.error))
            await self._wait(conn, _WAIT_CHUNK)

    async def _wait(self, conn: _Connection, what: int) -> None:
        self._reading = True
        try:
            await conn.wait(what)
        finally:
            self._reading = False
        if self._conn is not conn:  # closed by another task while this read waited
            raise UpstreamError("upstream response closed")

    def close(self) -> None:
        """Release the connection to its pool if the response was read to the end, else abort it."""
        conn = self._conn
        if conn is None:
            return
        self._conn = None
        conn.in_use = False
        transport = conn.transport
        if (
            conn.done
            and not self._reading
            and conn.reusable
            and transport is not None
            and not transport.is_closing()
            and not transport.get_write_buffer_size()
        ):
            conn.body.clear()  # complete but unread: the socket itself is clean
            conn.resume(force=True)  # an idle socket must be read, to notice the engine closing it
            self._transport._release(conn)
        else:
            if conn.error is None and not conn.done:
                conn.error = UpstreamError("upstream response closed")
            conn.abort()


class H1Transport:
    """Pooled keep-alive HTTP/1.1 client for all backends (GET and POST). Create inside a running loop."""

    def __init__(
        self,
        *,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        max_per_host: int = MAX_IDLE_PER_BACKEND,
        keepalive_s: float = KEEPALIVE_S,
    ) -> None:
        """`max_per_host` bounds the idle connections kept per origin (not the concurrent ones)."""
        self._connect_timeout = connect_timeout_s
        self._max_idle = max_per_host
        self._keepalive = keepalive_s
        self._origins: dict[str, _Origin] = {}
        self._routes: dict[str, tuple[_Origin, bytes]] = {}  # url -> (origin, path)
        self._ssl: ssl.SSLContext | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._closed = False

    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> UpstreamResponse:
        route = self._routes.get(url)
        if route is None:
            route = self._route(url)
        origin, path = route
        head = _DEFAULT_HEADERS if not headers else _encode_headers(headers)
        if body is None and method == "GET":
            data = b"GET %b%b%b\r\n" % (path, origin.prefix, head)
        else:
            body = body or b""
            data = b"%b %b%b%bContent-Length: %d\r\n\r\n%b" % (
                method.encode("ascii"),
                path,
                origin.prefix,
                head,
                len(body),
                body,
            )
        conn = self._checkout(origin)
        if conn is not None:
            try:
                return await self._exchange(conn, data, reused=True)
            except _Stale:
                pass  # once more, on a new connection
        return await self._exchange(await self._connect(origin), data, reused=False)

    async def aclose(self) -> None:
        """Close the idle connections; responses still open are aborted when they are closed."""
        self._closed = True
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
        for origin in self._origins.values():
            idle, origin.idle = origin.idle, []
            for conn in idle:
                if conn.transport is not None:
                    conn.transport.close()
        await asyncio.sleep(0)

    # -- internals --------------------------------------------------------------------------------
    def _route(self, url: str) -> tuple[_Origin, bytes]:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("upstream url must start with http:// or https://")
        tls = parts.scheme == "https"
        key = parts.scheme + "://" + parts.netloc
        origin = self._origins.get(key)
        if origin is None:
            if tls and self._ssl is None:
                self._ssl = ssl.create_default_context()
            port = parts.port or (443 if tls else 80)
            origin = _Origin(parts.hostname, port, parts.netloc, self._ssl if tls else None)
            self._origins[key] = origin
        if len(self._routes) >= _MAX_ROUTES:
            self._routes.clear()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        route = self._routes[url] = (origin, path.encode("ascii"))
        return route

    def _checkout(self, origin: _Origin) -> _Connection | None:
        idle = origin.idle
        if not idle:
            return None
        expired_before = asyncio.get_running_loop().time() - self._keepalive
        while idle:
            conn = idle.pop()
            if conn.idle_since < expired_before:  # the newest has expired, so have all below it
                for old in (conn, *idle):
                    if old.transport is not None:
                        old.transport.close()
                idle.clear()
                return None
            if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                return conn
        return None

    def _release(self, conn: _Connection) -> None:
        idle = conn.origin.idle
        if self._closed or len(idle) >= self._max_idle:
            assert conn.transport is not None
            conn.transport.close()
            return
        loop = asyncio.get_running_loop()
        conn.idle_since = loop.time()
        idle.append(conn)
        if self._sweeper is None:
            self._sweeper = loop.call_later(self._keepalive, self._sweep)

    def _sweep(self) -> None:
        """Close connections idle for longer than keepalive_s (the oldest sit at the bottom)."""
        self._sweeper = None
        loop = asyncio.get_running_loop()
        expired_before = loop.time() - self._keepalive
        left = False
        for origin in self._origins.values():
            idle = origin.idle
            n = 0
            while n < len(idle) and idle[n].idle_since < expired_before:
                n += 1
            for conn in idle[:n]:
                if conn.transport is not None:
                    conn.transport.close()
            del idle[:n]
            left = left or bool(idle)
        if left and not self._closed:
            self._sweeper = loop.call_later(self._keepalive, self._sweep)

    async def _connect(self, origin: _Origin) -> _Connection:
        """A new connection; a timeout that measured this process's own stall (fired late: the
        engine may have accepted meanwhile, unread; gateway/core/stalls.py) connects once more
        rather than count against the engine."""
        loop = asyncio.get_running_loop()
        for again in (False, True):
            budget = asyncio.timeout(self._connect_timeout)
            try:
                async with budget:
                    _, conn = await loop.create_connection(
                        functools.partial(_Connection, origin),
                        origin.host,
                        origin.port,
                        ssl=origin.ssl,
                        server_hostname=origin.host if origin.ssl is not None else None,
                    )
                return conn
            except TimeoutError:
                deadline = budget.when()  # the loop's time the timeout was due
                if again or deadline is None or not held(deadline, loop.time()):
                    raise UpstreamTimeout("connect") from None
            except OSError as exc:  # refused, unreachable, DNS, TLS
                raise ConnectFailed(f"upstream connect failed: {type(exc).__name__}") from None
        raise AssertionError("unreachable")

    async def _exchange(self, conn: _Connection, data: bytes, *, reused: bool) -> _Response:
        conn.start(reused)
        transport = conn.transport
        assert transport is not None
        if conn.lost or transport.is_closing():  # closed between connect (or checkout) and now
            conn.in_use = False
            raise (
                _Stale("upstream closed an idle connection")
                if reused
                else ConnectFailed("upstream closed the connection before answering")
            )
        transport.write(data)
        while not conn.headers_done:
            error = conn.error
            if error is not None:
                conn.in_use = False
                conn.abort()
                raise error
            await conn.wait(_WAIT_HEADERS)
        return _Response(conn, self)


def _encode_headers(headers: Mapping[str, str]) -> bytes:
    lines = []
    for name, value in headers.items():
        line = f"{name}: {value}\r\n"
        if line.count("\n") != 1 or "\r" in line[:-2]:
            raise ValueError("header names and values must not contain line breaks")
        lines.append(line)
    return "".join(lines).encode("latin-1")
