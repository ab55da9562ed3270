"""The operator's verbs on a running gateway: what the admin API calls.

Fleet changes go through `change_fleet`: persisted in the shared store (Redis when configured), recorded
in the audit log, applied by every replica (`apply_overrides`, called by the store) within a second.
`explain` is a dry run of routing; `describe_fleet` is this replica's view of pools and backends.
"""

from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any

from redis.exceptions import RedisError

from engines.errors import ApiError, model_not_found
from gateway.auth import require_admin
from gateway.context import Principal
from gateway.settings import load_settings
from gateway.state import Overrides, audit_entry
from policies.features import extract_features
from policies.types import RequestFeatures, RoutingError

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger("gateway.control")


class FleetControl:
    def __init__(self, gw: Gateway) -> None:
        self._gw = gw
        self._reload_seen = 0.0
        self._started_at = time.time()
        self.overrides = Overrides()

    async def authorize_admin(self, headers: dict[bytes, bytes]) -> Principal:
        """The caller's principal if it has the admin role; ApiError 401/403 otherwise."""
        auth = self._gw.authenticator
        if auth is None:
            raise ApiError(
                403, "The admin API needs authentication to be configured (auth section).", code="forbidden"
            )
        principal: Principal = await auth.authenticate(headers)
        require_admin(principal)
        return principal

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
        gw = self._gw
        entry = audit_entry(who.user, action, target, before, after)
        try:
            await gw.store.change(updates or {}, deletes or [], entry)
        except RedisError:
            raise ApiError(
                503, "Shared state (Redis) is unreachable; the change was not made.", type="server_error"
            ) from None
        log.info("admin %s: %s %s %r -> %r", who.user, action, target, before, after)

    async def audit_only(self, who: Principal, action: str, target: str, before: Any, after: Any) -> None:
        """Record an admin action that changed no fleet override (e.g. an API key) in the audit log."""
        await self.change_fleet(who, action, target, before, after)

    def apply_overrides(self, overrides: Overrides) -> None:
        gw = self._gw
        if overrides.reload_at > self._reload_seen:
            if self._reload_seen or overrides.reload_at > self._started_at:
                self._reread_config()
            self._reload_seen = overrides.reload_at
        gw.fleet.apply(gw.settings.pools, overrides)
        self.overrides = overrides

    def _reread_config(self) -> None:
        gw = self._gw
        path = os.environ.get("GATEWAY_CONFIG")
        if not path:
            log.warning("reload asked, but this replica has no config file (GATEWAY_CONFIG unset)")
            return
        try:
            fresh = load_settings(path)
        except Exception as exc:
            log.error("reload failed, keeping the current config: %s", exc)
            return
        gw.settings = gw.settings.model_copy(update={"pools": fresh.pools, "models": fresh.models})
        gw.models = {m.name: m for m in fresh.models if any(m.name in p.models for p in fresh.pools)}
        log.info("config reloaded from %s", path)

    async def reload_config(self, who: Principal) -> None:
        await self.change_fleet(who, "reload", "config", None, None, updates={"reload": time.time()})

    def describe_fleet(self) -> list[dict[str, Any]]:
        gw = self._gw
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
                        "requests_total": b.requests_total,
                        "load": None
                        if b.load is None
                        else {
                            "running": b.load.running,
                            "waiting": b.load.waiting,
                            "kv_usage": b.load.kv_usage,
                            "age_s": round(now - b.load_at, 3),
                        },
                    }
                    for b in p.backends.values()
                ],
            }
            for p in gw.fleet.pools.values()
        ]

    def explain(self, body: dict[str, Any], pin: str | None) -> dict[str, Any]:
        """Where `body` would be routed now, and why (a dry run: no routing state changes)."""
        gw = self._gw
        assert gw.route is not None, "lifespan start-up has not run"
        model = body.get("model")
        if not isinstance(model, str) or model not in gw.models:
            raise model_not_found(str(model))
        features = extract_features(body, gw.route.features)
        try:
            decision = gw.route.router.decide(
                gw.fleet.snapshot(time.monotonic()), features, 0.5, pin=pin, dry_run=True
            )
        except RoutingError as exc:
            return {
                "routable": False,
                "error": exc.kind,
                "reason": exc.reason,
                "features": _features_dict(features),
            }
        return {
            "routable": True,
            "pool": decision.pool,
            "backend": decision.backend,
            "reason": decision.reason,
            "affinity": decision.affinity,
            "features": _features_dict(features),
        }


def _features_dict(f: RequestFeatures) -> dict[str, Any]:
    return {
        "prompt_tokens": f.prompt_tokens,
        "blocks": len(f.block_hashes),
        "anchor": f"{f.anchor_hash:016x}",
        "has_tools": f.has_tools,
        "tool_choice": f.tool_choice,
        "structured_output": f.structured_output,
        "max_tokens": f.max_tokens,
    }
