"""GatewayCycle (gateway/edge/http_cycle.py) over a recording transport: one write for a marked head and its
body, uvicorn's framing unchanged, and the disconnect callback."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl

from gateway.core.responses import COALESCE
from gateway.edge.http_cycle import GatewayCycle
from tests.support import until


class Recorder:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def make_cycle(keep_alive: bool = True, method: str = "POST") -> tuple[GatewayCycle, Recorder]:
    transport = Recorder()
    scope: Any = {"type": "http", "method": method, "http_version": "1.1", "path": "/"}
    cycle = GatewayCycle(
        scope=scope,
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=[(b"date", b"Sun, 29 Nov 2026 10:00:00 GMT"), (b"server", b"test")],
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )
    return cycle, transport


def start(marked: bool, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    message: dict[str, Any] = {"type": "http.response.start", "status": 200, "headers": headers}
    if marked:
        message[COALESCE] = True
    return message


async def test_a_marked_head_goes_out_with_the_body_in_one_write() -> None:
    cycle, transport = make_cycle()
    await cycle.send(start(True, [(b"content-length", b"2")]))
    assert transport.writes == []
    await cycle.send({"type": "http.response.body", "body": b"{}"})
    assert len(transport.writes) == 1
    head, _, body = transport.writes[0].partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-length: 2" in head
    assert body == b"{}"
    assert cycle.response_complete


async def test_an_unmarked_head_is_written_at_once_as_uvicorn_does() -> None:
    cycle, transport = make_cycle()
    await cycle.send(start(False, [(b"content-length", b"2")]))
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\n")
    await cycle.send({"type": "http.response.body", "body": b"{}"})
    assert transport.writes[1] == b"{}"


async def test_a_chunked_stream_carries_its_head_in_the_first_chunk_only() -> None:
    cycle, transport = make_cycle()
    await cycle.send(start(True, [(b"content-type", b"text/event-stream")]))
    await cycle.send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
    await cycle.send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": True})
    await cycle.send({"type": "http.response.body", "body": b"", "more_body": False})
    first, second, last = transport.writes
    assert first.startswith(b"HTTP/1.1 200 OK\r\n") and b"transfer-encoding: chunked" in first
    assert first.endswith(b"\r\n\r\n9\r\ndata: 1\n\n\r\n")
    assert second == b"9\r\ndata: 2\n\n\r\n" and last == b"0\r\n\r\n"


async def test_an_empty_first_body_message_still_sends_the_head() -> None:
    cycle, transport = make_cycle()
    await cycle.send(start(True, [(b"content-type", b"text/event-stream")]))
    await cycle.send({"type": "http.response.body", "body": b"", "more_body": True})
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"HTTP/1.1 200 OK")


async def test_a_closing_response_writes_the_head_before_closing() -> None:
    cycle, transport = make_cycle(keep_alive=False)
    await cycle.send(start(True, [(b"content-length", b"2")]))
    await cycle.send({"type": "http.response.body", "body": b"ok"})
    assert len(transport.writes) == 1 and transport.writes[0].endswith(b"\r\n\r\nok")
    assert b"connection: close" in transport.writes[0] and transport.closed


async def test_uvicorns_checks_still_apply() -> None:
    cycle, _ = make_cycle()
    await cycle.send(start(True, [(b"content-length", b"1")]))
    with pytest.raises(RuntimeError, match="longer than Content-Length"):
        await cycle.send({"type": "http.response.body", "body": b"too long"})


async def test_nothing_is_held_for_a_client_already_gone() -> None:
    cycle, transport = make_cycle()
    cycle.disconnected = True
    await cycle.send(start(True, [(b"content-length", b"2")]))
    await cycle.send({"type": "http.response.body", "body": b"{}"})
    assert transport.writes == []


def test_the_disconnect_callback_fires_once_when_the_client_leaves_mid_response() -> None:
    cycle, _ = make_cycle()
    calls: list[str] = []
    cycle.on_disconnect(lambda: calls.append("gone"))
    cycle.connection_lost()  # the protocol calls it after its own handling; not disconnected yet
    assert calls == []
    cycle.disconnected = True
    cycle.connection_lost()
    cycle.connection_lost()
    assert calls == ["gone"]


def test_a_cleared_callback_is_not_called() -> None:
    cycle, _ = make_cycle()
    calls: list[str] = []
    cycle.on_disconnect(lambda: calls.append("gone"))
    cycle.on_disconnect(None)
    cycle.disconnected = True
    cycle.connection_lost()
    assert calls == []


def test_registering_after_the_client_left_fires_at_once() -> None:
    cycle, _ = make_cycle()
    cycle.disconnected = True
    calls: list[str] = []
    cycle.on_disconnect(lambda: calls.append("gone"))
    assert calls == ["gone"]


async def test_under_uvicorn_with_our_protocol_the_callback_reports_a_client_that_left() -> None:
    """A real uvicorn server on a real port with GatewayHttpProtocol: the app finds the
    extension, answers a marked head + body intact, and hears of a client that closes mid-request."""
    import socket

    import uvicorn

    from gateway.core.responses import DISCONNECT
    from gateway.edge.http_cycle import GatewayHttpProtocol

    left, release = asyncio.Event(), asyncio.Event()
    seen: list[bool] = []

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        setter = scope.get("extensions", {}).get(DISCONNECT)
        seen.append(setter is not None)
        if scope["path"] == "/hang":
            setter(left.set)
            await release.wait()
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                COALESCE: True,
                "headers": [(b"content-length", b"2")],
            }
        )
        await send({"type": "http.response.body", "body": b"ok"})

    config = uvicorn.Config(app, lifespan="off", http=GatewayHttpProtocol, log_level="error")
    server = uvicorn.Server(config)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        await until(lambda: server.started, what="the server to listen")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /ok HTTP/1.1\r\nhost: x\r\n\r\n")
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 200 OK") and await reader.readexactly(2) == b"ok"
        writer.write(b"GET /hang HTTP/1.1\r\nhost: x\r\n\r\n")
        await writer.drain()
        await until(lambda: len(seen) == 2, what="both requests seen")
        writer.close()
        await asyncio.wait_for(left.wait(), 5)
        assert seen == [True, True]
    finally:
        release.set()
        server.should_exit = True
        await asyncio.wait_for(task, 10)
        sock.close()


@pytest.mark.parametrize(
    ("status", "headers", "body", "keep_alive", "method"),
    [
        (200, [(b"content-type", b"application/json"), (b"content-length", b"2")], b"{}", True, "POST"),
        (
            429,
            [(b"retry-after", b"3"), (b"x-request-id", b"req_1"), (b"content-length", b"2")],
            b"{}",
            True,
            "POST",
        ),
        (
            200,
            [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            b"data: x\n\n",
            True,
            "POST",
        ),
        (200, [(b"content-length", b"2")], b"{}", False, "POST"),
        (200, [(b"content-type", b"text/event-stream")], b"data: x\n\n", False, "POST"),
        (200, [(b"content-length", b"2")], b"", True, "HEAD"),
        (204, [], b"", True, "POST"),
    ],
)
async def test_the_head_we_build_is_byte_for_byte_uvicorns(
    status: int, headers: list[tuple[bytes, bytes]], body: bytes, keep_alive: bool, method: str
) -> None:
    """Same bytes on the wire, and the same framing state, as uvicorn's own send for the message."""
    wire: list[bytes] = []
    states = []
    for marked in (True, False):
        cycle, transport = make_cycle(keep_alive=keep_alive, method=method)
        await cycle.send(start(marked, list(headers)) | {"status": status})
        await cycle.send({"type": "http.response.body", "body": body})
        wire.append(b"".join(transport.writes))
        states.append((cycle.response_complete, cycle.chunked_encoding, transport.closed))
    assert wire[0] == wire[1]
    assert states[0] == states[1]
