"""Fetching an allowed media URL for an engine, so the engine never fetches it itself.

`MediaFetcher.fetch(url, kind)` returns the media as a `data:` URL, or raises `MediaRefused` with a
reason a client can act on. Each hop of the fetch (the URL, then every redirect, at most
`MAX_REDIRECTS`) is checked by `policies.media`: an `http(s)` URL whose host is on the allow-list,
every address the host resolves to public and none of the gateway's or its engines' own. The
connection goes to the address that was checked (the URL's host travels in `Host` and in TLS's SNI),
so a name that resolves differently a moment later (DNS rebinding) cannot redirect it. The body is
read up to `max_bytes`; the whole fetch, redirects included, is bounded by `timeout_s`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import ipaddress
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urljoin, urlsplit, urlunsplit

from policies.media import RemoteUrl, host_allowed, parse_remote_url, refused_address

#: redirects followed at most, each checked like the first URL
MAX_REDIRECTS = 3
#: how long the resolved addresses of the engines' hosts are reused
ENGINE_ADDRESSES_TTL_S = 60.0
#: how long fetching one allowed URL may take, redirects included: an image host that has not
#: answered in 10 s keeps the request waiting for nothing (the client can send the image inline)
FETCH_TIMEOUT_S = 10.0

if TYPE_CHECKING:  # imported at the first fetch: most gateways never fetch media (no allowed host)
    import httpx

Resolve = Callable[[str, int], Awaitable[list[str]]]


class MediaRefused(Exception):
    """A media URL the gateway does not fetch or forward; `str()` says why, for the client."""


async def resolve_host(host: str, port: int) -> list[str]:
    """The addresses `host` resolves to (the system's resolver, off the event loop's thread)."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


