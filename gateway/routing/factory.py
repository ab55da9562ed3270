"""Building the pure router from the routing settings (the only place settings meet `policies`)."""

from __future__ import annotations

from typing import assert_never

from gateway.routing.settings import RoutingSettings
from policies.factory import PolicyConfig
from policies.features import DEFAULT_FEATURE_CONFIG, FeatureConfig
from policies.kv_index import KvIndexConfig
from policies.least_load import LeastLoadConfig
from policies.pools import Rule
from policies.power_of_two import PowerOfTwoConfig
from policies.prefix_affinity import PrefixAffinityConfig
from policies.round_robin import RoundRobinConfig
from policies.router import Router


def policy_config(settings: RoutingSettings) -> PolicyConfig:
    """The backend policy's config: its kind from `routing.policy`, prefix affinity's settings from
    `routing.prefix_affinity`; every other parameter keeps the policy's constants."""
    match settings.policy:
        case "prefix_affinity":
            s = settings.prefix_affinity
            return PrefixAffinityConfig(
                load_factor=s.load_factor,
                kv=KvIndexConfig(max_blocks=s.kv_max_blocks),
            )
        case "least_load":
            return LeastLoadConfig()
        case "power_of_two":
            return PowerOfTwoConfig()
        case "round_robin":
            return RoundRobinConfig()
        case _:
            assert_never(settings.policy)


def build_router(settings: RoutingSettings) -> tuple[Router, FeatureConfig]:
    rules = [
        Rule(
            name=r.name,
            then_pools=tuple(r.pools),
            prompt_tokens_gte=r.min_prompt_tokens,
            has_tools=r.has_tools,
            structured_output=r.structured_output,
            strict=r.strict,
            reasoning=r.reasoning,
            max_tokens_gte=r.min_output_tokens,
            shared_preamble=r.shared_preamble,
        )
        for r in settings.rules
    ]
    return Router(rules, policy_config(settings)), DEFAULT_FEATURE_CONFIG
