"""Spend: budgets per user, tenant and API key, and the ledgers that record what requests cost.

    SpendBook     the principal's spend scopes — user, tenant, API key — with their budgets (config:
                  `limits.tiers.<tier>.budgets` per user, `limits.tenants.<t>.budgets` per tenant;
                  the key's own from the admin API), cached per principal as a `SpendPlan`
    SpendPlan     per request (`spend`): the `Spend` the limiter checks and records — the ledgers of
                  the current UTC day and month and the budgets as meters, what the request reserved
    PeriodClock   the current UTC day and month, recomputed only when one ends
    SpendReport   `GET /admin/spend`: one scope's ledgers and budgets, read from the store

Names in the store (the limits' hash tag, so one script checks limits and budgets together):

    user     gw:sp:{t:acme}:u:alice     (gw:sp:{u:alice}:u without a tenant)
    tenant   gw:sp:{t:acme}:t
    API key  gw:sp:{t:acme}:k:<key id>  (gw:sp:{u:svc}:k:<key id> without a tenant)
    + ":d:2026-12-01" / ":m:2026-12"     a UTC day's / month's ledger (hash)
    + ":w3600:usd" (+ ":sum")            a rolling budget's sliding log

Calendar periods roll by this process's clock (UTC): a request within the replicas' clock skew of
midnight may count in either day. Rolling windows use the store's clock, like the rate limits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.admission.limits import FailoverLimiter, Ledger, Meter, Spend
from gateway.admission.settings import LimitsSettings
from gateway.core.context import Principal
from policies.budgets import (
    NANOS_PER_USD,
    Budget,
    Charge,
    Period,
    Span,
    calendar_span,
    expires_at_s,
    span_of,
)

_CACHE_MAX = 65536
_FIELD = {"tokens": "tok", "usd": "usd"}


class PeriodClock:
    """The current UTC day and month (`policies.budgets.calendar_span`), recomputed only when the day
    ends: a request costs one clock read and a comparison."""

    __slots__ = ("_clock", "_day", "_month")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._day = Span("day", "", 0, 0)
        self._month = Span("month", "", 0, 0)

    def now(self) -> tuple[float, Span, Span]:
        now = self._clock()
        if now >= self._day.end_s or now < self._day.start_s:
            self._day = calendar_span("day", now)
            self._month = calendar_span("month", now)
        return now, self._day, self._month


@dataclass(frozen=True, slots=True)
class SpendScope:
    """One scope a request's spend counts in. `ledgered`: its day and month ledgers are written."""

    kind: str  # "user", "tenant" or "key"
    label: str  # "user alice", "tenant acme", "API key key_…" (messages)
    prefix: str
    budgets: tuple[Budget, ...]
    ledgered: bool


def spend_prefixes(user: str, tenant: str | None, key_id: str | None) -> dict[str, str]:
    """The store prefix of each spend scope of a principal (`user`, `tenant`, `key`)."""
    tag = "{t:" + tenant + "}" if tenant else "{u:" + user + "}"
    out = {"user": f"gw:sp:{tag}:u:{user}" if tenant else f"gw:sp:{tag}:u"}
    if tenant:
        out["tenant"] = f"gw:sp:{tag}:t"
    if key_id:
        out["key"] = f"gw:sp:{tag}:k:{key_id}"
    return out


class SpendPlan:
    """The static part of a principal's spend; `spend(…)` gives one request's `Spend`. The ledgers
    and meters of the current periods are built once per day and reused."""

    __slots__ = ("_day", "_memo", "scopes")

    def __init__(self, scopes: Sequence[SpendScope]) -> None:
        self.scopes = tuple(scopes)
        self._day = ""
        self._memo: tuple[tuple[Ledger, ...], tuple[Meter, ...], int] = ((), (), 0)

    def spend(self, day: Span, month: Span, model: str, reserved: Charge) -> Spend:
        if day.id != self._day:
            self._memo = self._build(day, month)
            self._day = day.id
        ledgers, meters, n_calendar = self._memo
        return Spend(ledgers, meters, n_calendar, model, reserved)

    def _build(self, day: Span, month: Span) -> tuple[tuple[Ledger, ...], tuple[Meter, ...], int]:
        ledgers: list[Ledger] = []
        calendar: list[Meter] = []
        rolling: list[Meter] = []
        for scope in self.scopes:
            index: dict[str, int] = {}
            if scope.ledgered:
                for span, tag in ((day, "d"), (month, "m")):
                    index[span.period] = len(ledgers)
                    ledgers.append(Ledger(f"{scope.prefix}:{tag}:{span.id}", expires_at_s(span) * 1000))
            for b in scope.budgets:
                if b.calendar:
                    span = day if b.period == "day" else month
                    at = index[b.period]
                    calendar.append(Meter(b, scope.label, scope.kind, ledgers[at].key, at, span.end_s * 1000))
                else:
                    key = f"{scope.prefix}:w{b.window_s}:{b.unit}"
                    rolling.append(Meter(b, scope.label, scope.kind, key))
        return tuple(ledgers), (*calendar, *rolling), len(calendar)


