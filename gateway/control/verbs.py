"""The operator's verbs on a running gateway: what the admin API calls.

Fleet changes go through `change_fleet`: persisted in the shared store (Redis when configured), recorded
in the audit log, applied by every replica (`apply_overrides`, called by the store) within a second.
`describe_fleet` is this replica's view of pools and backends.

During a store outage, the changes an operator needs most (a pool's weight, draining a backend) are
applied on this replica alone and kept as pending: `describe_fleet` and the answers mark them as not
persisted, and they are written to the store, in order and with their audit entries, as soon as it
answers again. When the store comes back empty (`StateLost`), the replica says what is gone (a log
line, `on_lost`), and the replica asked to restore writes its last known overrides back.

What the verbs need of the gateway is handed in, never imported: the `Fleet`, the `Store` (at
`start`), and a `ConfigSource` for the config file the overrides go on top of.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import RedisError

from gateway.control.store import AuditEntry, StateLost, Store, audit_entry
from gateway.core.context import Principal
from gateway.core.fleet import Fleet
from gateway.core.overrides import Overrides
from gateway.core.replica import REPLICA
from gateway.core.settings import PoolSettings

log = logging.getLogger("gateway.control")


@dataclass(frozen=True, slots=True)
class ReloadResult:
    """What reading the config file again did on one replica: the settings that differ (dotted keys,
    never values), those applied at once, and those that take a restart."""

    changed: list[str]
    applied: list[str]
    restart_required: list[str]

    def as_dict(self) -> dict[str, Any]:
        return {"changed": self.changed, "applied": self.applied, "restart_required": self.restart_required}


class ConfigRefused(Exception):
    """The config file cannot be used; `problems` one per error (file, line, key, message)."""

    def __init__(self, problems: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(problems)} problem(s) in the config")
        self.problems = problems


class ConfigSource(Protocol):
    """The config file behind the fleet, as the root holds it (`gateway.app.Gateway` is one)."""

    def base_pools(self) -> Sequence[PoolSettings]:
        """The config's pools: the base the operator's overrides go on."""
        ...

    async def reread_config(self) -> ReloadResult:
        """Read and validate the config file, then apply what can be applied live; `ConfigRefused`,
        with nothing changed, when the file cannot be used."""
        ...


#: how long a reload's answer waits for the other replicas' reports (they poll every 0.5 s)
RELOAD_WAIT_S = 1.5
#: writing the outage's changes back: tries, and the wait between them (the poll's period, twice)
RECONCILE_ATTEMPTS = 10
RECONCILE_RETRY_S = 1.0


#: (kind, count) → report what a shared state that came back empty lost (`gateway_shared_state_lost`)
OnLost = Callable[[str, int], None]
#: the ids of the API keys this replica has verified (what it can name when the store lost them)
KnownKeys = Callable[[], list[str]]
#: the actions an operator may take on one replica while the store is unreachable
LOCAL_ACTIONS = frozenset({"set_weight", "reset_weight", "drain", "undrain", "reload"})


@dataclass(frozen=True, slots=True)
class Pending:
    """A change made during a store outage, applied here only, to be written when the store is back."""

    updates: dict[str, Any]
    deletes: list[str]
    entry: AuditEntry


class FleetControl:
    def __init__(
        self,
        fleet: Fleet,
        config: ConfigSource,
        store: Store,
        *,
        on_lost: OnLost | None = None,
        known_keys: KnownKeys | None = None,
        rebalance: bool = False,
    ) -> None:
        self.fleet = fleet
        #: the rebalancing loop's weights (`rebalance:<pool>`) apply: `routing.rebalance` is on
        self._rebalance = rebalance
        self._config = config
        #: where overrides live; `start` binds the process's real one (Redis when configured)
        self.store = store
        self._on_lost = on_lost
        self._known_keys = known_keys
        self._reload_seen = 0.0
        self._started_at = time.time()
        self.overrides = Overrides()
        #: the store's overrides as last read, and the changes made here during an outage
        self._stored = Overrides()
        self.pending: list[Pending] = []
        self._reconciling: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, store: Store) -> None:
        """Use `store` from now on and apply the overrides it holds (and every later change)."""
        self.store = store
        self.apply_overrides(await store.start(self.apply_overrides, self._state_lost))

    async def change_fleet(
        self,
        who: Principal,
        action: str,
        target: str,
        before: Any,
        after: Any,
        *,
        updates: dict[str, Any] | None = None,
        deletes: list[str] | None = None,
    ) -> bool:
        """Make a change everywhere; True when the store has it. During a store outage, the actions in
        `LOCAL_ACTIONS` apply on this replica only (False) and the others are a 503."""
        entry = audit_entry(who.user, action, target, before, after)
        try:
            await self.store.change(updates or {}, deletes or [], entry)
        except (RedisError, OSError):
            if action not in LOCAL_ACTIONS:
                raise
            self.pending.append(Pending(dict(updates or {}), list(deletes or []), entry))
            self._apply(self._stored)
            log.warning(
                "admin %s: %s %s %r -> %r on this replica only (shared state unreachable)",
                who.user,
                action,
                target,
                before,
                after,
            )
            return False
        log.info("admin %s: %s %s %r -> %r", who.user, action, target, before, after)
        return True

    async def audit_only(self, who: Principal, action: str, target: str, before: Any, after: Any) -> None:
        """Record an admin action that changed no fleet override (e.g. an API key) in the audit log."""
        await self.change_fleet(who, action, target, before, after)

    def apply_overrides(self, overrides: Overrides) -> None:
        """The store's overrides (read just now: it answers), with this replica's pending changes on
        top until they are written."""
        self._stored = overrides
        self._apply(overrides)
        if self.pending and self._reconciling is None:
            self._reconciling = asyncio.get_running_loop().create_task(self._reconcile())

    def _apply(self, stored: Overrides) -> None:
        merged = stored
        if self.pending:
            fields = dict(stored.fields)
            for p in self.pending:
                for key in p.deletes:
                    fields.pop(key, None)
                fields.update(p.updates)
            merged = Overrides.from_fields(fields)
        if merged.rebalanced and not self._rebalance:  # the loop is off here: the file's weights
            merged = dataclasses.replace(merged, rebalanced={})
        if stored.reload_at > self._reload_seen:
            if self._reload_seen or stored.reload_at > self._started_at:
                self._follow(asyncio.get_running_loop().create_task(self._reload_here(stored.reload_at)))
            self._reload_seen = stored.reload_at
        self.fleet.apply(self._config.base_pools(), merged)
        self.overrides = merged

    async def _reconcile(self) -> None:
        """Write the changes made during the outage, oldest first. A failed write is tried again a
        few times: a Redis that answers the poll may still refuse a write (loading its data)."""
        written = 0
        try:
            for _ in range(RECONCILE_ATTEMPTS):
                try:
                    while self.pending:
                        p = self.pending[0]
                        await self.store.change(p.updates, p.deletes, p.entry)
                        self.pending.pop(0)
                        written += 1
                    break
                except (RedisError, OSError):
                    await asyncio.sleep(RECONCILE_RETRY_S)
        finally:
            self._reconciling = None
        if written:
            log.warning(
                "shared state reachable: %d change(s) made on this replica during the outage written", written
            )
        self._apply(self._stored)

    async def _state_lost(self, lost: StateLost) -> None:
        """The store came back empty: say what is gone; the replica asked to restore writes back the
        overrides it knew (the fleet keeps its weights and drained backends)."""
        keys = self._known_keys() if self._known_keys is not None else []
        overrides = sorted(k for k in lost.fields if not k.startswith("reload"))
        log.error(
            "shared state (Redis) came back empty: %d override(s) %s, the audit log (%d entries) and "
            "the API keys (%d verified here: %s) are gone%s",
            len(overrides),
            overrides,
            lost.audit_entries,
            len(keys),
            ", ".join(keys) or "none",
            "; restoring the overrides" if lost.restore and overrides else "",
        )
        if self._on_lost is not None:
            for kind, count in (
                ("overrides", len(overrides)),
                ("audit_entries", lost.audit_entries),
                ("api_keys", len(keys)),
            ):
                self._on_lost(kind, count)
        if lost.restore and lost.fields:
            entry = audit_entry("gateway", "restore_overrides", "fleet", None, lost.fields)
            await self.store.change(lost.fields, [], entry)

    async def reload_config(self, who: Principal) -> dict[str, Any]:
        """Read the config file here first: a file that cannot be used changes nothing anywhere
        (`ConfigRefused`, audited as `reload_refused`). Else apply it here, ask every replica to do
        the same, and answer with each replica's report that arrived within `RELOAD_WAIT_S`."""
        try:
            here = await self._config.reread_config()
        except ConfigRefused as refused:
            lines = [
                f"{p.get('line') or '?'}: {p.get('key') or '-'}: {p.get('message')}" for p in refused.problems
            ]
            with contextlib.suppress(RedisError, OSError):  # the refusal stands even if unaudited
                await self.audit_only(who, "reload_refused", "config", None, lines)
            raise
        at = time.time()
        self._reload_seen = at  # this replica has applied it: its own announcement must not re-read
        persisted = await self.change_fleet(
            who, "reload", "config", None, here.as_dict(), updates={"reload": at}
        )
        answer = {"ok": True, "persisted": persisted, "replica": REPLICA, **here.as_dict()}
        if not persisted:  # the other replicas re-read when the store is back
            return {**answer, "replicas": {REPLICA: here.as_dict()}}
        await self.store.report_reload(at, REPLICA, here.as_dict())
        waited = 0.0
        while self.store.shared and waited < RELOAD_WAIT_S:
            await asyncio.sleep(0.25)
            waited += 0.25
        return {**answer, "replicas": await self.store.reload_reports(at)}

    async def _reload_here(self, at: float) -> None:
        """Another replica asked for a reload: read the file, apply it, report what happened."""
        try:
            report = (await self._config.reread_config()).as_dict()
            self._apply(self._stored)  # the fleet on the new file's pools
        except ConfigRefused as refused:
            report = {"refused": refused.problems}
            log.error("reload asked by another replica refused here: %s", refused.problems)
        with contextlib.suppress(RedisError, OSError):
            await self.store.report_reload(at, REPLICA, report)

    def _follow(self, task: asyncio.Task[None]) -> None:
        """Keep a background task referenced until it ends."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def describe_fleet(self) -> list[dict[str, Any]]:
        """Every pool as `describe_pool` shows it."""
        return [self.describe_pool(name) for name in self.fleet.pools]

    def removed_backends(self) -> list[str]:
        """The config file's backends an operator removed (an override until added again)."""
        config = {b.name for p in self._config.base_pools() for b in p.backends}
        return sorted(config & self.overrides.removed)

    def describe_pool(self, name: str) -> dict[str, Any]:
        """A pool and its backends as this replica sees them; where a value is the operator's
        override rather than the config file's, `*_source` says so."""
        p = self.fleet.pools[name]
        o = self.overrides
        return {
            "name": p.name,
            "dialect": p.dialect.name,
            "weight": p.weight,
            "weight_source": "override"
            if p.name in o.weights
            else "rebalance"
            if p.name in o.rebalanced
            else "file",
            "models": p.models,
            "tool_calling": p.tool_calling,
            "structured_output": p.structured_output,
            "backends": [self.describe_backend(b) for b in p.backends],
        }

    def describe_backend(self, name: str) -> dict[str, Any]:
        now = time.monotonic()
        b = self.fleet.backends[name]
        return {
            "name": b.name,
            "url": b.url,
            "source": "override" if name in self.overrides.added else "file",
            "healthy": b.healthy,
            "draining": b.draining,
            "draining_source": "override" if name in self.overrides.drained else "file",
            "circuit": b.circuit.state if not b.circuit.is_open(now) else "open",
            "in_flight": b.in_flight,
            "prefill_tokens": b.prefill,
            "requests_total": b.requests_total,
            "load": None
            if b.load is None
            else {
                "running": b.load.running,
                "waiting": b.load.waiting,
                "kv_usage": b.load.kv_usage,
                "prefix_cache_hit_rate": b.load.prefix_cache_hit_rate,
                "age_s": round(now - b.load_at, 3),
            },
        }
