"""Settings of the routing wing: the backend policy, pool rules, prefix blocks and engine scraping."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from gateway.core.settings import SettingsModel
from policies.prefix_affinity import DEFAULT_CONFIG as AFFINITY


class RuleSettings(SettingsModel):
    """A pool rule: the first rule whose conditions all hold narrows the candidate pools."""

    name: str
    pools: list[str]
    min_prompt_tokens: int | None = None
    has_tools: bool | None = None
    structured_output: bool | None = None
    #: the rule's pools are a requirement, not a preference: no other pool, not even to fail over
    strict: bool = False


class SharedSettings(SettingsModel):
    """Routing state shared between routing processes through Redis (docs/routing.md, *Shared load*):
    in-flight counts per backend and new prefix groups' placements, in the admission's round trip."""

    #: share when Redis is configured (standalone or sentinel; not on Redis Cluster)
    enabled: bool = True
    #: a process's counts count this long after its last call (a crashed process's vanish then)
    lease_s: float = Field(10.0, gt=0)
    #: a group's placement lives this long after it was last read or set
    placement_ttl_s: float = Field(600.0, gt=0)
    #: groups whose placement this process remembers (it proposes one only for a group it does not know)
    placements: int = Field(4096, ge=1)


class PrefixAffinitySettings(SettingsModel):
    """The `prefix_affinity` policy's settings (docs/routing.md); the other policies have none."""

    #: ε of bounded-load hashing: a backend takes requests while its load is within (1 + ε) x the
    #: pool's average (plus a few requests); higher keeps more requests where their prefix is warm,
    #: lower spreads load more evenly
    load_factor: float = Field(AFFINITY.load_factor, ge=0)
    #: with the engines' KV events, a hot prefix group's next backend is warmed by a background
    #: one-token prefill of its preamble; false: a user's request opens it with a cold prefill
    warm_spread: bool = AFFINITY.warm_spread
    #: engine blocks the KV-event index keeps per backend, oldest dropped first: the memory bound
    #: (~370 bytes a block); at least an engine's KV capacity in blocks
    kv_max_blocks: int = Field(AFFINITY.kv.max_blocks, ge=1)


class RoutingSettings(SettingsModel):
    #: backend choice inside a pool (docs/routing.md)
    policy: Literal["prefix_affinity", "least_load", "power_of_two", "round_robin"] = "prefix_affinity"
    prefix_affinity: PrefixAffinitySettings = Field(default_factory=PrefixAffinitySettings)
    rules: list[RuleSettings] = Field(default_factory=list)
    #: estimated tokens per prefix block for affinity hashing
    block_tokens: int = Field(32, ge=1)
    #: seconds between engine /metrics scrapes (0 disables)
    scrape_interval_s: float = Field(2.0, ge=0)
    #: scraped figures older than this are ignored
    scrape_stale_s: float = Field(10.0, gt=0)
    #: in-flight counts and group placements shared between routing processes (with Redis)
    shared: SharedSettings = Field(default_factory=SharedSettings)