class MediaFetcher:
    """Fetches allowed media URLs; one per gateway process."""

    def __init__(
        self,
        allowed_hosts: Iterable[str],
        max_bytes: int,
        timeout_s: float = FETCH_TIMEOUT_S,
        *,
        engine_hosts: Callable[[], Iterable[str]] = lambda: (),
        resolve: Resolve = resolve_host,
        transport: httpx.AsyncBaseTransport | None = None,
        local: frozenset[str] | None = None,
    ) -> None:
        self._allowed = tuple(allowed_hosts)
        self._max_bytes = max_bytes
        self._timeout_s = timeout_s
        self._engine_hosts = engine_hosts
        self._resolve = resolve
        self._transport = transport
        self._local = local if local is not None else local_addresses()
        self._engines: frozenset[str] = frozenset()
        self._engines_at = -ENGINE_ADDRESSES_TTL_S
        self._client: httpx.AsyncClient | None = None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def fetch(self, url: str, kind: str) -> str:
        """`url`'s body as a `data:` URL of its media type (an `image/*` type for kind `image`, ...)."""
        import httpx

        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._fetch(url, kind)
        except TimeoutError:
            raise MediaRefused(f"fetching it took longer than {self._timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise MediaRefused(f"fetching it failed ({type(exc).__name__})") from None

    async def _fetch(self, url: str, kind: str) -> str:
        client = self._client_now()
        for _ in range(MAX_REDIRECTS + 1):
            remote, address = await self.check(url)
            request = _pinned_request(client, url, remote, address)
            response = await client.send(request, stream=True)
            try:
                location = response.headers.get("location")
                if response.is_redirect and location:
                    url = urljoin(url, location)
                    continue
                if response.status_code != 200:
                    raise MediaRefused(f"its server answered {response.status_code}")
                media_type = _media_type(response, kind)
                body = await self._read(response)
            finally:
                await response.aclose()
            return f"data:{media_type};base64,{base64.b64encode(body).decode()}"
        raise MediaRefused(f"it redirects more than {MAX_REDIRECTS} times")

    async def check(self, url: str) -> tuple[RemoteUrl, str]:
        """`url` parsed and the checked address to connect to; `MediaRefused` when any rule fails."""
        remote = parse_remote_url(url)
        if remote is None:
            raise MediaRefused("only data: URLs and http(s) URLs of allowed hosts are accepted")
        if not host_allowed(remote.host, self._allowed):
            raise MediaRefused(f"the host {remote.host!r} is not on the gateway's media allow-list")
        try:
            addresses = (
                [remote.host] if _is_ip(remote.host) else await self._resolve(remote.host, remote.port)
            )
        except OSError:
            raise MediaRefused(f"the host {remote.host!r} does not resolve") from None
        if not addresses:
            raise MediaRefused(f"the host {remote.host!r} does not resolve")
        own = self._local | await self._engine_addresses()
        for address in addresses:
            why = refused_address(address, own)
            if why is not None:
                raise MediaRefused(f"the host {remote.host!r} resolves to {why}")
        return remote, addresses[0]

    async def _read(self, response: httpx.Response) -> bytes:
        declared = response.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_bytes:
            raise MediaRefused(f"it is larger than {self._max_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in response.aiter_bytes():  # decoded: a compressed body counts as it unpacks
            size += len(chunk)
            if size > self._max_bytes:
                raise MediaRefused(f"it is larger than {self._max_bytes} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    async def _engine_addresses(self) -> frozenset[str]:
        """The engines' addresses (their hosts resolved, reused for a minute): media must not come
        from an engine either."""
        now = time.monotonic()
        if now - self._engines_at < ENGINE_ADDRESSES_TTL_S:
            return self._engines
        found: set[str] = set()
        for host in set(self._engine_hosts()):
            if _is_ip(host):
                found.add(str(ipaddress.ip_address(host)))
                continue
            with contextlib.suppress(OSError):
                found.update(await self._resolve(host, 80))
        self._engines, self._engines_at = frozenset(found), now
        return self._engines

    def _client_now(self) -> httpx.AsyncClient:
        import httpx

        if self._client is None:
            # no proxies from the environment: a proxy would resolve the name itself
            self._client = httpx.AsyncClient(
                transport=self._transport, trust_env=False, follow_redirects=False, timeout=self._timeout_s
            )
        return self._client


def _pinned_request(client: httpx.AsyncClient, url: str, remote: RemoteUrl, address: str) -> httpx.Request:
    """A GET of `url` sent to `address`, with the URL's host in `Host` and (https) in SNI."""
    parts = urlsplit(url)
    literal = f"[{address}]" if ":" in address else address
    netloc = f"{literal}:{remote.port}"
    target = urlunsplit((remote.scheme, netloc, parts.path or "/", parts.query, ""))
    default_port = 443 if remote.scheme == "https" else 80
    host = remote.host if remote.port == default_port else f"{remote.host}:{remote.port}"
    extensions = {"sni_hostname": remote.host} if remote.scheme == "https" else {}
    return client.build_request("GET", target, headers={"host": host}, extensions=extensions)


def _media_type(response: httpx.Response, kind: str) -> str:
    """The media type the body is forwarded as: the server's, when it is of `kind` (or generic)."""
    declared = str(response.headers.get("content-type", "")).split(";", 1)[0].strip().lower()
    if declared.startswith(f"{kind}/"):
        return declared
    if declared in ("", "application/octet-stream", "binary/octet-stream"):
        return "application/octet-stream"
    raise MediaRefused(f"its server sent {declared}, not {'an' if kind[0] in 'aeiou' else 'a'} {kind}")


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def local_addresses() -> frozenset[str]:
    """This host's own interface addresses (IPv4 by `SIOCGIFADDR`, IPv6 from /proc on Linux), for
    refusing a public address that is the gateway's own. Best effort: where neither works, the
    address rules of `policies.media` still refuse every loopback and private range."""
    found: set[str] = set()
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            with contextlib.suppress(OSError):
                packed = struct.pack("256s", name.encode()[:15])
                answer = fcntl.ioctl(s.fileno(), 0x8915, packed)  # SIOCGIFADDR
                found.add(socket.inet_ntoa(answer[20:24]))
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/net/if_inet6").read_text().splitlines():
            raw = line.split()[0]
            found.add(str(ipaddress.IPv6Address(int(raw, 16))))
    return frozenset(found)
