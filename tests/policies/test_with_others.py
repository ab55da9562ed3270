"""`WithOthers`: the other processes' figures added to a snapshot, rebuilding only what changed."""

from __future__ import annotations

import dataclasses
import random

from policies.shared_load import WithOthers, with_others
from policies.types import FleetSnapshot
from tests.policies.fleet import fleet, pool


def anew(snapshot: FleetSnapshot, others: dict[str, int], prefill: dict[str, int]) -> FleetSnapshot:
    """Every backend view rebuilt, as the figures say."""
    return FleetSnapshot(
        tuple(
            dataclasses.replace(
                p,
                backends=tuple(
                    dataclasses.replace(
                        b,
                        in_flight=b.in_flight + others.get(b.name, 0),
                        prefill=b.prefill + prefill.get(b.name, 0),
                    )
                    for b in p.backends
                ),
            )
            for p in snapshot.pools
        )
    )


def test_the_same_snapshot_and_figures_give_the_same_answer_and_untouched_pools_stay() -> None:
    added = WithOthers()
    snap = fleet(pool("vllm"), pool("sglang"))
    assert added(snap, {}, {}) is snap  # nobody else: the snapshot itself
    others = {"vllm-1": 2}
    first = added(snap, others, {})
    assert first == anew(snap, others, {}) and added(snap, dict(others), {}) is first
    assert first.pools[1] is snap.pools[1]  # nothing added there: the own view
    second = added(snap, {"vllm-1": 2, "sglang-0": 1}, {"vllm-1": 300})
    assert second == anew(snap, {"vllm-1": 2, "sglang-0": 1}, {"vllm-1": 300})
    assert second.pools[0].backends[1].prefill == 300 and second.pools[1].backends[0].in_flight == 1


def test_random_own_changes_and_figures_always_give_what_building_anew_gives() -> None:
    rng = random.Random(3)
    added = WithOthers()
    vllm, sglang = pool("vllm", 4), pool("sglang", 4)
    names = [b.name for p in (vllm, sglang) for b in p.backends]
    others: dict[str, int] = {}
    prefill: dict[str, int] = {}
    for _ in range(400):
        what = rng.randrange(4)
        if what == 0:  # a request of this process started or ended: that backend's own view is new
            target = rng.choice(names)
            vllm, sglang = (
                dataclasses.replace(
                    p,
                    backends=tuple(
                        dataclasses.replace(b, in_flight=rng.randrange(3)) if b.name == target else b
                        for b in p.backends
                    ),
                )
                for p in (vllm, sglang)
            )
        elif what == 1:  # the others' figures, heard anew
            others = {n: rng.randrange(3) for n in rng.sample(names, rng.randrange(len(names)))}
            prefill = {n: rng.randrange(500) for n in rng.sample(names, rng.randrange(3))}
        elif what == 2:  # an admin's weight
            vllm = dataclasses.replace(vllm, weight=rng.choice([1.0, 2.0]))
        snap = fleet(vllm, sglang)
        got = added(snap, others, prefill)
        assert got == anew(snap, others, prefill) == with_others(snap, others, prefill)
