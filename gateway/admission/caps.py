"""The caps stage: a ceiling on the output tokens a request may ask for, per model
(`models[].max_tokens`), per tier and per tenant (`max_tokens`, overall or per model).

The request's `max_completion_tokens` (else `max_tokens`) is compared with the lowest ceiling that
applies; a request that sets neither is given the ceiling. Above it, `limits.over_max_tokens` decides:
`clamp` lowers it and the answer carries `x-gateway-max-tokens` with the value the engine was asked
for; `reject` answers 400 naming the field and the ceiling. Runs before admission, so the token
reservation counts the clamped value.
"""

from __future__ import annotations

from engines.errors import invalid_request
from gateway.admission.settings import LimitsSettings
from gateway.core.context import RequestContext
from gateway.core.responses import Response

_FIELDS = ("max_completion_tokens", "max_tokens")


class CapsStage:
    name = "caps"

    def __init__(self, limits: LimitsSettings) -> None:
        self.reconfigure(limits)

    def reconfigure(self, limits: LimitsSettings) -> None:
        self._limits = limits
        self._clamp = limits.over_max_tokens == "clamp"

    def ceiling(self, ctx: RequestContext) -> int | None:
        """The lowest output ceiling for this caller and model (None: none)."""
        model = ctx.model
        if model is None:
            return None
        limits, p = self._limits, ctx.principal
        tier = limits.tiers.get(p.tier) or limits.tiers[limits.default_tier]
        caps = [model.max_tokens, tier.max_tokens_for(model.name)]
        if p.tenant is not None:
            caps.append(limits.tenants.get(p.tenant, limits.tenant_default).max_tokens_for(model.name))
        found = [c for c in caps if c]
        return min(found) if found else None

    async def __call__(self, ctx: RequestContext) -> Response | None:
        ceiling = self.ceiling(ctx)
        if ceiling is None:
            return None
        body = ctx.body
        field = next((f for f in _FIELDS if isinstance(body.get(f), int)), None)
        asked = body[field] if field is not None else None
        if asked is not None and asked <= ceiling:
            return None
        if asked is not None and not self._clamp:
            raise invalid_request(
                f"{field} is too large: {asked}. You may ask this model for at most {ceiling} output tokens.",
                param=field,
                code="integer_above_max_value",
            )
        body[field or "max_tokens"] = ceiling
        ctx.response_headers.append((b"x-gateway-max-tokens", str(ceiling).encode()))
        return None
