"""Who has spent: each user's tenant and tier as last seen, so `GET /admin/spend?user=` finds the
user's ledgers (kept under the tenant) and budgets (the tier's) without being told them.

`remember(principal)` is called on every admitted request whose spend is recorded; a principal is
written once per process (a set remembers which were), in the background, to the Redis hash
`gw:sp:principals` (user → {"tenant", "tier"}) or, without Redis, to this process's memory. A write
that fails is tried again by the principal's next request.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from redis.asyncio import Redis
from redis.exceptions import RedisError

from gateway.core.context import Principal

log = logging.getLogger("gateway.admission")

KEY = "gw:sp:principals"
#: principals this process remembers having written (then the set starts over)
_SEEN_MAX = 100_000


class Principals:
    def __init__(self) -> None:
        self._redis: Redis | None = None
        self._memory: dict[str, dict[str, Any]] = {}
        self._seen: set[tuple[str, str | None, str]] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    def bind(self, redis: Redis) -> None:
        self._redis = redis

    def remember(self, p: Principal) -> None:
        key = (p.user, p.tenant, p.tier)
        if key in self._seen:
            return
        if len(self._seen) >= _SEEN_MAX:
            self._seen.clear()
        self._seen.add(key)
        entry = {"tenant": p.tenant, "tier": p.tier}
        if self._redis is None:
            self._memory[p.user] = entry
            return
        task = asyncio.get_running_loop().create_task(self._write(key, entry))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _write(self, key: tuple[str, str | None, str], entry: dict[str, Any]) -> None:
        assert self._redis is not None
        try:
            await self._redis.hset(KEY, key[0], orjson.dumps(entry))
        except (RedisError, OSError):
            self._seen.discard(key)

    async def lookup(self, user: str) -> dict[str, Any] | None:
        """The user's tenant and tier as last seen, or None (never seen). Store errors propagate."""
        if self._redis is None:
            return self._memory.get(user)
        raw = await self._redis.hget(KEY, user)
        return dict(orjson.loads(raw)) if raw else None

    async def all(self) -> dict[str, dict[str, Any]]:
        """Every user's tenant and tier as last seen. Store errors propagate."""
        if self._redis is None:
            return dict(self._memory)
        raw = await self._redis.hgetall(KEY)
        return {(k.decode() if isinstance(k, bytes) else k): dict(orjson.loads(v)) for k, v in raw.items()}
