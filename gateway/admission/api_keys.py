"""Long-lived API keys (`sk-gw-…`) beside JWTs, for clients like the OpenAI SDK.

Lifecycle (called by the admin API):
- `create(spec)` mints a key, stores only its digest with the principal it maps to, and returns the
  plaintext — the only time it exists outside the client's hands.
- `revoke(key_id)` deletes it; `list()` shows every key's record (never a digest or plaintext).
- `update(key_id, …)` changes what the key itself narrows (its model lists, its budgets); the
  principal it speaks for never changes.

Storage: SHA-256 of the key, or HMAC-SHA256 with `auth.api_keys.pepper` when set. Keys are 256 random
bits, so a digest cannot be inverted by guessing; the pepper additionally makes a stolen Redis dump
useless without the gateway's configuration. In Redis (shared by replicas), both hashes under one
hash tag so create/revoke are one MULTI:

    gw:{apikeys}:by_digest   hash  digest → record JSON
    gw:{apikeys}:by_id       hash  key id → digest
    gw:{apikeys}:revoked     hash  key id → the revoked key's record (its spend stays readable)

Without Redis, the same in memory (this process only). `resolve` caches answers (also "no such key")
for `CACHE_TTL_S`, so a revocation reaches the other replicas within that time (at once on the
replica that revoked).

During a store outage, a key this process verified in the last `OUTAGE_GRACE_S` keeps working from
its cache (the store's answer, as last confirmed); a key it never verified, or one it knows was
revoked or changed, gets the store's error (503). Past the grace, every key gets it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.core.context import Principal
from policies.access import ModelAccess
from policies.budgets import Budget

PREFIX = "sk-gw-"
#: what `ApiKeys.update` may change (the principal a key speaks for never changes)
_MUTABLE = frozenset({"allow_models", "deny_models", "budgets"})
_BY_DIGEST = "gw:{apikeys}:by_digest"
_BY_ID = "gw:{apikeys}:by_id"
_REVOKED = "gw:{apikeys}:revoked"


@dataclass(frozen=True, slots=True)
class ApiKeySpec:
    """Who a new key speaks for, and what the key itself narrows: `allow_models` (None: whatever the
    principal's tier and tenant allow), `deny_models`, its own `budgets` (on top of the user's and
    the tenant's) and its flow-control `priority_class` (None: its tier's)."""

    user: str
    tenant: str | None = None
    roles: tuple[str, ...] = ()
    tier: str = "default"
    name: str = ""
    allow_models: tuple[str, ...] | None = None
    deny_models: tuple[str, ...] = ()
    budgets: tuple[Budget, ...] = ()
    priority_class: str | None = None


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    """What is stored and listed for a key: its public id, a display hint, the principal and the
    key's own grants. `rev` counts the changes made to the grants since the key was created."""

    id: str
    hint: str  # "sk-gw-AbCd…wxyz": enough to recognise a key, useless to use it
    user: str
    tenant: str | None
    roles: tuple[str, ...]
    tier: str
    name: str
    created: int
    extra: dict[str, Any] = field(default_factory=dict)
    allow_models: tuple[str, ...] | None = None
    deny_models: tuple[str, ...] = ()
    budgets: tuple[Budget, ...] = ()
    rev: int = 0
    priority_class: str | None = None

    @property
    def access(self) -> ModelAccess | None:
        if self.allow_models is None and not self.deny_models:
            return None
        return ModelAccess.of(self.allow_models, self.deny_models)

    def principal(self) -> Principal:
        return Principal(
            user=self.user,
            tenant=self.tenant,
            roles=frozenset(self.roles),
            tier=self.tier or "default",
            key_id=self.id,
            key_access=self.access,
            key_budgets=self.budgets,
            key_rev=self.rev,
            key_class=self.priority_class,
        )

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes | str) -> ApiKeyRecord:
        d = orjson.loads(raw)
        # fields a newer gateway wrote that this one does not know are ignored (rolling upgrades)
        d = {k: v for k, v in d.items() if k in _FIELDS}
        d["roles"] = tuple(d.get("roles") or ())
        if d.get("allow_models") is not None:
            d["allow_models"] = tuple(d["allow_models"])
        d["deny_models"] = tuple(d.get("deny_models") or ())
        d["budgets"] = tuple(Budget(**b) for b in d.get("budgets") or ())
        return cls(**d)


