"""The operator's run-time changes to the fleet, as one value: what `Fleet.apply` puts on top of the
config file's pools (gateway/core/fleet.py) and what the control wing's store persists and shares
(gateway/control/store.py documents the stored field names).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class Overrides:
    weights: dict[str, float] = field(default_factory=dict)
    #: the weights the rebalancing loop set (gateway/flow/rebalance.py); an admin's `weights` outrank them
    rebalanced: dict[str, float] = field(default_factory=dict)
    drained: set[str] = field(default_factory=set)
    added: dict[str, tuple[str, str]] = field(default_factory=dict)  # backend -> (pool, url)
    removed: set[str] = field(default_factory=set)
    #: when an operator last asked every replica to re-read its config file (0: never)
    reload_at: float = 0.0
    #: the stored fields these were read from (gateway/control/store.py names them)
    fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Overrides:
        o = cls(fields=dict(fields))
        for key, value in fields.items():
            kind, _, name = key.partition(":")
            if kind == "weight":
                o.weights[name] = float(value)
            elif kind == "rebalance":
                o.rebalanced[name] = float(value)
            elif kind == "drain" and value:
                o.drained.add(name)
            elif kind == "add":
                o.added[name] = (str(value["pool"]), str(value["url"]))
            elif kind == "remove" and value:
                o.removed.add(name)
            elif kind == "reload":
                o.reload_at = float(value)
        return o
