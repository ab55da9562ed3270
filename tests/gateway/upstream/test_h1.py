"""H1Transport against real servers on loopback: uvicorn (in this process) and raw asyncio servers.

Every test runs on both the default asyncio loop and uvloop (the gateway's). Waits are bounded by
generous `asyncio.timeout`s that only fail a hung test; nothing asserts on durations.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import uvicorn
import uvloop
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.core.stalls import HELD_S
from gateway.upstream.h1 import HIGH_WATER, H1Transport, _Connection, _Origin
from gateway.upstream.transport import ConnectFailed, UpstreamError, UpstreamTimeout
from tests.support import examples, one_turn, until

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
ASGIApp = Callable[[dict[str, Any], Any, Any], Awaitable[None]]


# Overriding event_loop_policy is how this pytest-asyncio runs a module on two loops without a conftest hook.
pytestmark = pytest.mark.filterwarnings('ignore:Overriding the "event_loop_policy":DeprecationWarning')


@pytest.fixture(params=["asyncio", "uvloop"])
def event_loop_policy(request: pytest.FixtureRequest) -> asyncio.AbstractEventLoopPolicy:
    policy: asyncio.AbstractEventLoopPolicy = (
        uvloop.EventLoopPolicy() if request.param == "uvloop" else asyncio.DefaultEventLoopPolicy()
    )
    return policy


# -- servers ---------------------------------------------------------------------------------------
class RawServer:
    """An asyncio server on 127.0.0.1 running `handler` per connection, counting accepted ones."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.accepted = 0
        self.closed = 0
        self.url = ""
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._on_connection, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()

    async def _on_connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            await self.handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            self.closed += 1


async def read_request(reader: asyncio.StreamReader) -> bytes | None:
    """One request (head + Content-Length body), or None at EOF."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        return None
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head + await reader.readexactly(length)


def ok(body: bytes, *extra: bytes) -> bytes:
    lines = [b"HTTP/1.1 200 OK", b"Content-Length: %d" % len(body), *extra]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


async def answer_all(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    while await read_request(reader) is not None:
        writer.write(ok(b"hello"))


async def stall_forever(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await read_request(reader)
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
    await reader.read()  # until the client goes away


class Uvicorn:
    """A uvicorn server (httptools) in this event loop serving a raw ASGI app; records client ports."""

    def __init__(self, app: ASGIApp) -> None:
        self.ports: list[int] = []
        self.disconnected = asyncio.Event()

        async def recording(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "http":
                self.ports.append(scope["client"][1])
                await app(scope, receive, send)

        config = uvicorn.Config(recording, lifespan="off", http="httptools", log_level="error")
        self.server = uvicorn.Server(config)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Uvicorn:
        self._task = asyncio.create_task(self.server.serve(sockets=[self.sock]))
        await until(lambda: self.server.started)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.should_exit = True
        assert self._task is not None
        await self._task
        self.sock.close()


async def asgi_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """/length: Content-Length body; /chunked: a body in three chunks; /echo: the request body."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    path = scope["path"]
    if path == "/chunked":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (b"one,", b"two,", b"three"):
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        return
    out = body if path == "/echo" else b"x" * 1000
    headers = [(b"content-length", str(len(out)).encode())]
    await send({"type": "http.response.start", "status": 201, "headers": headers})
    await send({"type": "http.response.body", "body": out})


@contextlib.asynccontextmanager
async def client(**kw: Any) -> AsyncIterator[H1Transport]:
    t = H1Transport(connect_timeout_s=kw.pop("connect_timeout_s", 2.0), **kw)
    try:
        yield t
    finally:
        await t.aclose()


async def get(t: H1Transport, url: str, body: bytes | None = None) -> tuple[int, bytes]:
    resp = await t.request("POST" if body is not None else "GET", url, body)
    try:
        return resp.status, await resp.read()
    finally:
        resp.close()


# -- against uvicorn -------------------------------------------------------------------------------
async def test_keep_alive_reuses_one_connection() -> None:
    async with Uvicorn(asgi_app) as srv, client() as t:
        for i in range(20):
            status, body = await get(t, srv.url + "/echo", b'{"n": %d}' % i)
            assert (status, body) == (201, b'{"n": %d}' % i)
        assert len(srv.ports) == 20 and len(set(srv.ports)) == 1