_FIELDS = frozenset(ApiKeyRecord.__dataclass_fields__)


class KeyBackend(Protocol):
    async def get(self, digest: str) -> ApiKeyRecord | None: ...
    async def put(self, digest: str, record: ApiKeyRecord) -> None: ...
    async def delete(self, key_id: str) -> bool: ...
    async def all(self) -> list[ApiKeyRecord]: ...
    async def by_id(self, key_id: str) -> ApiKeyRecord | None: ...
    async def replace(self, record: ApiKeyRecord) -> bool:
        """Store `record` in place of the key with its id; False when that key no longer exists."""
        ...

    async def revoked(self, key_id: str) -> ApiKeyRecord | None:
        """The record of a key deleted (revoked) earlier."""
        ...


class MemoryBackend:
    def __init__(self) -> None:
        self._by_digest: dict[str, ApiKeyRecord] = {}
        self._by_id: dict[str, str] = {}
        self._revoked: dict[str, ApiKeyRecord] = {}

    async def get(self, digest: str) -> ApiKeyRecord | None:
        return self._by_digest.get(digest)

    async def put(self, digest: str, record: ApiKeyRecord) -> None:
        self._by_digest[digest] = record
        self._by_id[record.id] = digest

    async def delete(self, key_id: str) -> bool:
        digest = self._by_id.pop(key_id, None)
        if digest is None:
            return False
        record = self._by_digest.pop(digest, None)
        if record is not None:
            self._revoked[key_id] = record
        return True

    async def revoked(self, key_id: str) -> ApiKeyRecord | None:
        return self._revoked.get(key_id)

    async def all(self) -> list[ApiKeyRecord]:
        return list(self._by_digest.values())

    async def by_id(self, key_id: str) -> ApiKeyRecord | None:
        digest = self._by_id.get(key_id)
        return None if digest is None else self._by_digest.get(digest)

    async def replace(self, record: ApiKeyRecord) -> bool:
        digest = self._by_id.get(record.id)
        if digest is None:
            return False
        self._by_digest[digest] = record
        return True


_REPLACE = """
local digest = redis.call('HGET', KEYS[1], ARGV[1])
if not digest or redis.call('HEXISTS', KEYS[2], digest) == 0 then return 0 end
redis.call('HSET', KEYS[2], digest, ARGV[2])
return 1
"""


class RedisBackend:
    def __init__(self, redis: Redis) -> None:
        self._r = redis
        self._replace = redis.register_script(_REPLACE)

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
        raw = await self._r.hget(_BY_DIGEST, digest)
        async with self._r.pipeline(transaction=True) as p:
            p.hdel(_BY_DIGEST, digest)
            p.hdel(_BY_ID, key_id)
            if raw:
                p.hset(_REVOKED, key_id, raw)
            await p.execute()
        return True

    async def revoked(self, key_id: str) -> ApiKeyRecord | None:
        raw = await self._r.hget(_REVOKED, key_id)
        return ApiKeyRecord.from_json(raw) if raw else None

    async def all(self) -> list[ApiKeyRecord]:
        raw = await self._r.hvals(_BY_DIGEST)
        return [ApiKeyRecord.from_json(v) for v in raw]

    async def by_id(self, key_id: str) -> ApiKeyRecord | None:
        digest = await self._r.hget(_BY_ID, key_id)
        if digest is None:
            return None
        raw = await self._r.hget(_BY_DIGEST, digest)
        return ApiKeyRecord.from_json(raw) if raw else None

    async def replace(self, record: ApiKeyRecord) -> bool:
        # one script: a revocation between reading the digest and writing cannot resurrect the key
        return bool(await self._replace(keys=[_BY_ID, _BY_DIGEST], args=[record.id, record.to_json()]))


