"""Building the pure router from the routing settings (the only place settings meet `policies`)."""

from __future__ import annotations

from gateway.routing.settings import RoutingSettings
from policies.factory import parse_policy_config
from policies.features import FeatureConfig
from policies.pools import Rule
from policies.router import Router


def build_router(settings: RoutingSettings) -> tuple[Router, FeatureConfig]:
    rules = [
        Rule(
            name=r.name,
            then_pools=tuple(r.pools),
            prompt_tokens_gte=r.min_prompt_tokens,
            has_tools=r.has_tools,
            structured_output=r.structured_output,
            strict=r.strict,
        )
        for r in settings.rules
    ]
    options: dict[str, object] = {"kind": settings.policy}
    if settings.policy == "prefix_affinity":
        # event-reported tokens are converted to the features' estimated blocks
        options["block_tokens"] = settings.block_tokens
    policy = parse_policy_config({**options, **settings.policy_options})
    return Router(rules, policy), FeatureConfig(block_tokens=settings.block_tokens)
