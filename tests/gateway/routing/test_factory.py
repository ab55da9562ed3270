"""The routing settings build the router: the policy by name, prefix affinity's few settings on top
of its constants (gateway/routing/factory.py)."""

from __future__ import annotations

import pytest

from gateway.routing.factory import build_router, policy_config
from gateway.routing.settings import RoutingSettings
from policies.kv_index import KvIndexConfig
from policies.least_load import LeastLoadConfig
from policies.power_of_two import PowerOfTwoConfig
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from policies.round_robin import RoundRobinConfig


def test_the_default_is_prefix_affinity_with_its_constants() -> None:
    assert policy_config(RoutingSettings()) == PrefixAffinityConfig()
    router, _ = build_router(RoutingSettings())
    assert isinstance(router.policy, PrefixAffinity)


def test_prefix_affinity_takes_its_settings() -> None:
    settings = RoutingSettings.model_validate(
        {"prefix_affinity": {"load_factor": 0.5, "kv_max_blocks": 65536}}
    )
    assert policy_config(settings) == PrefixAffinityConfig(
        load_factor=0.5, kv=KvIndexConfig(max_blocks=65536)
    )


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("least_load", LeastLoadConfig()),
        ("power_of_two", PowerOfTwoConfig()),
        ("round_robin", RoundRobinConfig()),
    ],
)
def test_the_other_policies_have_no_settings(name: str, config: object) -> None:
    assert policy_config(RoutingSettings.model_validate({"policy": name})) == config
