"""The rebalancing loop on virtual time: a round every interval, bounded steps toward the faster pool
with an audit entry each, a pool an admin pinned left alone until the pin goes, and one replica a
round when replicas share Redis (a fake)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gateway.control.store import AuditEntry, MemoryStore, OnReset
from gateway.control.verbs import FleetControl
from gateway.core.context import Principal
from gateway.core.fleet import Fleet
from gateway.core.overrides import Overrides
from gateway.flow.compare import EngineStats
from gateway.flow.rebalance import LAST_KEY, LOCK_KEY, REBALANCE_INTERVAL_S, REBALANCE_POLL_S, Rebalancer
from gateway.settings import HealthSettings, PoolSettings
from policies.engine_compare import MIN_SAMPLES
from policies.rebalance import FLOOR_SHARE, STEP_SHARE
from tests.gateway.flow.fake_redis import FakeRedis
from tests.gateway.flow.test_compare import request
from tests.virtual_time import elapse, on_virtual_time, virtual_loop

ADMIN = Principal(user="op", roles=frozenset({"admin"}))
LOOP = Principal(user="gateway")
STEP = STEP_SHARE * 2.0  # both pools start at weight 1


def pools() -> list[PoolSettings]:
    return [
        PoolSettings.model_validate({"name": n, "dialect": n, "models": {"m": "served"}, "backends": []})
        for n in ("vllm", "sglang")
    ]


class Config:
    def base_pools(self) -> Sequence[PoolSettings]:
        return pools()

    def reread_config(self) -> None:
        raise AssertionError("no reload here")


class SharedStore(MemoryStore):
    """A store every replica of the test applies changes from, as they do from Redis."""

    shared = True

    def __init__(self) -> None:
        super().__init__()
        self._replicas: list[Callable[[Overrides], None]] = []

    async def start(
        self, on_change: Callable[[Overrides], None], on_reset: OnReset | None = None
    ) -> Overrides:
        self._replicas.append(on_change)
        return await super().start(on_change, on_reset)

    async def change(self, updates: dict[str, Any], deletes: list[str], audit: AuditEntry) -> None:
        await super().change(updates, deletes, audit)
        for apply in self._replicas:
            apply(Overrides.from_fields(self._fields))


class Replica:
    """One gateway's loop, recorder and fleet control over a shared store (and Redis, when given)."""

    def __init__(self, store: MemoryStore, redis: FakeRedis | None = None) -> None:
        self.fleet = Fleet(pools(), HealthSettings(), stale_s=10)
        self.control = FleetControl(self.fleet, Config(), store, rebalance=True)
        self.stats = EngineStats(lambda: 6_000_000.0 + virtual_loop().time())
        self.stats._redis = redis  # bound as `start` does, without its flush task
        self.loop = Rebalancer(self.stats, self.fleet, lambda: self.control.overrides.weights, self.apply)
        self.redis = redis

    async def apply(
        self, model: str, before: dict[str, Any], after: dict[str, Any], weights: dict[str, float]
    ) -> bool:
        updates = {f"rebalance:{pool}": w for pool, w in weights.items()}
        return await self.control.change_fleet(LOOP, "pool_rebalanced", model, before, after, updates=updates)

    def weights(self) -> dict[str, float]:
        return {p.name: round(p.weight, 6) for p in self.fleet.pools.values()}

    def traffic(self) -> None:
        """sglang answers its first token 5x later than vllm, on the same kind of requests."""
        for _ in range(MIN_SAMPLES + 10):
            self.stats.record(*request("vllm", ttft=0.010))
            self.stats.record(*request("sglang", ttft=0.050))


async def rebalanced(store: MemoryStore) -> list[dict[str, Any]]:
    return [e for e in await store.audit(100) if e["action"] == "pool_rebalanced"]


