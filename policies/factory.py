"""Backend policies chosen by their config: one tagged union, one exhaustive match.

Adding a policy = one module with the policy and its `...Config` (with a `kind` literal), one variant
in `PolicyConfig`, one `case` below and one in `gateway/routing/factory.py` (which builds the config
from the settings).
"""

from __future__ import annotations

from typing import assert_never

from policies.least_load import LeastLoad, LeastLoadConfig
from policies.policy import BackendPolicy
from policies.power_of_two import PowerOfTwo, PowerOfTwoConfig
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from policies.round_robin import RoundRobin, RoundRobinConfig

PolicyConfig = RoundRobinConfig | LeastLoadConfig | PowerOfTwoConfig | PrefixAffinityConfig


def make_policy(config: PolicyConfig) -> BackendPolicy:
    """A fresh policy instance (with its own routing state) for `config`."""
    match config:
        case RoundRobinConfig():
            return RoundRobin(config)
        case LeastLoadConfig():
            return LeastLoad(config)
        case PowerOfTwoConfig():
            return PowerOfTwo(config)
        case PrefixAffinityConfig():
            return PrefixAffinity(config)
        case _:
            assert_never(config)
