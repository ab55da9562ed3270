"""Admission assembled from settings: who may call (auth), how much (limits), with what (sanitise).

The root (`gateway/app.py`) builds one `Admission` at construction and asks it for its pipeline stages:

    [AuthenticateStage]  ParseStage  ValidateStage  SanitiseStage  [AdmitStage]  RouteStage  ProxyStage
     ^ only when auth is on  ^ asks `permits`                       ^ only when some limit is set
                               (model access)

`start(redis)` binds the shared store (Redis limits, Redis-backed API keys, JWKS fetching) once the
process's Redis client exists; `aclose()` stops the background tasks. Without Redis everything
works in this process only, and the start-up log says so. `authorize_admin` is the guard of the
admin API. What admission reports (rejections, Redis timings) goes to the `Observer` handed in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge
from redis.asyncio import Redis
from redis.exceptions import RedisError

from engines.errors import ApiError, invalid_request
from gateway.admission.access import ModelAccessRules
from gateway.admission.admit import AdmitStage
from gateway.admission.api_keys import ApiKeys, MemoryBackend, RedisBackend
from gateway.admission.auth import AuthenticateStage, Authenticator, require_admin
from gateway.admission.caps import CapsStage
from gateway.admission.jwks import JwksCache
from gateway.admission.jwt_auth import SECRET_ALGORITHMS, JwtVerifier
from gateway.admission.limits import FailoverLimiter, StoreDown
from gateway.admission.limits_local import LocalLimiter
from gateway.admission.limits_redis import RedisLimiter
from gateway.admission.media import MediaStage
from gateway.admission.media_fetch import MediaFetcher
from gateway.admission.principals import Principals
from gateway.admission.sanitise import SanitiseStage
from gateway.admission.settings import AuthSettings, LimitsSettings, SanitiseSettings
from gateway.admission.spend import PeriodClock, SpendBook, SpendReport
from gateway.core.context import ANONYMOUS, Principal, RequestContext
from gateway.core.redis_client import TIMEOUT_S
from gateway.core.redis_wire import RespClient
from gateway.core.settings import ModelSettings, RedisSettings
from gateway.core.shared_load import LoadShare
from policies.budgets import Budget, Period
from policies.features import FeatureConfig

log = logging.getLogger("gateway.admission")

#: the window of the per-minute limits (requests and tokens per minute): a minute, by definition
WINDOW_S = 60.0


class Observer(Protocol):
    """Where admission reports (gateway/observability/metrics.py's `Metrics` is one); its own
    counters go on `registry`."""

    registry: CollectorRegistry

    def reject(self, stage: str, reason: str, ctx: RequestContext | None = None) -> None: ...

    def observe_redis(self, op: str, seconds: float) -> None: ...

    def redis_failure(self, op: str) -> None: ...

    def budget_rejection(self, scope: str, period: str) -> None: ...


class Admission:
    def __init__(
        self,
        auth: AuthSettings,
        limits: LimitsSettings,
        sanitise: SanitiseSettings,
        redis: RedisSettings,
        observer: Observer,
    ) -> None:
        self._auth, self._limits, self._sanitise, self._redis = auth, limits, sanitise, redis
        self._observer = observer
        r = observer.registry
        self._limiter_local = Counter(
            "gateway_limiter_local_decisions",
            "Limit decisions taken by this process alone because Redis was unreachable (fail_open).",
            registry=r,
        )
        self._limiter_down = Gauge(
            "gateway_limiter_redis_down",
            "1 while the shared limiter's Redis is unreachable.",
            registry=r,
            multiprocess_mode="livemax",
        )
        self._limiter_outages = Counter(
            "gateway_limiter_redis_outages", "Times the shared limiter lost Redis.", registry=r
        )
        self._auth_enabled = Gauge(
            "gateway_auth_enabled",
            "1 when requests are authenticated; 0 when every request is served as anonymous.",
            registry=r,
            multiprocess_mode="livemin",
        )
        self.jwks: JwksCache | None = None
        self._media_fetcher: MediaFetcher | None = None
        #: the admit and caps stages, once built (a reload reconfigures them)
        self._admit: AdmitStage | None = None
        self._caps: CapsStage | None = None
        if auth.jwt.jwks_url:
            j = auth.jwt
            self.jwks = JwksCache(j.jwks_url or "", j.algorithms)
        jwt = JwtVerifier(auth.jwt, self.jwks) if auth.jwt.has_keys else None
        k = auth.api_keys
        self.api_keys = ApiKeys(MemoryBackend(), pepper=k.pepper)
        #: None when authentication is off (every request is `anonymous`)
        self.authenticator: Authenticator | None = None
        if auth.active:
            self.authenticator = Authenticator(
                jwt, self.api_keys if k.enabled else None, self.count_rejection
            )
        self._auth_enabled.set(1 if self.authenticator is not None else 0)
        self.limiter = FailoverLimiter(
            LocalLimiter(window_s=WINDOW_S),
            limits.on_redis_error,
            on_event=self._on_limiter_event,
        )
        self._redis_limiter: RedisLimiter | None = None
        self._wire: RespClient | None = None
        #: which models each principal may use (tier, tenant, API key); the parse stage and
        #: /v1/models ask it
        self.model_access = ModelAccessRules(limits)
        self.permits = self.model_access.permits
        #: budgets and spend ledgers per principal (the admit stage), and what `GET /admin/spend` reads
        self.spend_book = SpendBook(limits)
        self.spend = SpendReport(self.limiter, self.spend_book, PeriodClock())
        #: each user's tenant and tier as last seen (the spend report's lookup)
        self.principals = Principals()

    # -- stages -----------------------------------------------------------------------------------
    def authenticate_stages(self) -> list[AuthenticateStage]:
        """The stage that goes first (before the body is read), or none when auth is off."""
        return [AuthenticateStage(self.authenticator)] if self.authenticator is not None else []

    def sanitise_stage(self, features: FeatureConfig) -> SanitiseStage:
        """After ValidateStage; `features` must be the routing's config (its estimate is reused)."""
        return SanitiseStage(self._sanitise, features, self.count_rejection)

    def caps_stage(self, models: Iterable[ModelSettings]) -> list[CapsStage]:
        """After SanitiseStage: the output-token ceilings, when any is configured (none: no stage)."""
        if not (any(m.max_tokens for m in models) or _ceilings(self._limits)):
            return []
        self._caps = CapsStage(self._limits)
        return [self._caps]

    def media_stage(self, engine_hosts: Callable[[], Iterable[str]]) -> MediaStage:
        """After ValidateStage, before SanitiseStage (whose estimate reads the inlined media):
        `engine_hosts` are the backends' hosts, whose addresses media may never come from."""
        m = self._sanitise.media
        if self._media_fetcher is None:
            self._media_fetcher = MediaFetcher(m.allowed_hosts, m.max_bytes, engine_hosts=engine_hosts)
        return MediaStage(m, self._media_fetcher, self.count_rejection)

    #: the limits settings a reload applies at once (the others shape the limiter: a restart)
    LIVE_LIMITS = frozenset({"tiers", "tenants"})

    def reconfigure(self, limits: LimitsSettings) -> bool:
        """Apply a reloaded config's tiers, tenants and budgets from the next request on; False (and
        nothing changed) when that needs a restart: another limits setting changed, or the running
        pipeline has no admit stage and the new limits need one."""
        old = self._limits
        others = {k for k in type(old).model_fields if k not in self.LIVE_LIMITS}
        if any(getattr(old, k) != getattr(limits, k) for k in others):
            return False
        if self._admit is None and not limits.unlimited:
            return False
        if self._caps is None and _ceilings(limits):
            return False
        self._limits = limits
        self.model_access.reconfigure(limits)
        self.spend_book.reconfigure(limits)
        if self._caps is not None:
            self._caps.reconfigure(limits)
        if self._admit is not None:
            self._admit.reconfigure(limits)
        return True

    def admit_stages(self, share: LoadShare | None = None) -> list[AdmitStage]:
        """After SanitiseStage; none when no limit or budget is configured and no API key can carry a
        budget of its own (API keys off), unless routing state is shared (`share`: it rides in the
        limiter's calls, so they are made for every request; only with Redis bound, see `start`)."""
        limits = self._limits
        if self._redis_limiter is None:
            share = None
        elif share is not None:
            self._redis_limiter.bind_share(share)
        if (
            limits.unlimited
            and share is None
            and not (self.authenticator is not None and self._auth.api_keys.enabled)
        ):
            return []
        stage = self._admit = AdmitStage(
            self.limiter,
            limits,
            self.count_rejection,
            on_budget=self._observer.budget_rejection,
            book=self.spend_book,
            share=share,
        )
        stage.principals = self.principals
        return [stage]

    def priority_class(self, principal: Principal) -> str | None:
        """The flow-control class `principal`'s tier names, else its tenant's (None: neither names
        one; an API key's own class comes before both, gateway/flow/classes.py)."""
        limits = self._limits
        tier = limits.tiers.get(principal.tier) or limits.tiers[limits.default_tier]
        if tier.priority_class is not None or principal.tenant is None:
            return tier.priority_class
        return limits.tenants.get(principal.tenant, limits.tenant_default).priority_class

    async def report_share(self) -> bool:
        """Write this process's routing figures to the shared store and read the others' now (the
        flow queue's refresh while requests wait); False when nothing is shared or the store is down."""
        limiter = self._redis_limiter
        if limiter is None or not limiter.shares:
            return False
        try:
            await limiter.report()
        except (StoreDown, RedisError, OSError):
            return False
        return True

    async def shared_figures(self) -> dict[str, dict[str, int]] | None:
        """Every live routing process's figures by process, as the shared store holds them; None
        without shared routing state or while the store is unreachable."""
        limiter = self._redis_limiter
        if limiter is None or not limiter.shares:
            return None
        try:
            return await limiter.live()
        except (StoreDown, RedisError, OSError):
            return None

    async def principal(self, headers: dict[bytes, bytes]) -> Principal:
        """The caller, authenticated exactly as the pipeline's authenticate stage does it (ApiError
        401/503 otherwise); `anonymous` when authentication is off. For the endpoints outside the
        pipeline that must not answer strangers (`/v1/models`)."""
        if self.authenticator is None:
            return ANONYMOUS
        return await self.authenticator.authenticate(headers)

    async def authorize_admin(self, headers: dict[bytes, bytes]) -> Principal:
        """The caller's principal if it has the admin role; ApiError 401/403 otherwise (and 403 for
        everyone when authentication is off: the admin API never runs unauthenticated)."""
        if self.authenticator is None:
            raise ApiError(
                403, "The admin API needs authentication to be configured (auth section).", code="forbidden"
            )
        principal = await self.authenticator.authenticate(headers)
        require_admin(principal)
        return principal

    async def spend_report(
        self,
        *,
        user: str | None = None,
        tenant: str | None = None,
        key_id: str | None = None,
        tier: str | None = None,
        periods: Sequence[Period] = ("day", "month"),
        date: str | None = None,
        model: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> dict[str, Any]:
        """`GET /admin/spend`: the spend of one API key (`key_id`), one user (`user`, within `tenant`
        when the user has one; `tier` says which budgets to show), or one tenant. ApiError 400 for a
        bad query, 404 for an unknown key, 503 when the store is unreachable."""
        budgets: tuple[Budget, ...]
        revoked = False
        try:
            if key_id is not None:
                found = await self.api_keys.get_any(key_id)
                if found is None:
                    raise ApiError(404, f"No API key with id {key_id!r}.", code="api_key_not_found")
                record, revoked = found
                kind, user, tenant, budgets = "key", record.user, record.tenant, record.budgets
            elif user is not None:
                kind = "user"
                seen = await self.principals.lookup(user) if tenant is None or tier is None else None
                if seen is not None and (tenant is None or seen["tenant"] == tenant):
                    tenant = seen["tenant"]
                    tier = tier or seen["tier"]
                budgets = self.spend_book.tier_budgets(tier or self._limits.default_tier)
            elif tenant is not None:
                kind, budgets = "tenant", self.spend_book.tenant_budgets(tenant)
            else:
                return await self._ranked(periods, date, limit, offset)
            report = await self.spend.report(
                kind=kind,
                user=user,
                tenant=tenant,
                key_id=key_id,
                budgets=budgets,
                periods=periods,
                date=date,
                model=model,
            )
        except ValueError as exc:
            raise invalid_request(str(exc), param="date") from None
        except (StoreDown, RedisError, OSError):
            raise ApiError(
                503, "Spend cannot be read right now (Redis is unreachable).", type="server_error"
            ) from None
        if kind == "user":
            report["tier"] = tier or self._limits.default_tier
        if kind == "key":
            report["revoked"] = revoked
        return report

    async def _ranked(
        self, periods: Sequence[Period], date: str | None, limit: int, offset: int
    ) -> dict[str, Any]:
        """No scope named: every user's spend in one period (a month unless `period=day`), largest
        first, `limit` of them from `offset`."""
        period: Period = "month" if len(periods) != 1 else periods[0]
        window, users = await self.spend.ranked(await self.principals.all(), period, date)
        page = users[offset : offset + limit]
        following = offset + len(page)
        return {
            "scope": "users",
            "period": window,
            "users": page,
            "total": len(users),
            "next_offset": following if following < len(users) else None,
            "shared": self.limiter.shared,
        }

    # -- lifecycle --------------------------------------------------------------------------------
    async def start(self, redis: Redis | None) -> None:
        if redis is not None:
            rs = self._redis
            if rs.mode == "standalone" and rs.url:
                # The hot path's two scripts go over one auto-pipelining connection (redis_wire.py).
                self._wire = RespClient(
                    rs.url, timeout_s=TIMEOUT_S, username=rs.username, password=rs.password
                )
            self._redis_limiter = RedisLimiter(
                redis,
                window_s=WINDOW_S,
                observe=self._observe_redis,
                wire=self._wire,
            )
            self.limiter.bind(self._redis_limiter, redis.ping)
            self.api_keys.bind(RedisBackend(redis))
            self.principals.bind(redis)
        if self.jwks is not None:
            await self.jwks.start()
        log.info("%s", self.describe(redis is not None))
        if self.authenticator is None:
            log.warning(
                "AUTHENTICATION IS OFF: every request is served as 'anonymous' (%s); /admin/* is refused",
                "auth.enabled: false" if self._auth.enabled is False else "no auth section, loopback only",
            )

    async def aclose(self) -> None:
        await self.limiter.aclose()
        if self._redis_limiter is not None:
            await self._redis_limiter.aclose()
        if self._wire is not None:
            await self._wire.aclose()
        if self.jwks is not None:
            await self.jwks.aclose()
        if self._media_fetcher is not None:
            await self._media_fetcher.aclose()

    def describe(self, shared: bool) -> str:
        """One start-up line on how admission runs in this process."""
        if self.authenticator is None:
            auth = "authentication off (every request is anonymous; /admin/* refused)"
        else:
            j = self._auth.jwt
            sources = [
                name
                for name, on in (
                    (f"HS secret ({'/'.join(SECRET_ALGORITHMS)})", bool(j.secret)),
                    (f"{len(j.public_keys)} public key(s)", bool(j.public_keys)),
                    (f"JWKS {j.jwks_url}", bool(j.jwks_url)),
                    (
                        "API keys" + (" in Redis" if shared else " in memory (this process only)"),
                        self._auth.api_keys.enabled,
                    ),
                )
                if on
            ]
            auth = "authentication: " + ", ".join(sources)
        if self._limits.unlimited:
            limits = "limits: none configured"
        elif shared:
            limits = f"limits: shared in Redis, exact across replicas (on Redis outage: {self._limits.on_redis_error})"
        else:
            limits = "limits: in-process only (no Redis configured) — each gateway process enforces them on its own"
        return f"admission: {auth}; {limits}"

    # -- observers --------------------------------------------------------------------------------
    def count_rejection(self, stage: str, reason: str, ctx: RequestContext | None) -> None:
        self._observer.reject(stage, reason, ctx)

    def _observe_redis(self, op: str, seconds: float | None) -> None:
        if seconds is None:
            self._observer.redis_failure(op)
        else:
            self._observer.observe_redis(op, seconds)

    def _on_limiter_event(self, event: str) -> None:
        if event == "fallback":
            self._limiter_local.inc()
        elif event == "down":
            self._limiter_outages.inc()
            self._limiter_down.set(1)
        elif event == "up":
            self._limiter_down.set(0)


def _ceilings(limits: LimitsSettings) -> bool:
    """Does any tier or tenant set an output-token ceiling?"""
    return any(s.max_tokens or any(m.max_tokens for m in s.models.values()) for _, s in limits.scopes())
