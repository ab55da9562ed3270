"""Model access per tier, tenant and API key: which models a principal may use.

The grants come from the config (`limits.tiers.<tier>` and `limits.tenants.<tenant>` /
`limits.tenants.default`: `allow_models`, `deny_models`) and from the principal's API key (created
with a model list through the admin API). A model is usable only when every grant permits it
(`policies.access.combine`). The parse stage asks `permits` right after resolving the model, so a
model the caller may not use is the same 404 `model_not_found` as a model that does not exist —
OpenAI's answer, no existence leak — and `/v1/models` lists only what `permits`.

The combined grant is cached per (tier, tenant, key id, key revision): a request costs one dict
lookup and one or two set lookups.
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.admission.settings import LimitsSettings
from gateway.core.context import Principal
from policies.access import EVERY_MODEL, ModelAccess, combine

_CACHE_MAX = 65536


class ModelAccessRules:
    def __init__(self, limits: LimitsSettings) -> None:
        self._cache: dict[tuple[str, str | None, str | None, int], ModelAccess] = {}
        self.reconfigure(limits)

    def reconfigure(self, limits: LimitsSettings) -> None:
        """Use `limits` (a reloaded config's) from the next request on."""
        self._limits = limits
        #: no tier and no tenant restricts anything: only API keys can narrow access
        self._open = all(scope.access is None for _, scope in limits.scopes())
        self._cache.clear()

    def grant(self, principal: Principal) -> ModelAccess:
        """What `principal` may use: its tier's, its tenant's and its key's grants together."""
        if self._open:
            return principal.key_access or EVERY_MODEL
        key = (principal.tier, principal.tenant, principal.key_id, principal.key_rev)
        found = self._cache.get(key)
        if found is not None:
            return found
        limits = self._limits
        tier = limits.tiers.get(principal.tier) or limits.tiers[limits.default_tier]
        tenant = None
        if principal.tenant is not None:
            tenant = limits.tenants.get(principal.tenant, limits.tenant_default)
        grant = combine((tier.access, tenant.access if tenant else None, principal.key_access))
        if len(self._cache) >= _CACHE_MAX:
            self._cache.clear()
        self._cache[key] = grant
        return grant

    def permits(self, principal: Principal, model: str) -> bool:
        return self.grant(principal).permits(model)

    def visible(self, principal: Principal, models: Iterable[str]) -> list[str]:
        """The names of `models` that `principal` may use, in their order."""
        grant = self.grant(principal)
        return [m for m in models if grant.permits(m)]
