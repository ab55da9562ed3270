"""`AiohttpTransport`: the engines' HTTP client over aiohttp (`upstream.client: aiohttp`), the interface of
gateway/upstream/transport.py. Not the default (gateway/upstream/h1.py is): gateway/app.py imports
this module only when it is chosen, so a gateway that does not use it does not pay aiohttp's import
(~0.1 s of every process's start-up)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping

import aiohttp

from gateway.upstream.transport import (
    JSON_HEADERS,
    ConnectFailed,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
)


class _AiohttpResponse:
    __slots__ = ("_resp", "status")

    def __init__(self, resp: aiohttp.ClientResponse) -> None:
        self._resp = resp
        self.status = resp.status

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (aiohttp.ClientError, ConnectionError) as exc:
            raise UpstreamError(f"upstream read failed: {type(exc).__name__}") from None

    async def chunks(self) -> AsyncIterator[bytes]:
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


class AiohttpTransport:
    """Pooled keep-alive HTTP/1.1 client for all backends. Create inside a running event loop."""

    def __init__(
        self, *, connect_timeout_s: float, max_per_host: int = 1024, keepalive_s: float = 30.0
    ) -> None:
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
