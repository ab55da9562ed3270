"""The auto-pipelining RESP connection against a real redis-server: replies in order, errors,
pipelining of concurrent calls, a restart of Redis, and a server that stops answering."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from gateway.core.redis_wire import ReplyError, RespClient, WireDown, encode
from tests.support import RedisServer

pytestmark = pytest.mark.processes


def test_encode() -> None:
    assert encode(("SET", "k", 5, b"\x00v")) == b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n5\r\n$2\r\n\x00v\r\n"


async def test_calls_errors_and_pipelining(redis_server: RedisServer) -> None:
    c = RespClient(redis_server.url)
    assert await c.call("SET", "wire:k", "v") == b"OK"
    assert await c.call("GET", "wire:k") == b"v"
    with pytest.raises(ReplyError):
        await c.call("INCR", "wire:k")
    results = await asyncio.gather(*(c.call("INCRBY", "wire:n", 1) for _ in range(500)))
    assert sorted(results) == list(range(1, 501))  # every caller got its own reply
    await c.call("DEL", "wire:k", "wire:n")
    await c.aclose()


async def test_refused_then_reconnects_after_a_restart() -> None:
    server = RedisServer().start()
    c = RespClient(server.url, timeout_s=1)
    assert await c.call("PING") == b"PONG"
    server.stop()
    with pytest.raises(WireDown):
        await c.call("PING")
    server = RedisServer(port=server.port).start()
    try:
        assert await c.call("PING") == b"PONG"
    finally:
        await c.aclose()
        server.stop()


async def test_a_silent_server_times_out() -> None:
    server = RedisServer().start()
    assert server.proc is not None
    c = RespClient(server.url, timeout_s=0.4)
    assert await c.call("PING") == b"PONG"
    os.kill(server.proc.pid, signal.SIGSTOP)  # alive but silent
    try:
        with pytest.raises(WireDown, match="no answer"):
            await c.call("PING")
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        await c.aclose()
        server.stop()
