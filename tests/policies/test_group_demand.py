from __future__ import annotations

import math
import random

import pytest

from policies.group_demand import GroupDemand


def test_share_follows_the_groups_fraction_of_its_pools_requests() -> None:
    demand = GroupDemand(alpha=1 / 64)
    rng = random.Random(1)
    for _ in range(2000):
        demand.note("a", 1 if rng.random() < 0.5 else rng.randrange(2, 40))
        demand.note("b", 1)  # another pool's traffic does not dilute pool a's shares
    assert demand.share("a", 1) == pytest.approx(0.5, abs=0.15)
    assert demand.share("a", 2) < 0.1
    assert demand.share("b", 1) == pytest.approx(1.0, abs=1e-6)
    assert demand.share("a", 999) == 0.0


def test_requests_that_are_not_a_group_count_in_the_pool_total_only() -> None:
    demand = GroupDemand(alpha=1 / 64)
    for i in range(1000):
        demand.note("a", 7 if i % 4 == 0 else None)
    assert demand.share("a", 7) == pytest.approx(0.25, abs=0.05)
    assert len(demand) == 1


def test_a_group_that_stops_fades_and_its_first_requests_do_not_look_hot() -> None:
    demand = GroupDemand(alpha=1 / 64)
    demand.note("a", 1)
    assert demand.share("a", 1) == pytest.approx(1 / 8)  # one request of a fresh pool: 1/8, not 1
    assert demand.span("a", 1, backends=8, headroom=1.25) == 1
    for _ in range(500):
        demand.note("a", 1)
    assert demand.share("a", 1) > 0.99
    for _ in range(64):
        demand.note("a", 2)
    assert demand.share("a", 1) == pytest.approx((1 - 1 / 64) ** 64, rel=0.01)  # ~e^-1
    assert demand.share("a", 1) + demand.share("a", 2) == pytest.approx(1.0, rel=0.01)


def test_span_is_the_share_in_backends_worth_over_the_headroom() -> None:
    demand = GroupDemand(alpha=1 / 64)
    for i in range(2000):
        demand.note("a", i % 2)  # two groups, half the pool each
    assert demand.span("a", 0, backends=4, headroom=1.25) == 2  # 0.5 * 4 / 1.25 = 1.6
    assert demand.span("a", 0, backends=8, headroom=1.25) == 4  # 3.2
    assert demand.span("a", 0, backends=2, headroom=1.25) == 1  # 0.8
    assert demand.span("a", 9, backends=4, headroom=1.25) == 1  # unknown: one backend
    for _ in range(2000):
        demand.note("a", 0)
    assert demand.span("a", 0, backends=4, headroom=1.0) == 4  # never more than the pool


def test_bounded_by_max_entries_least_recently_updated_first() -> None:
    demand = GroupDemand(alpha=1 / 64, max_entries=2)
    demand.note("a", 1)
    demand.note("a", 2)
    demand.note("a", 1)
    demand.note("a", 3)  # forgets group 2
    assert len(demand) == 2
    assert demand.share("a", 2) == 0.0
    assert demand.share("a", 1) > 0.0 and demand.share("a", 3) > 0.0
    off = GroupDemand(max_entries=0)
    off.note("a", 1)
    assert len(off) == 0 and off.share("a", 1) == 0.0


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, math.nan])
def test_alpha_must_be_a_fraction(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        GroupDemand(alpha=alpha)


def test_max_entries_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="max_entries"):
        GroupDemand(max_entries=-1)


def test_a_few_requests_are_read_as_the_share_they_are() -> None:
    """One of many routing processes sees few requests: a group that is half of them is hot for 4
    backends at headroom 1.25 (0.5 x 4 > 1.25) and spans two after a dozen requests - not a share of
    the window's full weight (1/alpha), which read it as 0.2 of the pool and its span as 1 for most
    of a run at 4 and 8 processes; a fresh pool's first requests are not hot."""
    demand = GroupDemand(alpha=1 / 32)
    demand.note("a", 1)
    assert not demand.hot("a", 1, 4, 1.25)  # one request: 1/8 of HOT_MIN_REQUESTS, not the whole pool
    for i in range(12):
        demand.note("a", 1 if i % 2 else 2)
    assert demand.share("a", 1) == pytest.approx(0.5, abs=0.05)
    assert demand.hot("a", 1, 4, 1.25)
    assert demand.span("a", 1, 4, 1.25) == 2  # 0.5 x 4 / 1.25 = 1.6
    assert not demand.hot("a", 1, 2, 1.25)  # 0.5 x 2 < 1.25
    assert not demand.hot("a", 99, 4, 1.25)
    for _ in range(200):
        demand.note("a", 3)
    assert not demand.hot("a", 1, 4, 1.25)  # it faded
