"""Budgets and spend ledgers in the limiters, case by case, against a real redis-server (through
redis-py and through the pipelining wire) and the in-process limiter: all three must decide alike.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence

import pytest
from redis.asyncio import Redis

from gateway.admission.limits import Ledger, Meter, Spend, Ticket
from gateway.admission.limits_local import LocalLimiter
from gateway.admission.limits_redis import RedisLimiter
from gateway.admission.settings import LimitsSettings
from gateway.admission.spend import PeriodClock, SpendBook, spend_prefixes
from gateway.core.context import Principal
from gateway.core.redis_client import open_redis
from gateway.core.redis_wire import RespClient
from policies.admission import Outcome, ScopeLimits, Verdict
from policies.budgets import Budget, Charge, calendar_span, expires_at_s
from tests.support import RedisServer

pytestmark = pytest.mark.processes

DAY = calendar_span("day", time.time())
MONTH = calendar_span("month", time.time())
PREFIX = "gw:sp:{u:alice}:u"
LEDGERS = (
    Ledger(f"{PREFIX}:d:{DAY.id}", expires_at_s(DAY) * 1000),
    Ledger(f"{PREFIX}:m:{MONTH.id}", expires_at_s(MONTH) * 1000),
)


def calendar_meter(budget: Budget, ledger: int = 1, label: str = "user alice") -> Meter:
    return Meter(budget, label, "user", LEDGERS[ledger].key, ledger, MONTH.end_s * 1000)


def rolling_meter(budget: Budget) -> Meter:
    return Meter(budget, "user alice", "user", f"{PREFIX}:w{budget.window_s}:{budget.unit}")


def spend(reserved: Charge, *meters: Meter, model: str = "m") -> Spend:
    calendar = [m for m in meters if m.budget.calendar]
    rolling = [m for m in meters if not m.budget.calendar]
    return Spend(LEDGERS, (*calendar, *rolling), len(calendar), model, reserved)


class Harness:
    def __init__(self, limiter: RedisLimiter | LocalLimiter) -> None:
        self.limiter = limiter
        self.n = 0

    async def take(
        self, s: Spend, scopes: Sequence[ScopeLimits] = (), cost: int | None = None
    ) -> tuple[Verdict, Ticket]:
        self.n += 1
        id = f"r{self.n}"
        tokens = s.reserved.tokens if cost is None else cost
        verdict = await self.limiter.acquire(id, scopes, tokens, s)
        return verdict, Ticket(id, tuple(scopes), tokens, self.limiter.name, s)

    async def ledger(self, index: int = 1) -> dict[str, int]:
        fields, _ = await self.limiter.read_spend([LEDGERS[index].key], [])
        return fields[0]


@pytest.fixture(params=["redis-py", "wire", "local"])
async def harness(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Harness]:
    if request.param == "local":
        yield Harness(LocalLimiter(window_s=60))
        return
    client = open_redis(redis_server.url)
    await client.flushdb()
    wire = RespClient(redis_server.url) if request.param == "wire" else None
    limiter = RedisLimiter(client, window_s=60, lease_s=30, wire=wire)
    yield Harness(limiter)
    await limiter.aclose()
    if wire is not None:
        await wire.aclose()
    await client.aclose()


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = open_redis(redis_server.url)
    yield client
    await client.aclose()


async def test_money_budget_admits_exactly_what_fits_then_refuses(harness: Harness) -> None:
    month = calendar_meter(Budget("month", "usd", 1000))
    for _ in range(3):
        v, _ = await harness.take(spend(Charge(10, 300), month))
        assert v.admitted, v
    v, _ = await harness.take(spend(Charge(10, 300), month))
    assert (v.outcome, v.scope, v.used, v.requested) == (Outcome.QUOTA, 1, 900, 300)
    assert v.retry_ms == 0  # a calendar budget: the admit stage knows when the period ends
    v, _ = await harness.take(spend(Charge(10, 100), month))  # a refusal counted nothing: 100 still fits
    assert v.admitted
    assert (await harness.ledger())["usd"] == 1000


async def test_a_request_larger_than_the_budget_never_passes(harness: Harness) -> None:
    v, _ = await harness.take(spend(Charge(500, 0), calendar_meter(Budget("day", "tokens", 100), ledger=0)))
    assert (v.outcome, v.used, v.requested) == (Outcome.QUOTA_TOO_LARGE, 0, 500)
    v, _ = await harness.take(spend(Charge(1, 500), rolling_meter(Budget("rolling", "usd", 100, 3600))))
    assert v.outcome is Outcome.QUOTA_TOO_LARGE


async def test_reconciliation_frees_budget_and_is_recorded_per_model(harness: Harness) -> None:
    month = calendar_meter(Budget("month", "usd", 1000))
    v, t1 = await harness.take(spend(Charge(212, 600), month, model="small"))
    assert v.admitted
    refused, _ = await harness.take(spend(Charge(212, 600), month, model="small"))
    assert refused.outcome is Outcome.QUOTA
    in_flight = await harness.ledger()
    assert (in_flight["tok"], in_flight["usd"]) == (212, 600) and "req" not in in_flight
    await harness.limiter.finish(t1, 55, Charge(55, 95))  # the real usage was lower
    done = await harness.ledger()
    assert done == {"tok": 55, "usd": 95, "req": 1, "m:small:tok": 55, "m:small:usd": 95, "m:small:req": 1}
    assert await harness.ledger(0) == done  # the day's ledger too
    v, t2 = await harness.take(spend(Charge(212, 600), month, model="big"))
    assert v.admitted  # 95 + 600 fits now
    await harness.limiter.finish(t2, 212, Charge(212, 600))
    after = await harness.ledger()
    assert (after["usd"], after["req"], after["m:big:usd"], after["m:small:usd"]) == (695, 2, 600, 95)


async def test_rolling_budget_slides_and_says_when_it_frees(harness: Harness) -> None:
    hour = rolling_meter(Budget("rolling", "tokens", 100, 3600))
    v1, t1 = await harness.take(spend(Charge(60, 0), hour))
    v2, _ = await harness.take(spend(Charge(30, 0), hour))
    assert v1.admitted and v2.admitted
    v3, _ = await harness.take(spend(Charge(20, 0), hour))
    assert (v3.outcome, v3.scope, v3.used, v3.requested) == (Outcome.QUOTA, 1, 90, 20)
    # the first entry (60) must leave the window: about an hour from now
    assert 3_590_000 < v3.retry_ms <= 3_600_000
    await harness.limiter.finish(t1, 5, Charge(5, 0))
    v4, _ = await harness.take(spend(Charge(20, 0), hour))
    assert v4.admitted
    _, sums = await harness.limiter.read_spend([], [(hour.key, 3_600_000)])
    assert sums == [55]


async def test_limits_are_checked_first_and_a_refusal_counts_nowhere(harness: Harness) -> None:
    rpm = ScopeLimits("gw:rl:{u:alice}:u", "user alice", 1, 0, 0)
    month = calendar_meter(Budget("month", "usd", 10**6))
    v, _ = await harness.take(spend(Charge(10, 5), month), [rpm])
    assert v.admitted
    v, _ = await harness.take(spend(Charge(10, 5), month), [rpm])
    assert v.outcome is Outcome.REQUESTS  # the rate limit refused it: no budget counted it
    assert (await harness.ledger())["usd"] == 5


async def test_the_first_budget_that_does_not_fit_is_named(harness: Harness) -> None:
    user_day = calendar_meter(Budget("day", "usd", 10**6), ledger=0)
    tenant_month = calendar_meter(Budget("month", "tokens", 25), label="tenant acme")
    hour = rolling_meter(Budget("rolling", "usd", 50, 3600))
    s = spend(Charge(10, 20), user_day, tenant_month, hour)
    assert (await harness.take(s))[0].admitted
    assert (await harness.take(s))[0].admitted
    v, _ = await harness.take(s)
    assert (v.outcome, v.scope) == (Outcome.QUOTA, 2)  # the month's tokens (20 + 10 > 25)
    assert s.meters[v.scope - 1].label == "tenant acme"
    smaller = spend(Charge(2, 20), user_day, tenant_month, hour)
    v, _ = await harness.take(smaller)
    assert (v.outcome, v.scope, v.used) == (Outcome.QUOTA, 3, 40)  # now the rolling money (40 + 20 > 50)


async def test_ledgers_expire_after_their_period_never_before(
    redis: Redis, redis_server: RedisServer
) -> None:
    await redis.flushdb()
    limiter = RedisLimiter(redis, window_s=60, lease_s=30)
    await limiter.acquire("x", [], 1, spend(Charge(1, 1), calendar_meter(Budget("month", "usd", 10))))
    for ledger, span in zip(LEDGERS, (DAY, MONTH), strict=True):
        ttl_ms = await redis.pttl(ledger.key)
        assert (span.end_s - time.time()) * 1000 < ttl_ms <= (expires_at_s(span) - time.time()) * 1000 + 1000
    await limiter.aclose()


def test_spend_book_plans_per_principal() -> None:
    limits = LimitsSettings.model_validate(
        {
            "tiers": {
                "default": {"requests_per_minute": 10},
                "free": {"budgets": [{"period": "day", "tokens": 1000}]},
                "open": {},
            },
            "tenants": {
                "acme": {
                    "budgets": [
                        {"period": "month", "usd": 10},
                        {"period": "rolling", "window_s": 3600, "usd": 1},
                    ]
                }
            },
        }
    )
    book = SpendBook(limits)
    key_budget = Budget("month", "usd", 5 * 10**9)
    alice = Principal("alice", tenant="acme", tier="free", key_id="key_1", key_budgets=(key_budget,))
    plan = book.plan(alice, limited=False)
    assert plan is not None
    prefixes = spend_prefixes("alice", "acme", "key_1")
    assert [(s.kind, s.prefix) for s in plan.scopes] == [(k, prefixes[k]) for k in ("user", "tenant", "key")]
    assert prefixes == {
        "user": "gw:sp:{t:acme}:u:alice",
        "tenant": "gw:sp:{t:acme}:t",
        "key": "gw:sp:{t:acme}:k:key_1",
    }
    _, day, month = PeriodClock().now()
    s = plan.spend(day, month, "m", Charge(1, 1))
    assert len(s.ledgers) == 6  # day and month of each scope
    assert [m.budget.period for m in s.meters] == ["day", "month", "month", "rolling"]
    assert s.n_calendar == 3 and s.meters[3].key == "gw:sp:{t:acme}:t:w3600:usd"
    assert {m.label for m in s.meters} == {"user alice", "tenant acme", "API key key_1"}
    assert plan.spend(day, month, "m", Charge(2, 2)).ledgers is s.ledgers  # built once per day
    # nothing to check, nothing limited: no plan, no limiter call
    assert book.plan(Principal("bob", tier="open"), limited=False) is None
    # limited principals are tracked (the limiter is called anyway)
    tracked = book.plan(Principal("bob", tier="open"), limited=True)
    assert tracked is not None and [s.kind for s in tracked.scopes] == ["user"]


def test_budget_settings_are_validated() -> None:
    bad = [
        {"period": "rolling", "usd": 1},
        {"period": "day", "window_s": 3600, "usd": 1},
        {"period": "month"},
        {"period": "week", "usd": 1},
        {"period": "day", "usd": 0.0000000001},
        {"period": "day", "usd": -1},
        {"period": "rolling", "window_s": 10, "tokens": 5},
    ]
    for b in bad:
        with pytest.raises(ValueError):
            LimitsSettings.model_validate({"tiers": {"default": {"budgets": [b]}}})
    ok = LimitsSettings.model_validate(
        {"tiers": {"default": {"budgets": [{"period": "month", "usd": 10, "tokens": 1000}]}}}
    )
    assert ok.tiers["default"].spending_limits == (
        Budget("month", "usd", 10 * 10**9),
        Budget("month", "tokens", 1000),
    )
    assert not ok.unlimited
