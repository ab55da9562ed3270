"""Our request/response cycle for uvicorn's httptools protocol: one write per response head, and a
disconnect callback instead of a task per request.

**One socket write for a head and the body after it.** uvicorn's `RequestResponseCycle.send` writes
the status line and headers as soon as the app sends `http.response.start`, then the body in a second
write. On loopback every `send(2)` also runs the receiver's TCP processing and wakes it, so for a
small JSON answer the second write is a measurable part of the gateway's cost per request, and a
stream's head and first event go out as two segments. An app that knows
its body follows at once marks the start message with `COALESCE` (gateway/core/responses.py:
`"gateway.coalesce": True`, a key other ASGI servers ignore); the cycle then builds the head itself
— as uvicorn does, minus its two regular-expression checks per header, since a marked start carries
only headers the gateway made — and writes it in front of the next body write. Body framing,
content-length checks and keep-alive stay uvicorn's own code: for that next body message the cycle
only swaps the object uvicorn's `send` writes to.

**Disconnect callback.** Noticing that a client went away through ASGI means a task parked on
`receive()` for every request in flight. The cycle offers `scope["extensions"][DISCONNECT]`: a
function that sets (or, with None, clears) one callback, called when the connection is lost before
the response completed — synchronously from the protocol's `connection_lost`, or at once if that
already happened. The gateway falls back to a `receive()` task under servers without it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from gateway.core.responses import COALESCE, DISCONNECT
from gateway.edge.http_guard import GuardedHttpToolsProtocol

Callback = Callable[[], None]


class _PrependHead:
    """Stands in for the transport during the next body send: the first write carries the head."""

    __slots__ = ("head", "real")

    def __init__(self, real: Any, head: bytes) -> None:
        self.real = real
        self.head = head

    def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        self.real.write(head + data if head else data)

    def close(self) -> None:
        self.flush()
        self.real.close()

    def is_closing(self) -> bool:
        return bool(self.real.is_closing())

    def flush(self) -> None:
        if self.head:
            head, self.head = self.head, b""
            self.real.write(head)


class GatewayCycle(RequestResponseCycle):
    """uvicorn's cycle, holding a `COALESCE`-marked head until the body's first write, with a
    disconnect callback. Installed by `GatewayHttpProtocol` (below)."""

    _held = b""
    _on_disconnect: Callback | None = None

    # -- disconnect -------------------------------------------------------------------------------
    def on_disconnect(self, callback: Callback | None) -> None:
        """Set (None: clear) the callback for a client that leaves before the response completed."""
        if callback is not None and self.disconnected:
            callback()
            return
        self._on_disconnect = callback

    def connection_lost(self) -> None:
        """Called by the protocol after uvicorn's own `connection_lost` handling."""
        callback = self._on_disconnect
        if callback is not None and self.disconnected:
            self._on_disconnect = None
            callback()

    # -- sending ----------------------------------------------------------------------------------
    async def send(self, message: Any) -> None:
        if self._held:
            await self._send_after_head(message)
        elif message["type"] == "http.response.start" and message.get(COALESCE) and not self.response_started:
            if self.flow.write_paused and not self.disconnected:
                await self.flow.drain()
            if not self.disconnected:
                self._held = self._head(message)
        else:
            await super().send(message)

    def _head(self, message: Any) -> bytes:
        """The head uvicorn would write for `message`, built without its per-header checks (two
        regular expressions per header): a marked start carries only headers the gateway built —
        lower-case names, values that are constants, numbers, checked ids or `safe_header_value`
        output — and never `transfer-encoding` or `connection`, whose handling stays uvicorn's."""
        self.response_started = True
        self.waiting_for_100_continue = False
        status = message["status"]
        if self.access_log:
            self.access_logger.info(
                '%s - "%s %s HTTP/%s" %d',
                get_client_addr(self.scope),
                self.scope["method"],
                get_path_with_query_string(self.scope),
                self.scope["http_version"],
                status,
            )
        content = [STATUS_LINE[status]]
        for name, value in self.default_headers:
            content += (name, b": ", value, b"\r\n")
        for name, value in message.get("headers", ()):
            if name == b"content-length":
                self.expected_content_length = int(value)
                self.chunked_encoding = False
            content += (name, b": ", value, b"\r\n")
        if not self.keep_alive:
            content.append(b"connection: close\r\n")
        if self.chunked_encoding is None and self.scope["method"] != "HEAD" and status not in (204, 304):
            self.chunked_encoding = True
            content.append(b"transfer-encoding: chunked\r\n")
        content.append(b"\r\n")
        return b"".join(content)

    async def _send_after_head(self, message: Any) -> None:
        real = self.transport
        prepend = _PrependHead(real, self._held)
        self._held = b""
        self.transport = prepend  # type: ignore[assignment]
        try:
            await super().send(message)
        finally:
            self.transport = real
            if not self.disconnected and not real.is_closing():
                prepend.flush()  # the message wrote nothing (e.g. an empty body with more to come)


class GatewayHttpProtocol(GuardedHttpToolsProtocol):
    """The protocol `gateway serve` runs: uvicorn's httptools protocol with the head guard
    (gateway/edge/http_guard.py), whose every request gets a `GatewayCycle`."""

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        cycle = self.cycle
        if type(cycle) is RequestResponseCycle:
            # The cycle uvicorn just built (its task has not run yet) becomes ours: same fields, a
            # coalesced head write and a disconnect callback.
            cycle.__class__ = GatewayCycle
            cycle.scope["extensions"] = {DISCONNECT: cycle.on_disconnect}  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        super().connection_lost(exc)
        cycle = self.cycle
        if type(cycle) is GatewayCycle:
            cycle.connection_lost()