#: a resolved key is cached this long per process: a revocation reaches every other replica within
#: 10 s, and a busy key costs its replica one lookup in 10 s
CACHE_TTL_S = 10.0
#: keys cached per process, at most
CACHE_SIZE = 10_000
#: during a store outage, a key this process verified in the last ten minutes keeps working from its
#: cache: an outage of minutes locks no active client out, while a key unused that long waits for Redis
OUTAGE_GRACE_S = 600.0


class ApiKeys:
    """Create, revoke, list and resolve API keys. Backend errors (Redis down) propagate."""

    def __init__(
        self,
        backend: KeyBackend,
        *,
        pepper: str | None = None,
        cache_ttl_s: float = CACHE_TTL_S,
        cache_size: int = CACHE_SIZE,
        outage_grace_s: float = OUTAGE_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend = backend
        self._pepper = pepper.encode() if pepper else None
        self._ttl = cache_ttl_s
        self._size = cache_size
        self._grace = outage_grace_s
        self._clock = clock
        #: digest -> (principal or None, fresh until, confirmed by the store at)
        self._cache: OrderedDict[str, tuple[Principal | None, float, float]] = OrderedDict()

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
            allow_models=None if spec.allow_models is None else tuple(spec.allow_models),
            deny_models=tuple(spec.deny_models),
            budgets=tuple(spec.budgets),
            priority_class=spec.priority_class,
        )
        digest = self.digest(plaintext.encode())
        await self._backend.put(digest, record)
        self._cache.pop(digest, None)
        return record, plaintext

    async def revoke(self, key_id: str) -> bool:
        """Delete a key; False when no key has this id. Effective here at once, elsewhere within
        `cache_ttl_s`."""
        found = await self._backend.delete(key_id)
        self._forget(key_id)
        return found

    async def update(self, key_id: str, **changes: Any) -> tuple[ApiKeyRecord, ApiKeyRecord] | None:
        """Change a key's grants (`allow_models`, `deny_models`, `budgets`); (before, after), or None
        when no key has this id. Effective here at once, on other replicas within `cache_ttl_s`."""
        unknown = set(changes) - _MUTABLE
        if unknown:
            raise ValueError(f"these fields of an API key cannot be changed: {sorted(unknown)}")
        before = await self._backend.by_id(key_id)
        if before is None:
            return None
        after = replace(before, **changes, rev=before.rev + 1)
        if not await self._backend.replace(after):
            return None
        self._forget(key_id)
        return before, after

    def known_ids(self) -> list[str]:
        """The ids of the keys this process has verified and still remembers."""
        return sorted({p.key_id for p, _, _ in self._cache.values() if p is not None and p.key_id})

    def _forget(self, key_id: str) -> None:
        """Drop what the cache holds of a key that was revoked or changed here."""
        stale = [d for d, (p, _, _) in self._cache.items() if p is not None and p.key_id == key_id]
        for digest in stale:
            del self._cache[digest]

    async def get(self, key_id: str) -> ApiKeyRecord | None:
        return await self._backend.by_id(key_id)

    async def get_any(self, key_id: str) -> tuple[ApiKeyRecord, bool] | None:
        """A key's record and whether it was revoked (revoked keys keep their record), or None."""
        record = await self._backend.by_id(key_id)
        if record is not None:
            return record, False
        gone = await self._backend.revoked(key_id)
        return (gone, True) if gone is not None else None

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
        try:
            record = await self._backend.get(digest)
        except (RedisError, OSError):
            if hit is not None and now - hit[2] <= self._grace:
                return hit[0]  # the store's last answer: a key it knew, or one it knew was gone
            raise
        principal = record.principal() if record is not None else None
        if self._size > 0 and (self._ttl > 0 or self._grace > 0):
            self._cache[digest] = (principal, now + self._ttl, now)
            self._cache.move_to_end(digest)
            if len(self._cache) > self._size:
                self._cache.popitem(last=False)
        return principal
