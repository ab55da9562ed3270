"""Fleet changes made at run time (admin API), persisted and shared by every gateway replica.

What is stored is the operator's *overrides* on top of the config file — pool weights, drained
backends, backends added or removed — plus an audit log. Each replica applies the overrides to its
own `Fleet`; the config file stays the base, so a reload of the file keeps the overrides.

    RedisStore   one hash `gw:{fleet}:overrides` (field → JSON value) + a version counter, changes
                 announced on the channel `gw:fleet:changed`; every replica applies a change when
                 the announcement arrives and, as a fallback for a lost message, whenever the
                 version it polls every `poll_s` (default 0.5 s) moved. A restarted replica starts
                 from the stored overrides. Keys carry the `{fleet}` hash tag (Redis Cluster safe).
    MemoryStore  the same in this process only (no Redis configured); the start-up log says so.

Field names in the hash: `weight:<pool>` → float, `drain:<backend>` → true,
`add:<backend>` → {"pool", "url"}, `remove:<backend>` → true, `reload:` → when a reload of the
config file on every replica was last asked for, `rebalance:<pool>` → float (the weight the
rebalancing loop set; `weight:<pool>` outranks it).

Redis coming back empty (restarted without persistence, flushed, failed over to an empty replica) is
told from an outage by a generation marker, `gw:{fleet}:generation`: a random value set once, which
every replica remembers. When a poll finds it gone or changed, the store hands what this replica last
knew (`StateLost`: the override fields, the audit log's length) to the `on_reset` callback; the
replica that sets the new marker first is the one asked to restore.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
from redis.asyncio import Redis
from redis.asyncio.client import PubSub
from redis.exceptions import RedisError

from gateway.core.outage_log import OutageLog
from gateway.core.overrides import Overrides
from gateway.core.tasks import cancel_and_wait, stop_requested

log = logging.getLogger("gateway.state")

OVERRIDES_KEY = "gw:{fleet}:overrides"
VERSION_KEY = "gw:{fleet}:version"
AUDIT_KEY = "gw:{fleet}:audit"
GENERATION_KEY = "gw:{fleet}:generation"
#: each replica's answer to a reload (`gw:{fleet}:reload:<when>`, replica → JSON), kept this long
RELOAD_REPORT_TTL_S = 3600
CHANNEL = "gw:fleet:changed"
AUDIT_MAX = 1000


@dataclass(frozen=True, slots=True)
class AuditEntry:
    ts: float
    actor: str
    action: str
    target: str
    before: Any
    after: Any

    def as_dict(self) -> dict[str, Any]:
        return {
            "ts": self.ts,
            "actor": self.actor,
            "action": self.action,
            "target": self.target,
            "before": self.before,
            "after": self.after,
        }


@dataclass(frozen=True, slots=True)
class StateLost:
    """What a replica last knew of a shared state that came back empty: the override fields and how
    many audit entries there were. `restore`: this replica is the one to write the fields back."""

    fields: dict[str, Any]
    audit_entries: int
    restore: bool


#: called (in the event loop) when the shared state came back empty
OnReset = Callable[[StateLost], Awaitable[None]]


class Store(Protocol):
    """Where overrides live. `on_change` is called (in the event loop) whenever they may have changed."""

    shared: bool

    async def start(
        self, on_change: Callable[[Overrides], None], on_reset: OnReset | None = None
    ) -> Overrides: ...

    async def stop(self) -> None: ...

    async def change(self, updates: dict[str, Any], deletes: list[str], audit: AuditEntry) -> None:
        """Apply field updates/deletes atomically, record the audit entry, announce the change."""
        ...

    async def audit(self, limit: int) -> list[dict[str, Any]]: ...

    async def report_reload(self, at: float, replica: str, result: dict[str, Any]) -> None:
        """Record what `replica` did for the reload asked at `at`."""
        ...

    async def reload_reports(self, at: float) -> dict[str, dict[str, Any]]:
        """Every replica's report for the reload asked at `at`."""
        ...