class SpendBook:
    """Each principal's `SpendPlan`, from the config's budgets and the principal's API key."""

    def __init__(self, limits: LimitsSettings) -> None:
        self._plans: dict[tuple[str, str | None, str, str | None, int, bool], SpendPlan | None] = {}
        self.reconfigure(limits)

    def reconfigure(self, limits: LimitsSettings) -> None:
        """Use `limits` (a reloaded config's budgets) from the next request on."""
        self._limits = limits
        self._plans.clear()

    def tier_budgets(self, tier: str) -> tuple[Budget, ...]:
        limits = self._limits
        return (limits.tiers.get(tier) or limits.tiers[limits.default_tier]).spending_limits

    def tenant_budgets(self, tenant: str) -> tuple[Budget, ...]:
        return self._limits.tenants.get(tenant, self._limits.tenant_default).spending_limits

    def plan(self, principal: Principal, limited: bool) -> SpendPlan | None:
        """The principal's plan, None when there is nothing to check or record. `limited`: the
        principal's requests are reconciled by the limiter anyway (a tokens/min or concurrency limit),
        so its spend is recorded in those calls (a principal with only a requests/min limit, or none,
        is not: that would cost a round trip)."""
        p = principal
        cache_key = (p.user, p.tenant, p.tier, p.key_id, p.key_rev, limited)
        if cache_key in self._plans:
            return self._plans[cache_key]
        prefixes = spend_prefixes(p.user, p.tenant, p.key_id)
        budgets = {
            "user": self.tier_budgets(p.tier),
            "tenant": self.tenant_budgets(p.tenant) if p.tenant else (),
            "key": p.key_budgets,
        }
        labels = {"user": f"user {p.user}", "tenant": f"tenant {p.tenant}", "key": f"API key {p.key_id}"}
        track = limited or any(budgets.values())
        scopes = [
            SpendScope(
                kind,
                labels[kind],
                prefix,
                budgets[kind],
                track,
            )
            for kind, prefix in prefixes.items()
        ]
        scopes = [s for s in scopes if s.budgets or s.ledgered]
        plan = SpendPlan(scopes) if scopes else None
        if len(self._plans) >= _CACHE_MAX:
            self._plans.clear()
        self._plans[cache_key] = plan
        return plan