async def test_content_length_and_chunked_bodies() -> None:
    async with Uvicorn(asgi_app) as srv, client() as t:
        assert await get(t, srv.url + "/length") == (201, b"x" * 1000)
        assert await get(t, srv.url + "/chunked", b"{}") == (200, b"one,two,three")
        resp = await t.request("GET", srv.url + "/chunked")
        assert b"".join([c async for c in resp.chunks()]) == b"one,two,three"
        resp.close()
        assert len(set(srv.ports)) == 1


async def test_stream_chunks_arrive_as_sent() -> None:
    gate = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await gate.wait()  # the second event exists only once the client has the first
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with Uvicorn(app) as srv, client() as t, asyncio.timeout(10):
        resp = await t.request("POST", srv.url + "/v1/chat/completions", b"{}")
        it = resp.chunks()
        assert await it.__anext__() == b"data: 1\n\n"
        gate.set()
        assert [c async for c in it] == [b"data: 2\n\n"]
        resp.close()


async def test_close_mid_stream_drops_the_connection() -> None:
    async def endless(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["path"] != "/stream":
            await asgi_app(scope, receive, send)
            return

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            srv.disconnected.set()

        watcher = asyncio.create_task(watch())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        while not srv.disconnected.is_set():
            await send({"type": "http.response.body", "body": b"data: tok\n\n", "more_body": True})
            await one_turn()  # the watcher runs between chunks
        await watcher

    srv = Uvicorn(endless)
    async with srv, client() as t, asyncio.timeout(10):
        resp = await t.request("POST", srv.url + "/stream", b"{}")
        it = resp.chunks()
        await it.__anext__()
        resp.close()
        await srv.disconnected.wait()  # the engine learns at once that nobody listens
        with pytest.raises(UpstreamError):
            await it.__anext__()
        # the dropped connection is not reused
        await get(t, srv.url + "/other")
        assert len(set(srv.ports)) == 2


# -- raw servers: edge cases -----------------------------------------------------------------------
async def test_close_from_another_task_wakes_a_pending_read() -> None:
    async with RawServer(stall_forever) as srv, client() as t, asyncio.timeout(10):
        resp = await t.request("POST", srv.url + "/", b"{}")
        it = resp.chunks()
        assert await it.__anext__() == b"first"

        async def next_chunk() -> bytes:
            return await anext(it)

        pending = asyncio.create_task(next_chunk())
        await one_turn()  # let it block
        assert not pending.done()
        resp.close()
        with pytest.raises(UpstreamError):
            await pending
        # and read() the same way
        resp = await t.request("POST", srv.url + "/", b"{}")
        reading = asyncio.create_task(resp.read())
        await one_turn()
        resp.close()
        with pytest.raises(UpstreamError):
            await reading


async def test_stale_pooled_connection_is_retried_once() -> None:
    """The engine takes the second request on a kept-alive socket, then closes it without a byte."""
    requests = 0

    async def one_per_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while await read_request(reader) is not None:
            requests += 1
            if requests == 2:
                return  # close without answering
            writer.write(ok(b"fine"))

    async with RawServer(one_per_connection) as srv, client() as t, asyncio.timeout(10):
        assert await get(t, srv.url + "/", b"{}") == (200, b"fine")
        assert await get(t, srv.url + "/", b"{}") == (200, b"fine")
        assert (srv.accepted, requests) == (2, 3)


async def test_idle_connection_closed_by_server_is_not_used() -> None:
    async def close_after_answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"once"))
        await writer.drain()

    async with RawServer(close_after_answer) as srv, client() as t, asyncio.timeout(10):
        for _ in range(5):  # whether or not the client has seen the FIN yet, each request succeeds
            assert await get(t, srv.url + "/", b"{}") == (200, b"once")
            if srv.accepted % 2:
                await until(lambda: srv.closed == srv.accepted)
        assert srv.accepted == 5


