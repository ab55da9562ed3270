"""Shared fleet state: overrides applied to a Fleet, and propagation between replicas via real Redis."""

from __future__ import annotations

from typing import Any

import pytest
from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.control.store import MemoryStore, Overrides, RedisStore, StateLost, audit_entry
from gateway.core.fleet import Fleet
from gateway.settings import HealthSettings, PoolSettings
from tests.support import Recorder, RedisServer

pytestmark = pytest.mark.processes


def _pools() -> list[PoolSettings]:
    return [
        PoolSettings.model_validate(
            {
                "name": "vllm",
                "dialect": "vllm",
                "weight": 0.5,
                "models": {"m": "served"},
                "backends": [
                    {"name": "v0", "url": "http://127.0.0.1:1"},
                    {"name": "v1", "url": "http://127.0.0.1:2"},
                ],
            }
        ),
        PoolSettings.model_validate(
            {"name": "sglang", "dialect": "sglang", "weight": 0.5, "models": {"m": "served"}, "backends": []}
        ),
    ]


def _fleet() -> Fleet:
    return Fleet(_pools(), HealthSettings(), stale_s=10)


def test_apply_overrides_weights_drain_add_remove() -> None:
    fleet = _fleet()
    o = Overrides(
        weights={"vllm": 0.1}, drained={"v1"}, added={"s0": ("sglang", "http://127.0.0.1:3")}, removed={"v0"}
    )
    fleet.apply(_pools(), o)
    assert fleet.pools["vllm"].weight == 0.1
    assert fleet.pools["sglang"].weight == 0.5
    assert set(fleet.backends) == {"v1", "s0"}
    assert fleet.backends["v1"].draining and not fleet.backends["s0"].draining
    assert fleet.backends["s0"].pool == "sglang" and "s0" in fleet.pools["sglang"].backends
    # Clearing the overrides restores the config.
    fleet.apply(_pools(), Overrides())
    assert set(fleet.backends) == {"v0", "v1"} and fleet.pools["vllm"].weight == 0.5
    assert not fleet.backends["v1"].draining


def test_apply_keeps_runtime_state_of_unchanged_backends() -> None:
    fleet = _fleet()
    fleet.backends["v0"].in_flight = 3
    fleet.backends["v0"].healthy = True
    fleet.apply(_pools(), Overrides(weights={"vllm": 2.0}))
    assert fleet.backends["v0"].in_flight == 3 and fleet.backends["v0"].healthy is True


def test_added_backend_for_unknown_pool_is_ignored() -> None:
    fleet = _fleet()
    fleet.apply(_pools(), Overrides(added={"x": ("nope", "http://127.0.0.1:9")}))
    assert "x" not in fleet.backends


async def test_memory_store_applies_and_audits() -> None:
    store = MemoryStore()
    seen: list[Overrides] = []
    await store.start(seen.append)
    await store.change({"weight:vllm": 0.3}, [], audit_entry("alice", "set_weight", "vllm", 0.5, 0.3))
    assert seen[-1].weights == {"vllm": 0.3}
    entries = await store.audit(10)
    assert entries[0]["actor"] == "alice" and entries[0]["before"] == 0.5 and entries[0]["after"] == 0.3


async def test_redis_store_announces_a_change_to_the_other_replicas() -> None:
    """The change reaches replica B by its announcement: B's version poll is too slow to bring it
    within the wait."""
    with RedisServer() as server:
        a_redis, b_redis = Redis.from_url(server.url), Redis.from_url(server.url)
        a, b = RedisStore(a_redis), RedisStore(b_redis, poll_s=3600)
        seen_b: Recorder[Overrides] = Recorder()
        await a.start(lambda o: None)
        await b.start(seen_b)
        try:
            await a.change(
                {"weight:vllm": 0.25, "drain:v1": True},
                [],
                audit_entry("op", "set_weight", "vllm", 0.5, 0.25),
            )
            seen = await seen_b.wait_for(lambda seen: bool(seen) and seen[-1].weights.get("vllm") == 0.25)
            assert seen[-1].drained == {"v1"}
            # A replica started later begins from the persisted state.
            c = RedisStore(Redis.from_url(server.url))
            initial = await c.start(lambda o: None)
            assert initial.weights == {"vllm": 0.25} and initial.drained == {"v1"}
            await c.stop()
            assert (await b.audit(5))[0]["action"] == "set_weight"
        finally:
            await a.stop()
            await b.stop()
            await a_redis.aclose()
            await b_redis.aclose()


