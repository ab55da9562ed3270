"""Settings of flow control: the `flow` section (docs/flow-control.md; reference: docs/configuration.md).

A class is named by `limits.tiers.<name>.priority_class` (also on a tenant) and by an API key's own
class; every class named there must be defined here. Without a `flow` section the three shipped
classes apply and the queue is on: it engages only when the fleet is saturated.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.core.settings import SettingsModel

#: the class of principals whose key, tier and tenant name none
DEFAULT_CLASS = "standard"


class FlowClassSettings(SettingsModel):
    """One priority class."""

    #: lower goes first: a waiting request of a lower number is always released before a higher one
    priority: int = Field(ge=0, le=1000)
    #: the longest a request of the class waits in the gateway's queue (a request may ask for less)
    max_queue_s: float = Field(gt=0, le=3600)
    #: requests of the class waiting in one gateway process, at most (0: never wait)
    max_queued: int = Field(ge=0, le=1_000_000)
    #: the time to first token the class aims for: placement prefers backends predicted to meet it,
    #: and a request predicted to miss it by far waits (null: no target)
    ttft_target_s: float | None = Field(None, gt=0, le=600)
    #: a backend whose engine reports this share of its KV cache in use takes no more requests of
    #: the class: the rest is kept for more urgent classes (null: up to saturation)
    max_kv_use: float | None = Field(None, gt=0, le=1)


def _default_classes() -> dict[str, FlowClassSettings]:
    return {
        "interactive": FlowClassSettings(priority=0, max_queue_s=5, max_queued=256, ttft_target_s=1.0),
        "standard": FlowClassSettings(priority=1, max_queue_s=20, max_queued=1024),
        "batch": FlowClassSettings(priority=2, max_queue_s=120, max_queued=4096, max_kv_use=0.8),
    }


class FlowSettings(SettingsModel):
    #: queue requests in the gateway while the backends they may use are saturated (false: pass
    #: everything through to the engines, as without flow control; classes are still resolved)
    enabled: bool = True
    #: the priority classes by name; given, they replace the shipped three (one must be `standard`)
    classes: dict[str, FlowClassSettings] = Field(default_factory=_default_classes)
    #: a tenant's share within its class (a user without a tenant counts as a tenant of weight 1)
    tenant_weights: dict[str, float] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _consistent(self) -> FlowSettings:
        if DEFAULT_CLASS not in self.classes:
            raise ValueError(
                f"flow.classes needs a class named {DEFAULT_CLASS!r} (principals that name none)"
            )
        for tenant, weight in self.tenant_weights.items():
            if not weight > 0:
                raise ValueError(f"flow.tenant_weights.{tenant} must be above 0")
        return self
