"""Long-lived API keys (`sk-gw-…`) beside JWTs, for clients like the OpenAI SDK.

Lifecycle (called by the admin API):
- `create(spec)` mints a key, stores only its digest with the principal it maps to, and returns the
  plaintext — the only time it exists outside the client's hands.
- `revoke(key_id)` deletes it; `list()` shows every key's record (never a digest or plaintext).

Storage: SHA-256 of the key, or HMAC-SHA256 with `auth.api_keys.pepper` when set. Keys are 256 random
bits, so a digest cannot be inverted by guessing; the pepper additionally makes a stolen Redis dump
useless without the gateway's configuration. In Redis (shared by replicas), both hashes under one
hash tag so create/revoke are one MULTI:

    gw:{apikeys}:by_digest   hash  digest → record JSON
    gw:{apikeys}:by_id       hash  key id → digest

Without Redis, the same in memory (this process only). `resolve` caches answers (also "no such key")
for `cache_ttl_s`, so a revocation reaches the other replicas within that time (at once on the
replica that revoked).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis

from gateway.core.context import Principal

PREFIX = "sk-gw-"
_BY_DIGEST = "gw:{apikeys}:by_digest"
_BY_ID = "gw:{apikeys}:by_id"


@dataclass(frozen=True, slots=True)
class ApiKeySpec:
    """Who a new key speaks for."""

    user: str
    tenant: str | None = None
    roles: tuple[str, ...] = ()
    tier: str = "default"
    name: str = ""


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """What is stored and listed for a key: its public id, a display hint and the principal."""

    id: str
    hint: str  # "sk-gw-AbCd…wxyz": enough to recognise a key, useless to use it
    user: str
    tenant: str | None
    roles: tuple[str, ...]
    tier: str
    name: str
    created: int
    extra: dict[str, Any] = field(default_factory=dict)

    def principal(self) -> Principal:
        return Principal(
            user=self.user, tenant=self.tenant, roles=frozenset(self.roles), tier=self.tier or "default"
        )

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> ApiKeyRecord:
        d = orjson.loads(raw)
        d["roles"] = tuple(d.get("roles") or ())
        return cls(**d)


class KeyBackend(Protocol):
    async def get(self, digest: str) -> ApiKeyRecord | None: ...
    async def put(self, digest: str, record: ApiKeyRecord) -> None: ...
    async def delete(self, key_id: str) -> bool: ...
    async def all(self) -> list[ApiKeyRecord]: ...


class MemoryBackend:
    def __init__(self) -> None:
        self._by_digest: dict[str, ApiKeyRecord] = {}
        self._by_id: dict[str, str] = {}

    async def get(self, digest: str) -> ApiKeyRecord | None:
        return self._by_digest.get(digest)

    async def put(self, digest: str, record: ApiKeyRecord) -> None:
        self._by_digest[digest] = record
        self._by_id[record.id] = digest

    async def delete(self, key_id: str) -> bool:
        digest = self._by_id.pop(key_id, None)
        if digest is None:
            return False
        self._by_digest.pop(digest, None)
        return True

    async def all(self) -> list[ApiKeyRecord]:
        return list(self._by_digest.values())


class RedisBackend:
    def __init__(self, redis: Redis) -> None:
        self._r = redis

    async def get(self, digest: str) -> ApiKeyRecord | None:
        raw = await self._r.hget(_BY_DIGEST, digest)
        return ApiKeyRecord.from_json(raw) if raw else None

    async def put(self, digest: str, record: ApiKeyRecord) -> None:
        async with self._r.pipeline(transaction=True) as p:
            p.hset(_BY_DIGEST, digest, record.to_json())
            p.hset(_BY_ID, record.id, digest)
            await p.execute()

    async def delete(self, key_id: str) -> bool:
        digest = await self._r.hget(_BY_ID, key_id)
        if digest is None:
            return False
        async with self._r.pipeline(transaction=True) as p:
            p.hdel(_BY_DIGEST, digest)
            p.hdel(_BY_ID, key_id)
            await p.execute()
        return True

    async def all(self) -> list[ApiKeyRecord]:
        raw = await self._r.hvals(_BY_DIGEST)
        return [ApiKeyRecord.from_json(v) for v in raw]


class ApiKeys:
    """Create, revoke, list and resolve API keys. Backend errors (Redis down) propagate."""

    def __init__(
        self,
        backend: KeyBackend,
        *,
        pepper: str | None = None,
        cache_ttl_s: float = 10.0,
        cache_size: int = 10000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._pepper = pepper.encode() if pepper else None
        self._ttl = cache_ttl_s
        self._size = cache_size
        self._clock = clock
        self._cache: OrderedDict[str, tuple[Principal | None, float]] = OrderedDict()

    def bind(self, backend: KeyBackend) -> None:
        """Switch to another store (the gateway binds Redis at start-up, before serving)."""
        self._backend = backend
        self._cache.clear()

    @property
    def shared(self) -> bool:
        return isinstance(self._backend, RedisBackend)

    def digest(self, plaintext: bytes) -> str:
        if self._pepper is not None:
            return hmac.new(self._pepper, plaintext, hashlib.sha256).hexdigest()
        return hashlib.sha256(plaintext).hexdigest()

    async def create(self, spec: ApiKeySpec) -> tuple[ApiKeyRecord, str]:
        """A new key for `spec`: its record and the plaintext (shown once; never stored)."""
        if not spec.user:
            raise ValueError("an API key needs a user")
        plaintext = PREFIX + secrets.token_urlsafe(32)
        record = ApiKeyRecord(
            id="key_" + secrets.token_hex(8),
            hint=f"{plaintext[:10]}…{plaintext[-4:]}",
            user=spec.user,
            tenant=spec.tenant,
            roles=tuple(spec.roles),
            tier=spec.tier,
            name=spec.name,
            created=int(time.time()),
        )
        digest = self.digest(plaintext.encode())
        await self._backend.put(digest, record)
        self._cache.pop(digest, None)
        return record, plaintext

    async def revoke(self, key_id: str) -> bool:
        """Delete a key; False when no key has this id. Effective here at once, elsewhere within
        `cache_ttl_s`."""
        found = await self._backend.delete(key_id)
        self._cache.clear()
        return found

    async def list(self) -> list[ApiKeyRecord]:
        records = await self._backend.all()
        return sorted(records, key=lambda r: (r.created, r.id))

    async def resolve(self, plaintext: bytes) -> Principal | None:
        """The principal of a presented key, or None when no such key exists."""
        digest = self.digest(plaintext)
        now = self._clock()
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        record = await self._backend.get(digest)
        principal = record.principal() if record is not None else None
        if self._ttl > 0 and self._size > 0:
            self._cache[digest] = (principal, now + self._ttl)
            self._cache.move_to_end(digest)
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return principal