async def test_no_retry_once_part_of_the_answer_arrived() -> None:
    requests = 0

    async def cut_second(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        while await read_request(reader) is not None:
            requests += 1
            if requests == 2:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
                return
            writer.write(ok(b"fine"))

    async with RawServer(cut_second) as srv, client() as t, asyncio.timeout(10):
        await get(t, srv.url + "/", b"{}")
        with pytest.raises(UpstreamError) as info:
            await get(t, srv.url + "/", b"{}")
        assert not isinstance(info.value, ConnectFailed)
        assert requests == 2


async def test_fresh_connection_closed_before_answer_is_connect_failed() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)

    async with RawServer(hang_up) as srv, client() as t, asyncio.timeout(10):
        with pytest.raises(ConnectFailed):
            await t.request("POST", srv.url + "/", b"{}")
        assert srv.accepted == 1


async def test_connection_refused() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    async with client() as t:
        with pytest.raises(ConnectFailed) as info:
            await t.request("POST", f"http://127.0.0.1:{port}/v1/chat/completions", b"{}")
    assert "127.0.0.1" not in str(info.value) and str(port) not in str(info.value)


async def test_connect_timeout() -> None:
    """A listener whose accept queue is full drops further SYNs: the connect hangs."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(3):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        fillers.append(s)
    try:
        async with client(connect_timeout_s=0.2) as t, asyncio.timeout(10):
            with pytest.raises(UpstreamTimeout) as info:
                await t.request("GET", f"http://127.0.0.1:{port}/health")
            assert info.value.phase == "connect"
    finally:
        for s in (*fillers, listener):
            s.close()


async def test_a_connect_timeout_that_measured_this_process_stall_connects_again() -> None:
    """The event loop held past the connect deadline (a stopped host, a long callback) while the
    engine's kernel accepted: the due timeout runs before the connect's completion is read, and
    measured the stall, not the engine - so the transport connects again and the request goes
    through. A stall shorter than `HELD_S` past the deadline is still a timeout."""
    async with Uvicorn(asgi_app) as srv, client(connect_timeout_s=0.2) as t:
        task = asyncio.ensure_future(get(t, srv.url + "/echo", b'{"n": 1}'))
        await one_turn()  # the request has started its connect (an IP address: no lookup)
        time.sleep(0.2 + HELD_S + 0.3)  # noqa: ASYNC251 - the point: the loop held past the deadline
        assert await asyncio.wait_for(task, 10) == (201, b'{"n": 1}')
        assert len(srv.ports) == 1  # the first connection was dropped unused


async def test_server_closing_mid_body() -> None:
    async def cut(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\ndata\r\n")

    async with RawServer(cut) as srv, client() as t, asyncio.timeout(10):
        resp = await t.request("POST", srv.url + "/", b"{}")
        with pytest.raises(UpstreamError):
            await resp.read()
        resp.close()
        resp = await t.request("POST", srv.url + "/", b"{}")
        got = []
        with pytest.raises(UpstreamError):
            async for chunk in resp.chunks():
                got.append(chunk)
        assert b"".join(got) == b"data"
        resp.close()


async def test_connection_close_and_parse_errors_retire_the_connection() -> None:
    async def close_each(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(ok(b"bye", b"Connection: close"))

    async with RawServer(close_each) as srv, client() as t, asyncio.timeout(10):
        for _ in range(3):
            assert await get(t, srv.url + "/", b"{}") == (200, b"bye")
        assert srv.accepted == 3

    async def garbage_then_fine(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc" if srv.accepted > 1 else b"NOT HTTP\r\n\r\n"
        )
        await answer_all(reader, writer)

    srv = RawServer(garbage_then_fine)
    async with srv, client() as t, asyncio.timeout(10):
        with pytest.raises(UpstreamError) as info:
            await t.request("GET", srv.url + "/")
        assert "malformed" in str(info.value)
        assert await get(t, srv.url + "/") == (200, b"abc")
        assert srv.accepted == 2


async def test_body_until_eof() -> None:
    async def old_style(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nto the end")

    async with RawServer(old_style) as srv, client() as t, asyncio.timeout(10):
        assert await get(t, srv.url + "/") == (200, b"to the end")


async def test_slow_reader_keeps_memory_bounded() -> None:
    total = 32 * 1024 * 1024

    async def firehose(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % total)
        block = b"z" * 65536
        for _ in range(total // len(block)):
            writer.write(block)
            await writer.drain()

    async with RawServer(firehose) as srv, client() as t, asyncio.timeout(60):
        resp = await t.request("POST", srv.url + "/", b"{}")
        received = biggest = 0
        async for chunk in resp.chunks():
            received += len(chunk)
            biggest = max(biggest, len(chunk))
            if received < 4 * 1024 * 1024:
                await asyncio.sleep(0.005)  # a consumer far slower than loopback
        resp.close()
        assert received == total
        # what piles up between two reads: the high-water mark plus at most one socket read
        assert biggest <= HIGH_WATER + 1024 * 1024


async def test_idle_expiry_and_idle_bound() -> None:
    async with RawServer(answer_all) as srv, client(keepalive_s=0.05, max_per_host=2) as t:
        await get(t, srv.url + "/")
        (origin,) = t._origins.values()
        for conn in origin.idle:  # idle for longer than keepalive_s, as the loop's clock reads it
            conn.idle_since -= 0.1
        await get(t, srv.url + "/")
        assert srv.accepted == 2
        responses = await asyncio.gather(*(t.request("GET", srv.url + "/") for _ in range(4)))
        for resp in responses:
            await resp.read()
            resp.close()
        assert len(next(iter(t._origins.values())).idle) == 2


async def test_health_style_get_and_custom_headers() -> None:
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (req := await read_request(reader)) is not None:
            seen.append(req)
            writer.write(ok(b""))

    async with RawServer(record) as srv, client() as t:
        await get(t, srv.url + "/health")
        resp = await t.request("POST", srv.url + "/x", b"{}", headers={"X-Test": "1"})
        resp.close()
        with pytest.raises(ValueError):
            await t.request("GET", srv.url + "/", headers={"X-Evil": "a\r\nInjected: 1"})
    host = srv.url.removeprefix("http://").encode()
    assert seen[0].startswith(b"GET /health HTTP/1.1\r\nHost: " + host + b"\r\n")
    assert b"Content-Length" not in seen[0]
    assert seen[1].endswith(b"X-Test: 1\r\nContent-Length: 2\r\n\r\n{}")


# -- parsing, split anywhere -----------------------------------------------------------------------
class _FakeTransport:
    def write(self, data: bytes) -> None:
        pass

    def abort(self) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str) -> None:
        return None


EVENTS = [b'data: {"a":1}\n\n', b'data: {"bb":22}\n\n', b"data: [DONE]\n\n"]
CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    + b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in EVENTS)
    + b"0\r\n\r\n"
)
LENGTH = (
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 Service Unavailable\r\nContent-Length: 11\r\n\r\nbusy, sorry"
)


def _parse(raw: bytes, cuts: list[int]) -> tuple[int, list[tuple[bytes, bytes]], bytes, bool]:
    conn = _Connection(_Origin("engine", 8000, "engine:8000", None))
    conn.connection_made(_FakeTransport())  # type: ignore[arg-type]
    conn.start(reused=False)
    edges = [0, *sorted(set(cuts)), len(raw)]
    for a, b in itertools.pairwise(edges):
        if a < b:
            conn.data_received(raw[a:b])
    assert conn.error is None
    return conn.status, conn.headers, b"".join(conn.body), conn.done


@pytest.mark.parametrize("raw", [CHUNKED, LENGTH], ids=["chunked", "length"])
def test_parse_is_independent_of_chunk_boundaries(raw: bytes) -> None:
    whole = _parse(raw, [])
    assert whole[3]

    @settings(max_examples=examples(300), deadline=None)
    @given(st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=20))
    def split(cuts: list[int]) -> None:
        assert _parse(raw, cuts) == whole

    split()


async def test_extra_answer_retires_and_unread_body_releases() -> None:
    async def double(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await read_request(reader) is not None:
            writer.write(ok(b"one") + (ok(b"two") if srv.accepted == 1 else b""))

    srv = RawServer(double)
    async with srv, client() as t, asyncio.timeout(10):
        assert await get(t, srv.url + "/") == (200, b"one")  # the unasked-for second answer is dropped
        assert await get(t, srv.url + "/") == (200, b"one")
        assert srv.accepted == 2
        resp = await t.request("GET", srv.url + "/")  # closed without reading: the body is complete
        resp.close()
        assert await get(t, srv.url + "/") == (200, b"one")
        assert srv.accepted == 2
