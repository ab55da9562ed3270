"""The sliding-window limiters against a real redis-server, and the in-process one, case by case.

Every behavioural case runs against both `RedisLimiter` and `LocalLimiter` (they must decide alike);
the Redis-only cases cover what only a shared store has: several replicas, leases, outages.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from redis.asyncio import Redis

from gateway.admission.limits import Ticket
from gateway.admission.limits_local import LocalLimiter
from gateway.admission.limits_redis import RedisLimiter
from gateway.core.redis_client import open_redis
from gateway.core.redis_wire import RespClient
from policies.admission import Outcome, ScopeLimits, Verdict
from tests.support import RedisServer, until

pytestmark = pytest.mark.processes

WINDOW_S = 60.0


def user(
    requests: int = 0, tokens: int = 0, concurrent: int = 0, key: str = "gw:rl:{u:alice}:u"
) -> ScopeLimits:
    return ScopeLimits(key, "user alice", requests, tokens, concurrent)


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = open_redis(redis_server.url)
    await client.flushdb()
    yield client
    await client.aclose()


class Harness:
    """One limiter under test plus helpers that keep tickets for `finish`."""

    def __init__(self, limiter: RedisLimiter | LocalLimiter) -> None:
        self.limiter = limiter
        self.n = 0

    async def take(self, scopes: Sequence[ScopeLimits], cost: int = 1) -> tuple[Verdict, Ticket]:
        self.n += 1
        id = f"r{self.n}"
        verdict = await self.limiter.acquire(id, scopes, cost)
        return verdict, Ticket(id, tuple(scopes), cost, self.limiter.name)


@pytest.fixture(params=["redis-py", "wire", "local"])
async def harness(request: pytest.FixtureRequest, redis_server: RedisServer) -> AsyncIterator[Harness]:
    if request.param == "local":
        yield Harness(LocalLimiter(window_s=WINDOW_S))
        return
    client = open_redis(redis_server.url)
    await client.flushdb()
    wire = RespClient(redis_server.url) if request.param == "wire" else None
    limiter = RedisLimiter(client, window_s=WINDOW_S, lease_s=30, wire=wire)
    yield Harness(limiter)
    await limiter.aclose()
    if wire is not None:
        await wire.aclose()
    await client.aclose()


async def test_requests_limit_counts_down_then_rejects_with_true_retry(harness: Harness) -> None:
    scopes = [user(requests=3)]
    remaining = []
    for _ in range(3):
        v, _ = await harness.take(scopes)
        assert v.outcome is Outcome.ADMITTED
        assert v.limit_requests == 3
        remaining.append(v.remaining_requests)
    assert remaining == [2, 1, 0]
    v, _ = await harness.take(scopes)
    assert v.outcome is Outcome.REQUESTS
    assert (v.used, v.requested, v.remaining_requests) == (3, 1, 0)
    assert 0 < v.retry_ms <= WINDOW_S * 1000
    assert v.retry_ms == v.reset_requests_ms  # the oldest entry frees the next slot
    v2, _ = await harness.take(scopes)  # a rejection counts nothing
    assert v2.outcome is Outcome.REQUESTS and v2.used == 3


async def test_tokens_reserved_then_reconciled(harness: Harness) -> None:
    scopes = [user(tokens=100)]
    v1, t1 = await harness.take(scopes, 40)
    v2, _ = await harness.take(scopes, 40)
    assert v1.admitted and v2.admitted
    assert (v1.remaining_tokens, v2.remaining_tokens) == (60, 20)
    v3, _ = await harness.take(scopes, 40)
    assert v3.outcome is Outcome.TOKENS
    assert (v3.used, v3.requested, v3.limit_tokens) == (80, 40, 100)
    assert 0 < v3.retry_ms <= WINDOW_S * 1000
    # the first request really used 10 tokens: 50 counted now, so 40 more fit
    await harness.limiter.finish(t1, 10)
    v4, _ = await harness.take(scopes, 40)
    assert v4.admitted and v4.remaining_tokens == 10


async def test_request_larger_than_the_window_never_passes(harness: Harness) -> None:
    v, _ = await harness.take([user(tokens=100)], 101)
    assert v.outcome is Outcome.TOO_LARGE and v.requested == 101


async def test_concurrency_slots_are_released_by_finish(harness: Harness) -> None:
    scopes = [user(concurrent=2)]
    (a, ta), (b, _) = await harness.take(scopes), await harness.take(scopes)
    assert a.admitted and b.admitted
    c, _ = await harness.take(scopes)
    assert c.outcome is Outcome.CONCURRENCY
    await harness.limiter.finish(ta, 1)
    d, _ = await harness.take(scopes)
    assert d.admitted


async def test_tenant_limit_is_shared_by_its_users(harness: Harness) -> None:
    tenant = ScopeLimits("gw:rl:{t:acme}:t", "tenant acme", 3, 0, 0)
    alice = [ScopeLimits("gw:rl:{t:acme}:u:alice", "user alice", 2, 0, 0), tenant]
    bob = [ScopeLimits("gw:rl:{t:acme}:u:bob", "user bob", 2, 0, 0), tenant]
    outcomes = [(await harness.take(s))[0] for s in (alice, alice, bob, bob)]
    assert [v.outcome for v in outcomes] == [Outcome.ADMITTED] * 3 + [Outcome.REQUESTS]
    assert outcomes[3].scope == 2  # the tenant scope refused it
    assert [v.remaining_requests for v in outcomes[:3]] == [1, 0, 0]  # the tightest scope is reported
    v, _ = await harness.take(alice)
    assert v.outcome is Outcome.REQUESTS and v.scope == 1  # alice's own limit comes first


async def test_rejected_in_one_scope_counts_in_none(harness: Harness) -> None:
    tenant = ScopeLimits("gw:rl:{t:x}:t", "tenant x", 0, 0, 1)
    scopes = [ScopeLimits("gw:rl:{t:x}:u:a", "user a", 10, 0, 0), tenant]
    v1, _ = await harness.take(scopes)
    v2, _ = await harness.take(scopes)
    assert v1.admitted and v2.outcome is Outcome.CONCURRENCY
    assert v2.remaining_requests == 9  # the refused request was not counted


async def test_retry_after_is_true(redis: Redis) -> None:
    """After exactly the advertised wait, the refused request passes (1 s window)."""
    limiter = RedisLimiter(redis, window_s=1.0, lease_s=30)
    scopes = [user(requests=2)]
    assert (await limiter.acquire("a", scopes, 1)).admitted
    await asyncio.sleep(0.3)  # Redis's own clock (TIME in the script) must move: "b" comes later
    assert (await limiter.acquire("b", scopes, 1)).admitted
    refused = await limiter.acquire("c", scopes, 1)
    assert refused.outcome is Outcome.REQUESTS and 0 < refused.retry_ms <= 700
    await asyncio.sleep(refused.retry_ms / 1000 + 0.02)  # the advertised wait, on Redis's clock
    assert (await limiter.acquire("d", scopes, 1)).admitted
    assert (await limiter.acquire("e", scopes, 1)).outcome is Outcome.REQUESTS  # "b" is still in


async def test_exact_across_replicas(redis_server: RedisServer) -> None:
    """Four limiters (four clients, as four replicas) and 400 concurrent requests: exactly 100 pass."""
    clients = [open_redis(redis_server.url, timeout_s=5.0) for _ in range(4)]  # a burst on a busy box
    await clients[0].flushdb()
    wires = [RespClient(redis_server.url) for _ in range(2)]  # two replicas on each client kind
    limiters = [
        RedisLimiter(c, window_s=60, lease_s=30, wire=wires[i] if i < 2 else None)
        for i, c in enumerate(clients)
    ]
    scopes = [user(requests=100)]
    verdicts = await asyncio.gather(*(limiters[i % 4].acquire(f"x{i}", scopes, 1) for i in range(400)))
    assert sum(v.admitted for v in verdicts) == 100
    assert all(v.outcome is Outcome.REQUESTS and v.retry_ms > 0 for v in verdicts if not v.admitted)
    assert await clients[0].zcard("gw:rl:{u:alice}:u:req") == 100
    for c in clients:
        await c.aclose()
    for w in wires:
        await w.aclose()


async def test_lease_of_a_dead_replica_expires(redis: Redis, redis_server: RedisServer) -> None:
    scopes = [user(concurrent=1)]
    dead = RedisLimiter(open_redis(redis_server.url), window_s=60, lease_s=1)
    assert (await dead.acquire("held", scopes, 1)).admitted
    await dead.aclose()  # stops renewing, never finishes: as if the process were killed
    alive = RedisLimiter(redis, window_s=60, lease_s=1)
    assert (await alive.acquire("b", scopes, 1)).outcome is Outcome.CONCURRENCY

    async def admitted() -> bool:
        return (await alive.acquire("c", scopes, 1)).admitted

    await until(admitted, what="the dead replica's slot to expire")


async def test_held_slots_are_renewed_past_their_lease(redis: Redis) -> None:
    scopes = [user(concurrent=1)]
    holder = RedisLimiter(redis, window_s=60, lease_s=1)
    assert (await holder.acquire("long-stream", scopes, 1)).admitted
    await asyncio.sleep(1.6)  # > one lease on Redis's clock: only renewal keeps it
    assert (await holder.acquire("other", scopes, 1)).outcome is Outcome.CONCURRENCY
    await holder.finish(Ticket("long-stream", tuple(scopes), 1), 1)
    assert (await holder.acquire("other2", scopes, 1)).admitted
    await holder.aclose()


async def test_keys_carry_ttls(redis: Redis) -> None:
    limiter = RedisLimiter(redis, window_s=60, lease_s=30)
    await limiter.acquire("a", [user(5, 50, 2)], 10)
    for suffix in ("req", "tok", "sum", "con"):
        assert 0 < await redis.pttl(f"gw:rl:{{u:alice}}:u:{suffix}") <= 60_000
    await limiter.aclose()
