from __future__ import annotations

import pytest

from policies.factory import make_policy, parse_policy_config
from policies.least_load import LeastLoad, LeastLoadConfig
from policies.load import LoadModel
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


def test_parse_policy_config() -> None:
    assert parse_policy_config({}) == PrefixAffinityConfig()
    assert parse_policy_config({"kind": "round_robin"}) == RoundRobinConfig()
    parsed = parse_policy_config(
        {"kind": "prefix_affinity", "load_factor": 0.5, "index_entries": 10, "load": {"kv_weight": 2.0}}
    )
    # the load fields not given keep the policy's defaults (affinity: no queue threshold)
    assert parsed == PrefixAffinityConfig(
        load_factor=0.5, index_entries=10, load=LoadModel(kv_weight=2.0, queue_high=None)
    )
    assert parse_policy_config({"load": {"queue_high": 16}}).load == LoadModel(kv_weight=0.0, queue_high=16)
    assert parse_policy_config({"kind": "least_load", "load": {"queue_weight": 3}}) == LeastLoadConfig(
        load=LoadModel(queue_weight=3)
    )


@pytest.mark.parametrize(
    "raw",
    [{"kind": "random"}, {"kind": "round_robin", "load_factor": 1}, {"kind": "least_load", "load": {"x": 1}}],
)
def test_parse_rejects_unknown(raw: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        parse_policy_config(raw)
