from __future__ import annotations

import pytest

from policies.factory import make_policy
from policies.least_load import LeastLoad, LeastLoadConfig
from policies.power_of_two import PowerOfTwo, PowerOfTwoConfig
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from policies.round_robin import RoundRobin, RoundRobinConfig


@pytest.mark.parametrize(
    ("config", "policy_type"),
    [
        (RoundRobinConfig(), RoundRobin),
        (LeastLoadConfig(), LeastLoad),
        (PowerOfTwoConfig(), PowerOfTwo),
        (PrefixAffinityConfig(), PrefixAffinity),
    ],
)
def test_make_policy(config: object, policy_type: type) -> None:
    assert isinstance(make_policy(config), policy_type)  # type: ignore[arg-type]


def test_each_call_makes_fresh_state() -> None:
    a, b = make_policy(PrefixAffinityConfig()), make_policy(PrefixAffinityConfig())
    assert isinstance(a, PrefixAffinity) and isinstance(b, PrefixAffinity)
    assert a.index is not b.index
