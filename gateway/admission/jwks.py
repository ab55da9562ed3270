"""A JWKS endpoint's keys, cached by `kid`, refreshed without ever blocking a request for long.

Contract:
- `keys_for(kid)` answers from the cache. An unknown `kid` triggers one refresh (shared by every
  request that asks at the same time), at most once per `min_refresh_s` — a flood of invented kids
  cannot turn the gateway into a load generator against the identity provider.
- A background task refreshes every `refresh_s` (key rotation without restart).
- A failed fetch (endpoint down, bad JSON, no usable key) keeps the last good keys; only a
  successful fetch replaces them, so an outage of the identity provider never locks users out.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Collection
from typing import TYPE_CHECKING, Any

import orjson

from gateway.admission.jwt_keys import VerifyKey, from_jwk

if TYPE_CHECKING:  # imported when a JWKS URL is configured: it is ~0.1 s of every gateway's start-up
    import httpx

log = logging.getLogger("gateway.auth")

Fetch = Callable[[], Awaitable[bytes]]

#: the background refresh: a provider publishes a new key well ahead of signing with it
REFRESH_S = 300.0
#: an unknown `kid` refreshes at most this often: a rotated key is seen within 10 s, a flood of
#: invented kids costs the provider one fetch in 10 s
MIN_REFRESH_S = 10.0
#: a fetch's timeout: the last good keys keep serving meanwhile
TIMEOUT_S = 3.0


class JwksCache:
    def __init__(
        self,
        url: str,
        algorithms: Collection[str],
        *,
        refresh_s: float = REFRESH_S,
        min_refresh_s: float = MIN_REFRESH_S,
        timeout_s: float = TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = url
        self._algorithms = frozenset(algorithms)
        self._refresh_s = refresh_s
        self._min_refresh_s = min_refresh_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._by_kid: dict[str | None, list[VerifyKey]] = {}
        self._last_attempt = -float("inf")
        self._inflight: asyncio.Task[bool] | None = None
        self._client: httpx.AsyncClient | None = None
        self._refresher: asyncio.Task[None] | None = None
        self.fetches = 0
        self.failures = 0

    async def start(self) -> None:
        """First fetch (failure is logged, not fatal: keys arrive with a later refresh) and the
        periodic refresher."""
        import httpx

        self._client = httpx.AsyncClient(timeout=self._timeout_s, follow_redirects=False)
        await self.refresh()
        self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    async def aclose(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher
        if self._client is not None:
            await self._client.aclose()

    async def keys_for(self, kid: str | None) -> list[VerifyKey]:
        """Keys that may have signed a token with this `kid` (every key when the token has none)."""
        if kid is None:
            return [k for keys in self._by_kid.values() for k in keys]
        found = self._by_kid.get(kid)
        if found is not None:
            return found
        if self._clock() - self._last_attempt >= self._min_refresh_s:
            await self.refresh()
        return self._by_kid.get(kid, [])

    async def refresh(self) -> bool:
        """Fetch now (joining a fetch already under way). True when the keys were replaced."""
        if self._inflight is None or self._inflight.done():
            self._inflight = asyncio.get_running_loop().create_task(self._fetch())
        return await asyncio.shield(self._inflight)

    async def _fetch(self) -> bool:
        self._last_attempt = self._clock()
        self.fetches += 1
        try:
            assert self._client is not None, "start() first"
            resp = await self._client.get(self.url, headers={"accept": "application/json"})
            resp.raise_for_status()
            keys = self._parse(resp.content)
        except Exception as exc:
            self.failures += 1
            log.warning("JWKS fetch from %s failed (keeping %d known keys): %s", self.url, self.size, exc)
            return False
        self._by_kid = keys
        log.info("JWKS from %s: %d usable keys", self.url, self.size)
        return True

    def _parse(self, body: bytes) -> dict[str | None, list[VerifyKey]]:
        doc: Any = orjson.loads(body)
        entries = doc.get("keys") if isinstance(doc, dict) else None
        if not isinstance(entries, list):
            raise ValueError("not a JWKS document (no 'keys' array)")
        out: dict[str | None, list[VerifyKey]] = {}
        for entry in entries:
            key = from_jwk(entry, self._algorithms) if isinstance(entry, dict) else None
            if key is not None:
                out.setdefault(key.kid, []).append(key)
        if not out:
            raise ValueError("the JWKS document has no usable signing key")
        return out

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self._refresh_s)
            await self.refresh()

    @property
    def size(self) -> int:
        return sum(len(v) for v in self._by_kid.values())