async def test_redis_store_poll_catches_a_missed_announcement() -> None:
    with RedisServer() as server:
        r = Redis.from_url(server.url)
        store = RedisStore(r, poll_s=0.1)
        seen: Recorder[Overrides] = Recorder()
        await store.start(seen)
        try:
            # A change written without the pub/sub announcement (as if the message were lost).
            await r.hset("gw:{fleet}:overrides", "weight:sglang", b"0.75")
            await r.incr("gw:{fleet}:version")
            await seen.wait_for(lambda seen: bool(seen) and seen[-1].weights.get("sglang") == 0.75)
        finally:
            await store.stop()
            await r.aclose()


async def test_a_change_announced_as_start_returns_is_heard() -> None:
    """A replica subscribes before its first read, so a change announced once its start has returned
    reaches it (its poll is too slow to bring the change)."""
    with RedisServer() as server:
        other = Redis.from_url(server.url)
        await other.ping()  # connected: the change below is one round trip
        store = RedisStore(Redis.from_url(server.url), poll_s=3600)
        seen: Recorder[Overrides] = Recorder()
        await store.start(seen)
        try:
            async with other.pipeline(transaction=True) as pipe:
                pipe.hset("gw:{fleet}:overrides", "weight:sglang", b"0.75")
                pipe.incr("gw:{fleet}:version")
                pipe.publish("gw:fleet:changed", b"1")
                await pipe.execute()
            await seen.wait_for(lambda seen: bool(seen) and seen[-1].weights.get("sglang") == 0.75)
        finally:
            await store.stop()
            await other.aclose()


async def test_an_announcement_from_a_new_generation_is_a_reset_not_an_update() -> None:
    """Redis came back empty and another replica restored first: the announcement of its restore
    is the first this replica hears (its poll is too slow), and it still reports what was lost."""
    with RedisServer() as server:
        r = Redis.from_url(server.url)
        store = RedisStore(r, poll_s=3600)
        lost: Recorder[StateLost] = Recorder()

        async def on_reset(state: StateLost) -> None:
            lost(state)

        await store.start(lambda o: None, on_reset)
        try:
            await store.change({"weight:vllm": 0.25}, [], audit_entry("op", "set_weight", "vllm", 0.5, 0.25))
            await r.flushall()
            await r.set("gw:{fleet}:generation", "restored")
            await r.hset("gw:{fleet}:overrides", "weight:vllm", b"0.25")
            await r.publish("gw:fleet:changed", b"1")
            seen = await lost.wait_for(bool)
            assert len(seen) == 1 and seen[0].fields == {"weight:vllm": 0.25} and not seen[0].restore
        finally:
            await store.stop()
            await r.aclose()


class _RefusingPipeline:
    """A pipeline whose transaction Redis refuses (the server is down)."""

    async def __aenter__(self) -> _RefusingPipeline:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: None  # queues nothing

    async def execute(self) -> None:
        raise RedisConnectionError("Error 111 connecting: Connection refused.")


class _RefusingRedis:
    def pipeline(self, transaction: bool = True) -> _RefusingPipeline:
        return _RefusingPipeline()


async def test_a_refused_write_marks_the_outage_though_no_poll_saw_it() -> None:
    """The next poll that works then refreshes, which hands the replica's pending changes back to be
    written: a poller held past a short outage must not leave them unwritten."""
    store = RedisStore(_RefusingRedis(), poll_s=3600)  # type: ignore[arg-type]
    assert not store._outage.failing
    with pytest.raises(RedisConnectionError):
        await store.change({"weight:vllm": 0.4}, [], audit_entry("ops", "set_weight", "vllm", 1.0, 0.4))
    assert store._outage.failing