class SpendReport:
    """`GET /admin/spend`: one scope's spend in one UTC day and month (the current ones, or those
    containing `date`), by model, with the scope's budgets and their rolling windows."""

    def __init__(self, limiter: FailoverLimiter, book: SpendBook, clock: PeriodClock) -> None:
        self._limiter = limiter
        self._book = book
        self._clock = clock

    async def report(
        self,
        *,
        kind: str,
        user: str | None,
        tenant: str | None,
        key_id: str | None,
        budgets: tuple[Budget, ...],
        periods: Sequence[Period],
        date: str | None,
        model: str | None,
    ) -> dict[str, Any]:
        """Raises ValueError for a `date` that is no day or month, StoreDown when the store is down."""
        prefix = spend_prefixes(user or "", tenant, key_id)[kind]
        now, day, month = self._clock.now()
        spans = []
        for period in periods:
            if date is None:
                spans.append(day if period == "day" else month)
            else:
                spans.append(span_of(period, date if period == "day" or len(date) == 7 else date[:7]))
        ledger_keys = [f"{prefix}:{'d' if s.period == 'day' else 'm'}:{s.id}" for s in spans]
        rolling = [b for b in budgets if not b.calendar]
        logs = [(f"{prefix}:w{b.window_s}:{b.unit}", b.window_s * 1000) for b in rolling]
        fields, sums = await self._limiter.read_spend(ledger_keys, logs)
        out_periods = []
        for span, found in zip(spans, fields, strict=True):
            per_model = _by_model(found)
            tokens, nanos = found.get("tok", 0), found.get("usd", 0)
            entry: dict[str, Any] = {
                "period": span.period,
                "id": span.id,
                "start": _iso(span.start_s),
                "end": _iso(span.end_s),
                "current": span.start_s <= now < span.end_s,
                "tokens": tokens,
                "usd": nanos / NANOS_PER_USD,
                "requests": found.get("req", 0),
                # what admitted requests reserved and is not reconciled yet (they are still running)
                "reserved": {
                    "tokens": tokens - sum(m[0] for m in per_model.values()),
                    "usd": (nanos - sum(m[1] for m in per_model.values())) / NANOS_PER_USD,
                },
                "models": {
                    name: {"tokens": t, "usd": n / NANOS_PER_USD, "requests": r}
                    for name, (t, n, r) in per_model.items()
                    if model is None or name == model
                },
                "budgets": [
                    _budget_view(b, found.get(_FIELD[b.unit], 0)) for b in budgets if b.period == span.period
                ],
            }
            if model is not None and model not in entry["models"]:
                entry["models"][model] = {"tokens": 0, "usd": 0.0, "requests": 0}
            out_periods.append(entry)
        return {
            "scope": kind,
            "user": user if kind == "user" else None,
            "tenant": tenant,
            "key": key_id,
            "periods": out_periods,
            "rolling": [_budget_view(b, used) for b, used in zip(rolling, sums, strict=True)],
            "shared": self._limiter.shared,
        }

    async def ranked(
        self, users: dict[str, dict[str, Any]], period: Period, date: str | None
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Every user's spend in one period (the current one, or the one containing `date`), largest
        first (by USD, then tokens): (the period, the users)."""
        _, day, month = self._clock.now()
        if date is None:
            span = day if period == "day" else month
        else:
            span = span_of(period, date if period == "day" or len(date) == 7 else date[:7])
        suffix = f":{'d' if period == 'day' else 'm'}:{span.id}"
        names = sorted(users)
        out: list[dict[str, Any]] = []
        for start in range(0, len(names), _RANK_BATCH):
            batch = names[start : start + _RANK_BATCH]
            keys = [spend_prefixes(u, users[u].get("tenant"), None)["user"] + suffix for u in batch]
            fields, _ = await self._limiter.read_spend(keys, [])
            for user, found in zip(batch, fields, strict=True):
                if found:
                    entry = users[user]
                    usd = found.get("usd", 0) / NANOS_PER_USD
                    out.append(
                        {
                            "user": user,
                            "tenant": entry.get("tenant"),
                            "tier": entry.get("tier"),
                            "tokens": found.get("tok", 0),
                            "usd": usd,
                            "requests": found.get("req", 0),
                        }
                    )
        out.sort(key=lambda e: (-e["usd"], -e["tokens"], e["user"]))
        window = {"period": span.period, "id": span.id, "start": _iso(span.start_s), "end": _iso(span.end_s)}
        return window, out


#: user ledgers read in one call when ranking spend
_RANK_BATCH = 256


def _by_model(fields: dict[str, int]) -> dict[str, tuple[int, int, int]]:
    """(tokens, nano-dollars, requests) per model, from a ledger's `m:<model>:tok|usd|req` fields."""
    out: dict[str, list[int]] = {}
    for name, value in fields.items():
        if name.startswith("m:"):
            model, _, what = name[2:].rpartition(":")
            slot = {"tok": 0, "usd": 1, "req": 2}.get(what)
            if slot is not None:
                out.setdefault(model, [0, 0, 0])[slot] = value
    return {m: (v[0], v[1], v[2]) for m, v in sorted(out.items())}


def _budget_view(b: Budget, used: int) -> dict[str, Any]:
    scale = NANOS_PER_USD if b.unit == "usd" else 1
    return {
        **b.as_dict(),
        "unit": b.unit,
        "limit": b.limit / scale if scale > 1 else b.limit,
        "used": used / scale if scale > 1 else used,
        "remaining": max(0, b.limit - used) / scale if scale > 1 else max(0, b.limit - used),
    }


def _iso(ts: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))