@on_virtual_time
async def test_a_round_an_interval_moves_bounded_steps_to_the_faster_pool_and_stops_at_the_floor() -> None:
    store = MemoryStore()
    gw = Replica(store)
    await gw.control.start(store)
    gw.traffic()
    await gw.loop.start(None)
    # (looks every REBALANCE_POLL_S; the test's own waits end between two looks)
    await elapse(REBALANCE_INTERVAL_S - REBALANCE_POLL_S / 2)
    assert await rebalanced(store) == [] and gw.weights() == {"vllm": 1.0, "sglang": 1.0}
    await elapse(REBALANCE_POLL_S)  # the first round
    (entry,) = await rebalanced(store)
    assert (entry["actor"], entry["target"]) == ("gateway", "m")
    assert entry["before"] == {"weights": {"vllm": 1.0, "sglang": 1.0}}
    assert entry["after"]["weights"] == {"vllm": 1.0 + STEP, "sglang": 1.0 - STEP}
    assert entry["after"]["why"].startswith("vllm: TTFT p90 4.76x lower than sglang's")  # 5x, bucketed
    assert gw.weights() == {"vllm": 1.0 + STEP, "sglang": 1.0 - STEP}
    assert gw.control.describe_pool("sglang")["weight_source"] == "rebalance"
    # one step a round until sglang is at its floor, then nothing (the traffic is still in the window)
    for _ in range(4):
        await elapse(REBALANCE_INTERVAL_S)
    entries = await rebalanced(store)
    floor = FLOOR_SHARE * 2.0
    assert len(entries) == round((1.0 - floor) / STEP)
    assert gw.weights() == {"vllm": 2.0 - floor, "sglang": floor}
    status = await gw.loop.status()
    assert status["enabled"] and status["last_round"]["moves"] == []
    assert "sglang is at its floor" in status["last_round"]["held"]["m"]
    await gw.loop.stop()


@on_virtual_time
async def test_an_admins_weight_stops_the_loop_for_that_pool_and_its_delete_hands_it_back() -> None:
    store = MemoryStore()
    gw = Replica(store)
    await gw.control.start(store)
    gw.traffic()
    await gw.loop.start(None)
    await elapse(REBALANCE_INTERVAL_S + REBALANCE_POLL_S / 2)
    assert len(await rebalanced(store)) == 1
    await gw.control.change_fleet(ADMIN, "set_weight", "sglang", 0.9, 1.0, updates={"weight:sglang": 1.0})
    for _ in range(3):
        await elapse(REBALANCE_INTERVAL_S)
    assert len(await rebalanced(store)) == 1
    assert gw.weights() == {"vllm": 1.0 + STEP, "sglang": 1.0}
    assert gw.control.describe_pool("sglang")["weight_source"] == "override"
    last = (await gw.loop.status())["last_round"]
    assert last["held"] == {"m": "weight set by an admin: sglang"}
    # DELETE of the override: the loop's weight again, and the loop goes on from it
    await gw.control.change_fleet(
        ADMIN, "reset_weight", "sglang", 1.0, "rebalance", deletes=["weight:sglang"]
    )
    assert gw.weights() == {"vllm": 1.0 + STEP, "sglang": 1.0 - STEP}
    await elapse(REBALANCE_INTERVAL_S)
    assert len(await rebalanced(store)) == 2
    assert gw.weights() == {"vllm": 1.0 + 2 * STEP, "sglang": 1.0 - 2 * STEP}
    await gw.loop.stop()


@on_virtual_time
async def test_replicas_sharing_redis_take_one_round_a_turn() -> None:
    redis = FakeRedis()
    store = SharedStore()
    a, b = Replica(store, redis), Replica(store, redis)
    for gw in (a, b):
        await gw.control.start(store)
    a.traffic()
    await a.stats.flush()  # a's counts in Redis: b decides on them too
    await a.loop.start(redis)
    await b.loop.start(redis)
    await elapse(REBALANCE_POLL_S * 3.5)  # three looks by each replica
    # one round so far: the turn (the lock) is held until it expires after an interval
    assert len(await rebalanced(store)) == 1
    assert redis.ttls[LOCK_KEY] == REBALANCE_INTERVAL_S
    holder = redis.strings[LOCK_KEY].decode()
    del redis.strings[LOCK_KEY]  # the turn expires
    await elapse(REBALANCE_POLL_S)
    assert len(await rebalanced(store)) == 2
    assert a.weights() == b.weights() == {"vllm": 1.0 + 2 * STEP, "sglang": 1.0 - 2 * STEP}
    assert LAST_KEY in redis.strings
    last = (await b.loop.status())["last_round"]
    assert last["replica"] == holder and last["moves"][0]["after"] == {
        "vllm": 1.0 + 2 * STEP,
        "sglang": 1.0 - 2 * STEP,
    }
    # Redis gone: no round, no change, and the loop carries on when it is back
    redis.down = True
    del redis.strings[LOCK_KEY]
    await elapse(REBALANCE_INTERVAL_S)
    assert len(await rebalanced(store)) == 2
    redis.down = False
    await elapse(REBALANCE_POLL_S)
    assert len(await rebalanced(store)) == 3
    await a.loop.stop()
    await b.loop.stop()
