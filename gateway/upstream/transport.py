"""Talking HTTP to the engines: one narrow interface, one pooled implementation.

    UpstreamError            the engine could not be reached or stopped answering
    ├── ConnectFailed        refused, reset or unreachable before a status line (safe to retry)
    └── UpstreamTimeout      connect / first byte / idle timeout (safe to retry before the first byte)

`Transport.request` returns once the engine's status line and headers are in; the caller then reads
the body whole (`read`) or as it arrives (`chunks`), and must `close()` the response when done. Closing
a response whose body was not fully read drops the connection, which is how an engine learns that
the client went away and stops generating.

Two implementations, chosen by `upstream.client` (the table `TRANSPORTS` in gateway/app.py):
`H1Transport` (gateway/upstream/h1.py, the default: raw asyncio + httptools, one pool of keep-alive connections
per backend, TCP_NODELAY) and `AiohttpTransport` below (aiohttp's client, the previous default). By
measurement (`python -m bench.transports`: zero-latency simulator, uvloop, concurrency 16, this
process's CPU per request, median of 5 alternating rounds of 2000):

    client     non-streamed: CPU µs/req  req/s     streamed (32 tokens): CPU µs/req  req/s
    h1                   48              2015                          206            490
    aiohttp             140               993                          313            426
    httpx              1544               160                         1999            111

Timeouts other than connect are applied by the caller, where the request's phase is known.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Final, Protocol

if TYPE_CHECKING:  # imported where it is used: only AiohttpTransport (not the default) needs it, and
    import aiohttp  # importing it costs every gateway process ~0.1 s of start-up


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


class _AiohttpResponse:
    __slots__ = ("_resp", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status

    async def read(self) -> bytes:
        import aiohttp

        try:
            return await self._resp.read()
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise UpstreamError(f"upstream read failed: {type(exc).__name__}") from None

    async def chunks(self) -> AsyncIterator[bytes]:
        import aiohttp

        content = self._resp.content
        try:
            while True:
                data = await content.readany()
                if not data:
                    return
                yield data
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise UpstreamError(f"upstream stream broken: {type(exc).__name__}") from None

    def close(self) -> None:
        # release() keeps the connection when the body was consumed; close() drops it otherwise.
        if self._resp.content.at_eof():
            self._resp.release()
        else:
            self._resp.close()


#: what a request to an engine carries when the caller gives no headers (h1.py writes the same bytes);
#: a caller that adds one (the proxy's `traceparent`) starts from these
JSON_HEADERS: Final = {"content-type": "application/json", "accept": "application/json, text/event-stream"}


class AiohttpTransport:
    """Pooled keep-alive HTTP/1.1 client for all backends. Create inside a running event loop."""

    def __init__(
        self, *, connect_timeout_s: float, max_per_host: int = 1024, keepalive_s: float = 30.0
    ) -> None:
        import aiohttp

        connector = aiohttp.TCPConnector(
            limit=0,
            limit_per_host=max_per_host,
            keepalive_timeout=keepalive_s,
            ttl_dns_cache=300,
            enable_cleanup_closed=False,
        )
        self._session = aiohttp.ClientSession(
            connector=connector,
            timeout=aiohttp.ClientTimeout(
                total=None, connect=None, sock_connect=connect_timeout_s, sock_read=None
            ),
            auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            raise_for_status=False,
        )

    async def request(
        self, method: str, url: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> UpstreamResponse:
        import aiohttp

        try:
            resp = await self._session.request(
                method, url, data=body, headers=headers or JSON_HEADERS, allow_redirects=False
            )
        except (TimeoutError, aiohttp.ServerTimeoutError):
            raise UpstreamTimeout("connect") from None
        except (aiohttp.ClientError, ConnectionError, OSError) as exc:
            raise ConnectFailed(f"upstream connect failed: {type(exc).__name__}") from None
        return _AiohttpResponse(resp)

    async def aclose(self) -> None:
        await self._session.close()
        await asyncio.sleep(0)
