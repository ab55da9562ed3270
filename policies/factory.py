"""Backend policies chosen by name from configuration: one tagged union, one exhaustive match.

Adding a policy = one module with the policy and its `...Config` (with a `kind` literal), one variant
in `PolicyConfig`, one `case` below and one entry in `_CONFIG_TYPES`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, assert_never

from policies.kv_index import KvIndexConfig
from policies.least_load import LeastLoad, LeastLoadConfig
from policies.load import LoadModel
from policies.policy import BackendPolicy
from policies.power_of_two import PowerOfTwo, PowerOfTwoConfig
from policies.prefix_affinity import PrefixAffinity, PrefixAffinityConfig
from policies.round_robin import RoundRobin, RoundRobinConfig

PolicyKind = Literal["round_robin", "least_load", "power_of_two", "prefix_affinity"]
PolicyConfig = RoundRobinConfig | LeastLoadConfig | PowerOfTwoConfig | PrefixAffinityConfig

_CONFIG_TYPES: dict[str, type[PolicyConfig]] = {
    "round_robin": RoundRobinConfig,
    "least_load": LeastLoadConfig,
    "power_of_two": PowerOfTwoConfig,
    "prefix_affinity": PrefixAffinityConfig,
}


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


def parse_policy_config(raw: Mapping[str, Any]) -> PolicyConfig:
    """A policy config from a plain mapping (e.g. YAML): `{"kind": "prefix_affinity", "load_factor":
    0.25, "load": {"kv_weight": 4.0}, ...}`. Unknown kinds or fields raise `ValueError`."""
    kind = raw.get("kind", "prefix_affinity")
    config_type = _CONFIG_TYPES.get(kind)
    if config_type is None:
        raise ValueError(f"unknown routing policy kind {kind!r}; expected one of {sorted(_CONFIG_TYPES)}")
    known = {f.name for f in dataclasses.fields(config_type)}
    unknown = set(raw) - known
    if unknown:
        raise ValueError(f"unknown fields for policy {kind!r}: {sorted(unknown)}")
    values = dict(raw)
    try:
        if "load" in values and isinstance(values["load"], Mapping):
            # fields not given keep the policy's own defaults (prefix affinity's differ from
            # `LoadModel()`'s: no KV weight, no queue threshold)
            base = next(f.default for f in dataclasses.fields(config_type) if f.name == "load")
            assert isinstance(base, LoadModel)
            values["load"] = dataclasses.replace(base, **values["load"])
        if "kv" in values and isinstance(values["kv"], Mapping):
            values["kv"] = KvIndexConfig(**values["kv"])
        return config_type(**values)
    except TypeError as exc:
        raise ValueError(f"invalid policy config: {exc}") from exc