class MemoryStore:
    shared = False

    def __init__(self) -> None:
        self._fields: dict[str, Any] = {}
        self._audit: deque[AuditEntry] = deque(maxlen=AUDIT_MAX)
        self._on_change: Callable[[Overrides], None] | None = None
        self._reload_at = 0.0
        self._reloads: dict[str, dict[str, Any]] = {}

    async def start(
        self, on_change: Callable[[Overrides], None], on_reset: OnReset | None = None
    ) -> Overrides:
        self._on_change = on_change
        return Overrides.from_fields(self._fields)

    async def stop(self) -> None:
        return None

    async def change(self, updates: dict[str, Any], deletes: list[str], audit: AuditEntry) -> None:
        for key in deletes:
            self._fields.pop(key, None)
        self._fields.update(updates)
        self._audit.appendleft(audit)
        if self._on_change is not None:
            self._on_change(Overrides.from_fields(self._fields))

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        return [e.as_dict() for e in list(self._audit)[:limit]]

    async def report_reload(self, at: float, replica: str, result: dict[str, Any]) -> None:
        self._reloads = {replica: result} if self._reload_at != at else {**self._reloads, replica: result}
        self._reload_at = at

    async def reload_reports(self, at: float) -> dict[str, dict[str, Any]]:
        return dict(self._reloads) if self._reload_at == at else {}


