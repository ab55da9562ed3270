"""Talking HTTP to the engines: one narrow interface, one pooled implementation.

    UpstreamError            the engine could not be reached or stopped answering
    ├── ConnectFailed        refused, reset or unreachable before a status line (safe to retry)
    └── UpstreamTimeout      connect / first byte / idle timeout (safe to retry before the first byte)

`Transport.request` returns once the engine's status line and headers are in; the caller then reads
the body whole (`read`) or as it arrives (`chunks`), and must `close()` the response when done. Closing
a response whose body was not fully read drops the connection, which is how an engine learns that
the client went away and stops generating.

The implementation is `H1Transport` (gateway/upstream/h1.py: raw asyncio + httptools, one pool of
keep-alive connections per backend, TCP_NODELAY), chosen over aiohttp's and httpx's clients by CPU per
request (`python -m bench.transports`: zero-latency simulator, uvloop, concurrency 16): 48 µs per
non-streamed request against aiohttp's 140 and httpx's 1,544. Tests drive the proxy through fakes of
the same interface.

Timeouts other than connect are applied by the caller, where the request's phase is known.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Final, Protocol


class UpstreamError(Exception):
    """The engine could not be reached or stopped answering. `kind` labels metrics."""

    kind = "error"


class ConnectFailed(UpstreamError):
    kind = "connect"


class UpstreamTimeout(UpstreamError):
    kind = "timeout"

    def __init__(self, phase: str) -> None:
        super().__init__(f"upstream {phase} timeout")
        self.phase = phase


class UpstreamResponse(Protocol):
    status: int

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (arbitrary boundaries)."""
        ...

    def close(self) -> None:
        """Release the connection; drops it if the body was not read to the end."""
        ...


class Transport(Protocol):
    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> UpstreamResponse: ...

    async def aclose(self) -> None: ...


#: what a request to an engine carries when the caller gives no headers (h1.py writes the same bytes);
#: a caller that adds one (the proxy's `traceparent`) starts from these
JSON_HEADERS: Final = {"content-type": "application/json", "accept": "application/json, text/event-stream"}
