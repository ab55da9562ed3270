"""An auto-pipelining RESP connection for the admission hot path (one `EVALSHA` per request).

redis-py's asyncio client costs ~80 µs of CPU per command (pool checkout, command objects, one
write and one read wake-up per call) — over the whole admission budget on its own. This is the
minimum instead: one TCP (or unix) connection per process, commands encoded straight to bytes,
every command issued during one event-loop tick written with one `write`, replies parsed by hiredis
and matched to callers in order (Redis answers in order on a connection). ~10 µs per call.

Contract:
- `call(*args)` returns the reply, or raises `ReplyError` (Redis said `-ERR…`), `WireDown`
  (connection refused, lost, or no answer within `timeout_s` — the command may or may not have run).
- A lost connection fails every pending call with `WireDown`; the next call reconnects.
- `timeout_s` is enforced by one watchdog per connection (no timer per call).

Only standalone Redis (`redis://`, `rediss://`, `unix://`); Sentinel and Cluster deployments use
redis-py (gateway/admission/limits_redis.py accepts either).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections import deque
from typing import Any, cast
from urllib.parse import unquote, urlparse

import hiredis

ReplyError = hiredis.ReplyError


class WireDown(Exception):
    """The connection failed or timed out; a command in flight may or may not have run."""


def encode(args: tuple[Any, ...]) -> bytes:
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else str(a).encode()
        out.append(b"$%d\r\n%b\r\n" % (len(b), b))
    return b"".join(out)


class _Protocol(asyncio.Protocol):
    def __init__(self, owner: RespClient) -> None:
        self._owner = owner
        self._reader = hiredis.Reader()
        self.pending: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.transport: asyncio.Transport | None = None
        self._out: list[bytes] = []
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not subclasses

    def send(self, data: bytes, fut: asyncio.Future[Any], now: float) -> None:
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(data)
        self.pending.append((fut, now))

    def _flush(self) -> None:
        if self.transport is not None and not self.closed and self._out:
            self.transport.write(b"".join(self._out))
        self._out.clear()

    def data_received(self, data: bytes) -> None:
        reader = self._reader
        reader.feed(data)
        pending = self.pending
        while (reply := reader.gets()) is not False:
            if not pending:
                break
            fut, _ = pending.popleft()
            if fut.done():
                continue
            if isinstance(reply, ReplyError):
                fut.set_exception(reply)
            else:
                fut.set_result(reply)

    def connection_lost(self, exc: Exception | None) -> None:
        self.fail(WireDown(f"connection lost: {exc}" if exc else "connection closed"))

    def fail(self, exc: Exception) -> None:
        self.closed = True
        self._out.clear()
        while self.pending:
            fut, _ = self.pending.popleft()
            if not fut.done():
                fut.set_exception(exc)
        if self.transport is not None:
            self.transport.abort()
        self._owner._lost(self)


class RespClient:
    """One lazily (re)connected, auto-pipelined connection. Not shared across event loops."""

    def __init__(
        self, url: str, *, timeout_s: float = 2.0, username: str | None = None, password: str | None = None
    ) -> None:
        u = urlparse(url)
        if u.scheme not in ("redis", "rediss", "unix"):
            raise ValueError(f"unsupported Redis URL scheme {u.scheme!r}")
        self._unix = u.path if u.scheme == "unix" else None
        self._host = u.hostname or "127.0.0.1"
        self._port = u.port or 6379
        self._ssl = ssl.create_default_context() if u.scheme == "rediss" else None
        self._user = username or (unquote(u.username) if u.username else None)
        self._password = password or (unquote(u.password) if u.password else None)
        db = u.path.lstrip("/") if u.scheme != "unix" else ""
        self._db = int(db) if db.isdigit() else 0
        self._timeout = timeout_s
        self._proto: _Protocol | None = None
        self._connecting: asyncio.Task[_Protocol] | None = None
        self._watchdog: asyncio.Task[None] | None = None

    async def call(self, *args: Any) -> Any:
        proto = self._proto
        if proto is None or proto.closed:
            proto = await self._connect()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        proto.send(encode(args), fut, time.monotonic())
        return await fut

    async def _connect(self) -> _Protocol:
        if self._connecting is None or self._connecting.done():
            self._connecting = asyncio.get_running_loop().create_task(self._open())
        try:
            return await asyncio.shield(self._connecting)
        except (OSError, TimeoutError, ReplyError) as exc:
            raise WireDown(f"cannot connect: {exc}") from None

    async def _open(self) -> _Protocol:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._timeout):
            if self._unix is not None:
                _, proto = await loop.create_unix_connection(lambda: _Protocol(self), self._unix)
            else:
                _, proto = await loop.create_connection(
                    lambda: _Protocol(self), self._host, self._port, ssl=self._ssl
                )
            hello: list[tuple[Any, ...]] = []
            if self._password is not None:
                hello.append(("AUTH", self._user, self._password) if self._user else ("AUTH", self._password))
            if self._db:
                hello.append(("SELECT", self._db))
            for cmd in hello:
                fut: asyncio.Future[Any] = loop.create_future()
                proto.send(encode(tuple(a for a in cmd if a is not None)), fut, time.monotonic())
                await fut
        self._proto = proto
        if self._watchdog is None or self._watchdog.done():
            self._watchdog = loop.create_task(self._watch())
        return proto

    def _lost(self, proto: _Protocol) -> None:
        if self._proto is proto:
            self._proto = None

    async def _watch(self) -> None:
        """Fail the connection when its oldest call waited longer than `timeout_s`."""
        period = min(0.1, self._timeout / 4)
        while True:
            await asyncio.sleep(period)
            proto = self._proto
            if proto is not None and proto.pending and time.monotonic() - proto.pending[0][1] > self._timeout:
                proto.fail(WireDown(f"no answer within {self._timeout}s"))

    async def aclose(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watchdog
        if self._proto is not None:
            self._proto.fail(WireDown("closed"))
