"""`Fleet.snapshot` reuses the views of what did not change, and shows every change at once."""

from __future__ import annotations

import dataclasses
import random

from engines.base import EngineLoad
from gateway.core.fleet import Fleet
from gateway.core.settings import BackendSettings, HealthSettings, PoolSettings
from policies.types import BackendView, FleetSnapshot

STALE_S = 5.0


def make_fleet(per_pool: int = 3) -> Fleet:
    pools = [
        PoolSettings(
            name=engine,
            dialect=engine,  # type: ignore[arg-type]
            models={"m": "m"},
            backends=[
                BackendSettings(name=f"{engine}-{i}", url=f"http://127.0.0.1:{9000 + i}")
                for i in range(per_pool)
            ],
        )
        for engine in ("vllm", "sglang")
    ]
    return Fleet(pools, HealthSettings(failure_threshold=1, open_s=10.0), STALE_S)


def built_anew(fleet: Fleet, now: float) -> FleetSnapshot:
    """Every view built from the live state (`Fleet.snapshot_anew`): what the remembered ones must equal."""
    return fleet.snapshot_anew(now)


def test_an_unchanged_fleet_gives_the_same_snapshot_and_a_change_only_rebuilds_its_own_views() -> None:
    fleet = make_fleet()
    first = fleet.snapshot(100.0)
    assert fleet.snapshot(100.5) is first
    fleet.backends["vllm-1"].in_flight = 2
    second = fleet.snapshot(101.0)
    assert second is not first and second == built_anew(fleet, 101.0)
    vllm, sglang = second.pools
    assert sglang is first.pools[1]  # the other pool: untouched
    assert vllm.backends[0] is first.pools[0].backends[0] and vllm.backends[2] is first.pools[0].backends[2]
    assert vllm.backends[1].in_flight == 2


def test_every_field_a_view_shows_follows_the_live_state() -> None:
    """Each change the gateway makes (requests, probes, the circuit, scrapes and their staleness, drain,
    the admin's weights, a reload's models) shows in the next snapshot, equal to one built anew."""
    fleet = make_fleet()
    now = 100.0
    backend = fleet.backends["sglang-2"]
    pool = fleet.pools["sglang"]

    def scrape() -> None:
        backend.load, backend.load_at = EngineLoad(running=3.0, waiting=2.0, kv_usage=0.5), now

    def scraped() -> BackendView:
        return fleet.snapshot(now).pools[1].backends[2]

    def trip() -> None:
        backend.circuit.failure(now)

    changes = [
        lambda: setattr(backend, "in_flight", 3),
        lambda: setattr(backend, "prefill", 1200),
        lambda: setattr(backend, "healthy", False),
        lambda: setattr(backend, "healthy", True),
        lambda: setattr(backend, "draining", True),
        scrape,
        trip,
        lambda: setattr(pool, "weight", 3.0),
        lambda: setattr(pool, "models", {"m": "m", "n": "n"}),
        lambda: setattr(pool, "tool_calling", False),
    ]
    before = fleet.snapshot(now)
    for change in changes:
        change()
        now += 1.0
        after = fleet.snapshot(now)
        assert after is not before and after == built_anew(fleet, now)
        before = after
        if change is scrape:
            assert (scraped().queue_depth, scraped().running, scraped().kv_usage) == (2.0, 3.0, 0.5)
    # time alone: the scrape goes stale, the circuit's open time runs out
    for later in (now + STALE_S + 0.5, now + 20.0):
        after = fleet.snapshot(later)
        assert after == built_anew(fleet, later)
        assert after is not before
        before = after
    assert before.pools[1].backends[2].queue_depth is None and not before.pools[1].backends[2].circuit_open


def test_a_backend_added_or_removed_shows_in_the_next_snapshot() -> None:
    fleet = make_fleet()
    first = fleet.snapshot(1.0)
    fleet.add_backend("vllm", BackendSettings(name="vllm-9", url="http://127.0.0.1:9999"))
    assert [b.name for b in fleet.snapshot(1.0).pools[0].backends] == ["vllm-0", "vllm-1", "vllm-2", "vllm-9"]
    fleet.remove_backend("vllm-9")
    fleet.remove_backend("vllm-0")
    second = fleet.snapshot(1.0)
    assert second == built_anew(fleet, 1.0) and second != first


def test_random_changes_always_give_the_snapshot_built_anew() -> None:
    fleet = make_fleet(4)
    rng = random.Random(7)
    names = list(fleet.backends)
    now = 0.0
    for _ in range(500):
        b = fleet.backends[rng.choice(names)]
        field = rng.choice(["in_flight", "prefill", "draining"])
        value = rng.random() < 0.5 if field == "draining" else rng.randrange(3)
        setattr(b, field, value)
        now += rng.choice([0.0, 0.1])
        snap = fleet.snapshot(now)
        assert snap == built_anew(fleet, now)
        assert dataclasses.replace(snap) == snap
