"""The admit stage: per-user and per-tenant requests/min, tokens/min and concurrency, before routing.

For each request: the principal's scopes (its tier's user limits, its tenant's limits) and a token
reservation (`policies.admission.reservation`: the prompt estimate from the sanitise stage plus the
completion budget) go to the limiter in one call. Admitted: OpenAI's `x-ratelimit-*` headers are
added to the response and a finalizer is registered that, when the response has ended — sent,
failed or abandoned — replaces the reservation by the real usage and frees the concurrency slot.
Rejected: 429 in OpenAI's shape with a true `retry-after`. Limiter unreachable under `fail_closed`:
503 (an outage is not the client's rate limit).

Scopes with every limit at 0 are skipped; a principal with no limit at all costs no limiter call.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from typing import Any

from engines.errors import ApiError
from gateway.admission.limits import FailoverLimiter, LimiterUnavailable, Ticket
from gateway.admission.settings import LimitsSettings
from gateway.core.context import Principal, RequestContext
from gateway.core.responses import Response
from policies.admission import (
    Outcome,
    ScopeLimits,
    error_type,
    header_pairs,
    reconciled,
    rejection_message,
    reservation,
    retry_headers,
)

#: (stage, reason, ctx) → count a rejection (gateway_rejections; `Metrics.reject`)
RejectHook = Callable[[str, str, RequestContext], None]

_REASON = {
    Outcome.REQUESTS: "requests",
    Outcome.TOKENS: "tokens",
    Outcome.CONCURRENCY: "concurrency",
    Outcome.TOO_LARGE: "too_large",
}
_SCOPE_CACHE_MAX = 65536


def scope_prefix(principal: Principal) -> tuple[str, str | None]:
    """Key prefixes of the principal's user scope and tenant scope (None without a tenant). The hash
    tag is the tenant when there is one, so a user's and their tenant's keys share a Cluster slot."""
    if principal.tenant:
        tag = "{t:" + principal.tenant + "}"
        return f"gw:rl:{tag}:u:{principal.user}", f"gw:rl:{tag}:t"
    return "gw:rl:{u:" + principal.user + "}:u", None


class AdmitStage:
    name = "admit"
    #: the `stage` label of its rejections (gateway/observability/metrics.py LIMIT_REASONS are its reasons)
    metric_stage = "limit"

    def __init__(
        self, limiter: FailoverLimiter, settings: LimitsSettings, on_reject: RejectHook | None = None
    ) -> None:
        self._limiter = limiter
        self._settings = settings
        self._on_reject = on_reject
        self._scopes: dict[tuple[str, str | None, str], tuple[ScopeLimits, ...]] = {}
        self._ids = itertools.count()
        self._id_prefix = os.urandom(6).hex() + "-"

    def scopes(self, principal: Principal) -> tuple[ScopeLimits, ...]:
        """The limits that apply to `principal` (cached; only scopes with some limit)."""
        key = (principal.user, principal.tenant, principal.tier)
        found = self._scopes.get(key)
        if found is not None:
            return found
        s = self._settings
        tier = s.tiers.get(principal.tier) or s.tiers[s.default_tier]
        user_key, tenant_key = scope_prefix(principal)
        out: list[ScopeLimits] = []
        if not tier.unlimited:
            out.append(
                ScopeLimits(
                    user_key,
                    f"user {principal.user}",
                    tier.requests_per_minute,
                    tier.tokens_per_minute,
                    tier.concurrent_requests,
                )
            )
        if tenant_key is not None and principal.tenant is not None:
            t = s.tenants.get(principal.tenant, s.tenant_default)
            if not t.unlimited:
                out.append(
                    ScopeLimits(
                        tenant_key,
                        f"tenant {principal.tenant}",
                        t.requests_per_minute,
                        t.tokens_per_minute,
                        t.concurrent_requests,
                    )
                )
        if len(self._scopes) >= _SCOPE_CACHE_MAX:
            self._scopes.clear()
        result = self._scopes[key] = tuple(out)
        return result

    async def __call__(self, ctx: RequestContext) -> Response | None:
        scopes = self.scopes(ctx.principal)
        if not scopes:
            return None
        model = ctx.model
        assert model is not None, "the parse stage resolves the model"
        # an embedding generates nothing: its reservation is its input alone
        budget = 0 if ctx.endpoint == "embeddings" else model.default_max_tokens
        cost = reservation(_prompt_tokens(ctx), ctx.body, budget)
        id = self._id_prefix + str(next(self._ids))
        try:
            verdict, holder = await self._limiter.acquire(id, scopes, cost)
        except LimiterUnavailable:
            self._reject("unavailable", ctx)
            raise ApiError(
                503,
                "Rate limits cannot be checked right now. Please retry your request shortly.",
                type="server_error",
                code="rate_limiter_unavailable",
                headers={"retry-after": "1"},
            ) from None
        ctx.response_headers.extend(header_pairs(verdict))
        if verdict.outcome is not Outcome.ADMITTED:
            self._reject(_REASON[verdict.outcome], ctx)
            label = scopes[verdict.scope - 1].label if verdict.scope else ""
            raise ApiError(
                429,
                rejection_message(verdict, model.name, label),
                type=error_type(verdict.outcome),
                code="rate_limit_exceeded",
                headers=retry_headers(verdict),
            )
        ticket = Ticket(id, scopes, cost, holder)
        ctx.extras["limit_ticket"] = ticket

        async def release(ctx: RequestContext) -> None:
            usage = ctx.usage
            kept = reconciled(cost, usage.total_tokens if usage is not None else None, ctx.attempts > 0)
            await self._limiter.finish(ticket, kept)

        ctx.finalizers.append(release)
        return None

    def _reject(self, reason: str, ctx: RequestContext) -> None:
        if self._on_reject is not None:
            self._on_reject(self.metric_stage, reason, ctx)


def _prompt_tokens(ctx: RequestContext) -> int:
    """The sanitise stage's estimate (`ctx.extras["features"]`), else a fresh one."""
    features: Any = ctx.extras.get("features")
    if features is not None:
        return int(features.prompt_tokens)
    from policies.features import extract_features

    return extract_features(ctx.body).prompt_tokens
