"""The admit stage: per-user and per-tenant requests/min, tokens/min, concurrency and budgets (per
user, tenant and API key), before routing.

For each request: the principal's scopes (its tier's user limits, its tenant's limits), its spend
(`gateway/admission/spend.py`: the budgets and ledgers of its user, tenant and key) and a
reservation (the prompt estimate from the sanitise stage plus the completion budget, in tokens and,
at the model's prices, in money: `policies.budgets.reserve`) go to the limiter in one call.
Admitted: OpenAI's `x-ratelimit-*` headers are added to the response and a finalizer is registered
that, when the response has ended — sent, failed or abandoned — replaces the reservation by the real
usage (`policies.budgets.settle`), records it per model in the ledgers, and frees the concurrency
slot. Rejected: 429 in OpenAI's shape — `rate_limit_exceeded` with a true `retry-after`, or
`insufficient_quota` for a budget, with `retry-after` only when it is true. Limiter unreachable
under `fail_closed`: 503 (an outage is not the client's rate limit).

Scopes with every limit at 0 are skipped; a principal with no limit and no budget at all costs no
limiter call - unless routing processes share their state (`share`, gateway/core/shared_load.py):
that rides in the same call, and in the finalizer's, so it is made for every request then.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import time
from collections.abc import Callable
from typing import Any

from engines.base import INPUT_ONLY
from engines.errors import ApiError
from gateway.admission.limits import FailoverLimiter, LimiterUnavailable, Meter, Spend, Ticket
from gateway.admission.principals import Principals
from gateway.admission.settings import LimitsSettings
from gateway.admission.spend import PeriodClock, SpendBook
from gateway.core.context import Principal, RequestContext
from gateway.core.responses import Response
from gateway.core.settings import ModelSettings
from gateway.core.shared_load import LoadShare, ShareAsk
from policies.admission import (
    Outcome,
    ScopeLimits,
    Verdict,
    completion_budget,
    error_type,
    header_pairs,
    reconciled,
    rejection_message,
    retry_headers,
)
from policies.budgets import FREE, Price, quota_headers, quota_message, reserve, settle

#: (stage, reason, ctx) → count a rejection (gateway_rejections; `Metrics.reject`)
RejectHook = Callable[[str, str, RequestContext], None]
#: (scope, period) of a budget that refused a request → count it (gateway_budget_rejections)
BudgetHook = Callable[[str, str], None]

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
        self,
        limiter: FailoverLimiter,
        settings: LimitsSettings,
        on_reject: RejectHook | None = None,
        *,
        on_budget: BudgetHook | None = None,
        book: SpendBook | None = None,
        clock: PeriodClock | None = None,
        share: LoadShare | None = None,
    ) -> None:
        self._limiter = limiter
        #: the routing state this process shares, carried by the limiter's calls (None: not shared)
        self._share = share
        self._settings = settings
        self._on_reject = on_reject
        self._on_budget = on_budget
        self._scopes: dict[tuple[str, str | None, str, str], tuple[ScopeLimits, ...]] = {}
        self._ids = itertools.count()
        self._id_prefix = os.urandom(6).hex() + "-"
        self.book = book or SpendBook(settings)
        #: where the spend report finds a user's tenant and tier (None: not recorded)
        self.principals: Principals | None = None
        self._clock = clock or PeriodClock()
        self._prices: dict[str, Price] = {}

    def reconfigure(self, settings: LimitsSettings) -> None:
        """Use `settings` (a reloaded config's tiers and tenants) from the next request on; the
        windows, leases and spend already counted stay."""
        self._settings = settings
        self._scopes.clear()

    def scopes(self, principal: Principal, model: str = "") -> tuple[ScopeLimits, ...]:
        """The limits that apply to `principal` using `model` (cached; only scopes with some limit)."""
        key = (principal.user, principal.tenant, principal.tier, model)
        found = self._scopes.get(key)
        if found is not None:
            return found
        s = self._settings
        tier = s.tiers.get(principal.tier) or s.tiers[s.default_tier]
        user_key, tenant_key = scope_prefix(principal)
        out: list[ScopeLimits] = []
        per_model = tier.models.get(model)
        if per_model is not None and (per_model.requests_per_minute or per_model.tokens_per_minute):
            label = f"user {principal.user} on {model}"
            out.append(
                ScopeLimits(
                    f"{user_key}:m:{model}",
                    label,
                    per_model.requests_per_minute,
                    per_model.tokens_per_minute,
                    0,
                )
            )
        if tier.requests_per_minute or tier.tokens_per_minute or tier.concurrent_requests:
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
            tenant_model = t.models.get(model)
            if tenant_model is not None and (
                tenant_model.requests_per_minute or tenant_model.tokens_per_minute
            ):
                label = f"tenant {principal.tenant} on {model}"
                out.append(
                    ScopeLimits(
                        f"{tenant_key}:m:{model}",
                        label,
                        tenant_model.requests_per_minute,
                        tenant_model.tokens_per_minute,
                        0,
                    )
                )
            if t.requests_per_minute or t.tokens_per_minute or t.concurrent_requests:
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

    @staticmethod
    def _reconciled(scopes: tuple[ScopeLimits, ...]) -> bool:
        return any(s.tokens or s.concurrent for s in scopes)

    def _price(self, model: ModelSettings) -> Price:
        price = self._prices.get(model.name)
        if price is None:
            price = self._prices[model.name] = model.price.price() if model.price is not None else FREE
        return price

    async def __call__(self, ctx: RequestContext) -> Response | None:
        principal = ctx.principal
        scopes = self.scopes(principal, ctx.model.name if ctx.model is not None else "")
        # the spend of a principal whose requests are reconciled anyway (a tokens/min or concurrency
        # limit: the finalizer calls the limiter) is recorded in that same call: no extra round trip
        share = self._share
        plan = self.book.plan(principal, self._reconciled(scopes))
        if not scopes and plan is None and share is None:
            return None
        if plan is not None and self.principals is not None:
            self.principals.remember(principal)
        model = ctx.model
        assert model is not None, "the parse stage resolves the model"
        prompt = _prompt_tokens(ctx)
        # an embedding, a tokenization or a score generates nothing: its reservation is its input alone
        completion = (
            0 if ctx.endpoint in INPUT_ONLY else completion_budget(ctx.body, model.default_max_tokens)
        )
        cost = max(1, prompt + completion)
        id = self._id_prefix + str(next(self._ids))
        spend: Spend | None = None
        price = FREE
        now = 0.0
        if plan is not None:
            price = self._price(model)
            now, day, month = self._clock.now()
            spend = plan.spend(day, month, model.name, reserve(price, prompt, completion))
        ask = await share.ask(ctx) if share is not None else None
        try:
            ticket = await self._acquire(ctx, id, scopes, cost, spend, now, ask)
        finally:
            if share is not None and ask is not None:
                share.told(ctx, ask)
        ctx.extras["limit_ticket"] = ticket

        async def release(ctx: RequestContext) -> None:
            usage = ctx.usage
            reached = ctx.attempts > 0
            kept = reconciled(cost, usage.total_tokens if usage is not None else None, reached)
            final = None
            if spend is not None:
                counts = None
                if usage is not None:
                    counts = (usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens or 0)
                served = ctx.model
                charged = price
                if served is not None and served.name != spend.model:  # a fallback model served it
                    ticket.spend = dataclasses.replace(spend, model=served.name)
                    charged = self._price(served)
                final = settle(spend.reserved, charged, counts, reached)
            await self._limiter.finish(ticket, kept, final, share is not None)

        ctx.finalizers.append(release)
        return None

    async def _acquire(
        self,
        ctx: RequestContext,
        id: str,
        scopes: tuple[ScopeLimits, ...],
        cost: int,
        spend: Spend | None,
        now: float,
        ask: ShareAsk | None = None,
    ) -> Ticket:
        model = ctx.model
        assert model is not None
        try:
            verdict, holder = await self._limiter.acquire(id, scopes, cost, spend, ask)
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
        outcome = verdict.outcome
        if outcome is Outcome.ADMITTED:
            return Ticket(id, scopes, cost, holder, spend)
        if outcome in (Outcome.QUOTA, Outcome.QUOTA_TOO_LARGE):
            assert spend is not None
            raise self._over_budget(ctx, verdict, spend.meters[verdict.scope - 1], now)
        self._reject(_REASON[outcome], ctx)
        label = scopes[verdict.scope - 1].label if verdict.scope else ""
        raise ApiError(
            429,
            rejection_message(verdict, model.name, label),
            type=error_type(outcome),
            code="rate_limit_exceeded",
            headers=retry_headers(verdict),
        )

    def _over_budget(self, ctx: RequestContext, verdict: Verdict, meter: Meter, now: float) -> ApiError:
        """OpenAI's `insufficient_quota` 429, naming the budget; `retry-after` only when it is true."""
        budget = meter.budget
        too_large = verdict.outcome is Outcome.QUOTA_TOO_LARGE
        retry_ms: int | None = None
        resets: str | None = None
        if budget.calendar:
            retry_ms = max(1, meter.ends_at_ms - int(now * 1000))
            resets = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(meter.ends_at_ms // 1000))
        elif verdict.retry_ms > 0:
            retry_ms = verdict.retry_ms
        self._reject("budget", ctx)
        if self._on_budget is not None:
            self._on_budget(meter.scope, budget.period)
        return ApiError(
            429,
            quota_message(budget, meter.label, verdict.used, verdict.requested, retry_ms, resets),
            type="insufficient_quota",
            code="insufficient_quota",
            headers=quota_headers(too_large, None if too_large else retry_ms),
        )

    def _reject(self, reason: str, ctx: RequestContext) -> None:
        if self._on_reject is not None:
            self._on_reject(self.metric_stage, reason, ctx)


def _prompt_tokens(ctx: RequestContext) -> int:
    """The sanitise stage's estimate (`ctx.extras["features"]`), else a fresh one; over every prompt
    of a completions batch."""
    features: Any = ctx.extras.get("features")
    if features is not None:
        return int(features.total_prompt_tokens)
    from policies.features import extract_features

    return extract_features(ctx.body).total_prompt_tokens
