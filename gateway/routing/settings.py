"""Settings of the routing wing: the backend policy, pool rules, prefix blocks and engine scraping."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gateway.core.settings import SettingsModel


class RuleSettings(SettingsModel):
    """A pool rule: the first rule whose conditions all hold narrows the candidate pools."""

    name: str
    pools: list[str]
    min_prompt_tokens: int | None = None
    has_tools: bool | None = None
    structured_output: bool | None = None
    #: the rule's pools are a requirement, not a preference: no other pool, not even to fail over
    strict: bool = False


class RoutingSettings(SettingsModel):
    #: backend choice inside a pool (docs/routing.md)
    policy: Literal["prefix_affinity", "least_load", "power_of_two", "round_robin"] = "prefix_affinity"
    #: the chosen policy's parameters (docs/routing.md lists them per policy)
    policy_options: dict[str, Any] = Field(default_factory=dict)
    rules: list[RuleSettings] = Field(default_factory=list)
    #: estimated tokens per prefix block for affinity hashing
    block_tokens: int = Field(32, ge=1)
    #: seconds between engine /metrics scrapes (0 disables)
    scrape_interval_s: float = Field(2.0, ge=0)
    #: scraped figures older than this are ignored
    scrape_stale_s: float = Field(10.0, gt=0)
