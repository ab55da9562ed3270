"""Settings of the routing wing: the backend policy, pool rules, prefix blocks and engine scraping."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.core.settings import SettingsModel
from policies.prefix_affinity import DEFAULT_CONFIG as AFFINITY

#: an engine's scraped load counts for five scrape intervals, at least 10 s: a scrape or two may fail
#: or come late without the figures going, while a stopped engine's last figures go soon
SCRAPE_STALE_SCRAPES = 5
SCRAPE_STALE_S = 10.0


class RuleSettings(SettingsModel):
    """A pool rule: the first rule whose conditions all hold narrows the candidate pools."""

    name: str
    pools: list[str]
    min_prompt_tokens: int | None = None
    has_tools: bool | None = None
    structured_output: bool | None = None
    #: reasoning asked for (`reasoning_effort`, or `enable_thinking` in `chat_template_kwargs`)
    reasoning: bool | None = None
    #: the output asked for (`max_tokens`, `max_completion_tokens`) is at least this long
    min_output_tokens: int | None = None
    #: the request shares a long preamble (~1k tokens of tools and system prompt) with others
    shared_preamble: bool | None = None
    #: the rule's pools are a requirement, not a preference: no other pool, not even to fail over
    strict: bool = False


class SharedSettings(SettingsModel):
    """Routing state shared between routing processes through Redis (docs/routing.md, *Shared load*):
    in-flight counts per backend and new prefix groups' placements, in the admission's round trip."""

    #: share when Redis is configured (standalone or sentinel; not on Redis Cluster)
    enabled: bool = True


class PrefixAffinitySettings(SettingsModel):
    """The `prefix_affinity` policy's settings (docs/routing.md); the other policies have none."""

    #: ε of bounded-load hashing: a backend takes requests while its load is within (1 + ε) x the
    #: pool's average (plus a few requests); higher keeps more requests where their prefix is warm,
    #: lower spreads load more evenly
    load_factor: float = Field(AFFINITY.load_factor, ge=0)
    #: engine blocks the KV-event index keeps per backend, oldest dropped first: the memory bound
    #: (~370 bytes a block); at least an engine's KV capacity in blocks
    kv_max_blocks: int = Field(AFFINITY.kv.max_blocks, ge=1)


class RoutingSettings(SettingsModel):
    #: backend choice inside a pool (docs/routing.md)
    policy: Literal["prefix_affinity", "least_load", "power_of_two", "round_robin"] = "prefix_affinity"
    prefix_affinity: PrefixAffinitySettings = Field(default_factory=PrefixAffinitySettings)
    rules: list[RuleSettings] = Field(default_factory=list)
    #: seconds between engine /metrics scrapes (0 disables)
    scrape_interval_s: float = Field(2.0, ge=0)
    #: in-flight counts and group placements shared between routing processes (with Redis)
    shared: SharedSettings = Field(default_factory=SharedSettings)
    #: move pool weight toward the pools that serve each model better, from the engine comparison
    #: (gateway/flow/rebalance.py; docs/operations.md, *Comparing engines*)
    rebalance: bool = False

    @property
    def scrape_stale_s(self) -> float:
        """Scraped figures older than this are ignored: `SCRAPE_STALE_SCRAPES` intervals, at least
        `SCRAPE_STALE_S`."""
        return max(SCRAPE_STALE_S, SCRAPE_STALE_SCRAPES * self.scrape_interval_s)
