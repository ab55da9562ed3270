"""The operator's verbs on a running gateway: what the admin API calls.

Fleet changes go through `change_fleet`: persisted in the shared store (Redis when configured), recorded
in the audit log, applied by every replica (`apply_overrides`, called by the store) within a second.
`describe_fleet` is this replica's view of pools and backends.

What the verbs need of the gateway is handed in, never imported: the `Fleet`, the `Store` (at
`start`), and a `ConfigSource` for the config file the overrides go on top of.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from redis.exceptions import RedisError

from engines.errors import ApiError
from gateway.control.store import Store, audit_entry
from gateway.core.context import Principal
from gateway.core.fleet import Fleet
from gateway.core.overrides import Overrides
from gateway.core.settings import PoolSettings

log = logging.getLogger("gateway.control")


class ConfigSource(Protocol):
    """The config file behind the fleet, as the root holds it (`gateway.app.Gateway` is one)."""

    def base_pools(self) -> Sequence[PoolSettings]:
        """The config's pools: the base the operator's overrides go on."""
        ...

    def reread_config(self) -> None:
        """Re-read the config file (pools and models); keep the current config when that fails."""
        ...


class FleetControl:
    def __init__(self, fleet: Fleet, config: ConfigSource, store: Store) -> None:
        self.fleet = fleet
        self._config = config
        #: where overrides live; `start` binds the process's real one (Redis when configured)
        self.store = store
        self._reload_seen = 0.0
        self._started_at = time.time()
        self.overrides = Overrides()

    async def start(self, store: Store) -> None:
        """Use `store` from now on and apply the overrides it holds (and every later change)."""
        self.store = store
        self.apply_overrides(await store.start(self.apply_overrides))

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
    ) -> None:
        entry = audit_entry(who.user, action, target, before, after)
        try:
            await self.store.change(updates or {}, deletes or [], entry)
        except RedisError:
            raise ApiError(
                503, "Shared state (Redis) is unreachable; the change was not made.", type="server_error"
            ) from None
        log.info("admin %s: %s %s %r -> %r", who.user, action, target, before, after)

    async def audit_only(self, who: Principal, action: str, target: str, before: Any, after: Any) -> None:
        """Record an admin action that changed no fleet override (e.g. an API key) in the audit log."""
        await self.change_fleet(who, action, target, before, after)

    def apply_overrides(self, overrides: Overrides) -> None:
        if overrides.reload_at > self._reload_seen:
            if self._reload_seen or overrides.reload_at > self._started_at:
                self._config.reread_config()
            self._reload_seen = overrides.reload_at
        self.fleet.apply(self._config.base_pools(), overrides)
        self.overrides = overrides

    async def reload_config(self, who: Principal) -> None:
        await self.change_fleet(who, "reload", "config", None, None, updates={"reload": time.time()})

    def describe_fleet(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [
            {
                "name": p.name,
                "dialect": p.dialect.name,
                "weight": p.weight,
                "models": p.models,
                "tool_calling": p.tool_calling,
                "structured_output": p.structured_output,
                "backends": [
                    {
                        "name": b.name,
                        "url": b.url,
                        "healthy": b.healthy,
                        "draining": b.draining,
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
                    for b in p.backends.values()
                ],
            }
            for p in self.fleet.pools.values()
        ]