class RedisStore:
    shared = True

    def __init__(self, redis: Redis, poll_s: float = 0.5) -> None:
        self._redis = redis
        self._poll_s = poll_s
        self._version = -1
        self._on_change: Callable[[Overrides], None] | None = None
        self._on_reset: OnReset | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: what this replica last read: the generation marker, the fields, the audit log's length
        self._generation: bytes | str | None = None
        self._fields: dict[str, Any] = {}
        self._audit_len = 0
        self._resetting = asyncio.Lock()
        self._outage = OutageLog(log, "reading the shared state (Redis; the last known overrides stay)")

    async def start(
        self, on_change: Callable[[Overrides], None], on_reset: OnReset | None = None
    ) -> Overrides:
        self._on_change = on_change
        self._on_reset = on_reset
        await self._redis.set(GENERATION_KEY, secrets.token_hex(8), nx=True)
        # subscribed before the first read: a change made after that read is announced to this replica
        pubsub = await self._subscribe()
        overrides = await self._load()
        assert overrides is not None  # the first read adopts the generation it finds
        self._tasks = [asyncio.create_task(self._listen(pubsub)), asyncio.create_task(self._poll())]
        return overrides

    async def stop(self) -> None:
        # Bounded: closing a pub/sub connection to a sick Redis must not hold up shutdown.
        await cancel_and_wait(self._tasks, within_s=2.0, what="shared-state tasks")
        self._tasks = []

    async def _load(self) -> Overrides | None:
        """The stored overrides, or None when Redis holds another generation of state than this
        replica last read (it came back empty): `_reset` has handled that, whichever path read it."""
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.get(VERSION_KEY)
            pipe.hgetall(OVERRIDES_KEY)
            pipe.get(GENERATION_KEY)
            pipe.llen(AUDIT_KEY)
            version, raw, generation, audit_len = await pipe.execute()
        if self._generation is not None and generation != self._generation:
            await self._reset()
            return None
        self._version, self._generation, self._audit_len = int(version or 0), generation, audit_len
        self._fields = {k.decode(): orjson.loads(v) for k, v in raw.items()}
        return Overrides.from_fields(self._fields)

    async def _refresh(self) -> None:
        overrides = await self._load()
        if overrides is not None and self._on_change is not None:
            self._on_change(overrides)

    async def _subscribe(self) -> PubSub:
        """A subscription Redis has confirmed: every announcement after it reaches this replica."""
        pubsub = self._redis.pubsub()
        await pubsub.subscribe(CHANNEL)
        await pubsub.get_message(timeout=None)  # the confirmation comes before any message
        return pubsub

    async def _listen(self, subscribed: PubSub | None) -> None:
        while not stop_requested():
            try:
                pubsub = subscribed or await self._subscribe()
                subscribed = None  # after a lost connection, the next turn subscribes again
                try:
                    async for message in pubsub.listen():
                        if message.get("type") == "message":
                            await self._refresh()
                finally:
                    with contextlib.suppress(Exception):
                        async with asyncio.timeout(1.0):
                            await pubsub.aclose()  # type: ignore[no-untyped-call]
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError):
                if stop_requested():  # the cancel was swallowed on its way (gateway/core/tasks.py)
                    return
                await asyncio.sleep(1.0)  # the poller keeps state fresh meanwhile

    async def _poll(self) -> None:
        while not stop_requested():
            await asyncio.sleep(self._poll_s)
            try:
                async with self._redis.pipeline(transaction=False) as pipe:
                    pipe.get(VERSION_KEY)
                    pipe.get(GENERATION_KEY)
                    pipe.llen(AUDIT_KEY)
                    version, generation, audit_len = await pipe.execute()
                if generation != self._generation:
                    await self._reset()
                    continue
                self._audit_len = audit_len
                if int(version or 0) != self._version or self._outage.failing:
                    await self._refresh()  # after an outage: the replica's pending changes go out
                self._outage.worked()
            except (RedisError, OSError) as exc:
                if stop_requested():
                    return
                self._outage.failed(exc)

    async def _reset(self) -> None:
        """The marker is gone (Redis came back empty) or another replica has already set a new one.
        The poller and the listener may both find it: the lock and the re-read make it one reset."""
        async with self._resetting:
            seen = await self._redis.get(GENERATION_KEY)
            if seen is not None and seen == self._generation:
                return
            restore = seen is None and bool(
                await self._redis.set(GENERATION_KEY, secrets.token_hex(8), nx=True)
            )
            lost = StateLost(dict(self._fields), self._audit_len, restore)
            self._generation = await self._redis.get(GENERATION_KEY)
            if self._on_reset is not None:
                await self._on_reset(lost)
        await self._refresh()

    async def change(self, updates: dict[str, Any], deletes: list[str], audit: AuditEntry) -> None:
        try:
            async with self._redis.pipeline(transaction=True) as pipe:
                if deletes:
                    pipe.hdel(OVERRIDES_KEY, *deletes)
                if updates:
                    pipe.hset(OVERRIDES_KEY, mapping={k: orjson.dumps(v) for k, v in updates.items()})
                pipe.incr(VERSION_KEY)
                pipe.lpush(AUDIT_KEY, orjson.dumps(audit.as_dict()))
                pipe.ltrim(AUDIT_KEY, 0, AUDIT_MAX - 1)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            # the outage is seen here even when no poll fell inside it (a loaded host can hold the
            # poller past a short one): the next poll that works then hands the replica's pending
            # changes back to be written
            self._outage.failed(exc)
            raise
        await self._redis.publish(CHANNEL, b"1")
        await self._refresh()

    async def audit(self, limit: int) -> list[dict[str, Any]]:
        raw = await self._redis.lrange(AUDIT_KEY, 0, max(0, limit - 1))
        return [orjson.loads(r) for r in raw]

    async def report_reload(self, at: float, replica: str, result: dict[str, Any]) -> None:
        key = f"gw:{{fleet}}:reload:{at!r}"
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, replica, orjson.dumps(result))
            pipe.expire(key, RELOAD_REPORT_TTL_S)
            await pipe.execute()

    async def reload_reports(self, at: float) -> dict[str, dict[str, Any]]:
        raw = await self._redis.hgetall(f"gw:{{fleet}}:reload:{at!r}")
        return {k.decode() if isinstance(k, bytes) else k: orjson.loads(v) for k, v in raw.items()}


def audit_entry(actor: str, action: str, target: str, before: Any, after: Any) -> AuditEntry:
    return AuditEntry(
        ts=round(time.time(), 3), actor=actor, action=action, target=target, before=before, after=after
    )
