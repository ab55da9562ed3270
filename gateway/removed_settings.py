"""Settings that are gone, and what a config that still sets one gets.

A config file written for an earlier version keeps loading when the gateway can still do what it
asks, and says so: a removed setting is looked up in `REMOVED` (by its dotted path) before the
settings are validated, and

- `Moved`: its value is read from its new place, with a warning naming it;
- `Frozen` (now a constant, or implied by other settings): set to the value the gateway uses, it is
  dropped with a warning; set to anything else it is an error, since the gateway cannot do that;
- `Rewritten`: its meaning lives in another setting now; the entry's function rewrites the config
  (or raises when it cannot) and says what it did;
- `Ignored`: a choice between implementations that are one now: whatever it says, dropped with a
  warning (the gateway behaves the same to its clients either way);
- `Dissolved`: a mapping every key of which has an entry of its own (`routing.policy_options`):
  dropped once they are handled; any other key in it is an error.

Warnings are `RemovedSettingWarning`s, reported at the config file (the suite turns them into
errors: every config in the tree uses today's keys). A key that is neither a setting nor in
`REMOVED` stays an error, as every unknown key is.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import gateway.admission.api_keys as api_keys
import gateway.admission.assembly as admission
import gateway.admission.jwks as jwks
import gateway.admission.jwt_auth as jwt_auth
import gateway.admission.limits as limits
import gateway.admission.limits_redis as limits_redis
import gateway.admission.media_fetch as media_fetch
import gateway.admission.sanitise as sanitise
import gateway.apis.assembly as apis
import gateway.core.redis_client as redis_client
import gateway.edge.http_guard as http_guard
import gateway.edge.settings as edge_settings
import gateway.observability.metrics_sampler as metrics_sampler
import gateway.observability.otlp as otlp
import gateway.routing.settings as routing_settings
import gateway.routing.shared_load as shared_load
import gateway.upstream.h1 as h1
import gateway.upstream.retry as retry
import policies.features as features
import policies.kv_index as kv_index
import policies.load as load
import policies.prefix_affinity as affinity
import policies.shared_load as policy_shared_load
from gateway.admission.settings import (
    DEFAULT_ALGORITHMS,
    DEFAULT_SPECIAL_TOKENS,
    DEFAULT_TENANT,
    DEFAULT_TIER,
)

Config = dict[str, Any]


class RemovedSettingWarning(UserWarning):
    """A config sets a removed setting; the gateway does what it asked (the message says how)."""


class RemovedSettingError(ValueError):
    """A config sets a removed setting to something the gateway cannot do: `key` (dotted) and
    `reason` (what to change)."""

    def __init__(self, key: str, reason: str) -> None:
        super().__init__(f"{key}: {reason}")
        self.key = key
        self.reason = reason


@dataclass(frozen=True)
class Moved:
    """Now at the dotted path `to`, with the same meaning and values."""

    to: str


@dataclass(frozen=True)
class Frozen:
    """No longer a setting: the gateway always uses `value` (a function of the whole config when it
    is implied by other settings), which `what` explains ("always 60 s (module.NAME)")."""

    value: object
    what: str

    def used(self, config: Mapping[str, Any]) -> object:
        return self.value(config) if callable(self.value) else self.value


@dataclass(frozen=True)
class Rewritten:
    """`rewrite(config, value)` moves the setting's meaning into today's settings (or raises
    `ValueError`, saying what to change, when it cannot) and returns what it did, for the warning."""

    rewrite: Callable[[Config, Any], str]


@dataclass(frozen=True)
class Ignored:
    """A choice that is gone (one implementation is left, `what`): any value is dropped."""

    what: str


@dataclass(frozen=True)
class Dissolved:
    """A mapping whose keys are each removed (each has an entry of its own)."""


Removal = Moved | Frozen | Rewritten | Ignored | Dissolved


def constant(module: ModuleType, name: str) -> Frozen:
    """A setting that is now the constant `name` of `module`."""
    value = getattr(module, name)
    return Frozen(value, f"always {value!r}: {module.__name__}.{name}")


def _policy(config: Mapping[str, Any]) -> str:
    routing = config.get("routing") or {}
    options = routing.get("policy_options") or {}
    return str(options.get("kind") or routing.get("policy") or "prefix_affinity")


def _load_model(field: str) -> Frozen:
    """A field of the policies' load model (`routing.policy_options.load`): each policy's own."""

    def used(config: Mapping[str, Any]) -> object:
        model = (
            affinity.AFFINITY_LOAD_MODEL if _policy(config) == "prefix_affinity" else load.DEFAULT_LOAD_MODEL
        )
        return getattr(model, field)

    what = "the policy's own: policies.prefix_affinity.AFFINITY_LOAD_MODEL, else policies.load.DEFAULT_LOAD_MODEL"
    return Frozen(used, what)


def _scrape_stale_s(config: Mapping[str, Any]) -> object:
    interval = (config.get("routing") or {}).get("scrape_interval_s", 2.0)
    if not isinstance(interval, (int, float)):
        return None  # not a number: the interval's own validation says so
    return max(routing_settings.SCRAPE_STALE_S, routing_settings.SCRAPE_STALE_SCRAPES * interval)


def _default_tier(config: Config, tier: Any) -> str:
    """`limits.default_tier`: the tier named `default` is the default now; another name is read as
    `default` when no tier has that name already."""
    tiers = (config.get("limits") or {}).get("tiers")
    if tier == DEFAULT_TIER:
        return f"the tier named {DEFAULT_TIER!r} is the default; remove it"
    if not isinstance(tiers, dict) or tier not in tiers or DEFAULT_TIER in tiers:
        raise ValueError(
            f"limits.default_tier is no longer a setting: the tier named {DEFAULT_TIER!r} applies to "
            f"principals without a listed tier; name tier {tier!r} {DEFAULT_TIER!r} instead"
        )
    tiers[DEFAULT_TIER] = tiers.pop(tier)
    return f"the tier named {DEFAULT_TIER!r} is the default; tier {tier!r} is read as {DEFAULT_TIER!r} (rename it)"


def _tenant_default(config: Config, limits: Any) -> str:
    """`limits.tenant_default`: the tenant named `default` is the limits of tenants not listed."""
    section = config.setdefault("limits", {})
    tenants = section.setdefault("tenants", {})
    if not isinstance(tenants, dict) or DEFAULT_TENANT in tenants:
        raise ValueError(
            f"limits.tenant_default is no longer a setting: the tenant named {DEFAULT_TENANT!r} applies to "
            "tenants not listed, and one is listed already; keep one of the two"
        )
    tenants[DEFAULT_TENANT] = limits
    return f"tenants not listed take limits.tenants.{DEFAULT_TENANT} (move it there)"


def _tokens_by_model(config: Config, by_model: Any) -> str:
    """`sanitise.special_tokens_by_model`: one list for every model now; a model's own tokens join it."""
    if not by_model:
        return "sanitise.special_token_list applies to every model; remove it"
    if not isinstance(by_model, dict):
        raise ValueError(
            "sanitise.special_tokens_by_model is no longer a setting: use sanitise.special_token_list"
        )
    section = config.setdefault("sanitise", {})
    tokens = list(section.get("special_token_list", DEFAULT_SPECIAL_TOKENS))
    added = 0
    for own in by_model.values():
        for token in own:
            if token not in tokens:
                tokens.append(token)
                added += 1
    section["special_token_list"] = tokens
    return (
        f"sanitise.special_token_list applies to every model; {added} token(s) of the models' own "
        "lists are added to it (move them there)"
    )


def _jwt(config: Config) -> Config:
    auth = config.setdefault("auth", {})
    jwt = auth.setdefault("jwt", {}) if isinstance(auth, dict) else None
    if not isinstance(jwt, dict):
        raise ValueError("auth.jwt is not a mapping")
    return jwt


def _joined(algorithms: Any, more: Any) -> list[str]:
    if not isinstance(more, list) or not all(isinstance(a, str) for a in more):
        raise ValueError("not a list of algorithms; use auth.jwt.algorithms")
    return [*algorithms, *(a for a in more if a not in algorithms)]


def _key_algorithms(config: Config, algorithms: Any) -> str:
    """`auth.jwt.public_keys[].algorithms`: one list, `auth.jwt.algorithms`, for every public key now
    (each verifies those its type and curve can do); a key's own join it."""
    jwt = _jwt(config)
    base = jwt.get("algorithms") or jwt.get("jwks_algorithms") or list(DEFAULT_ALGORITHMS)
    jwt["algorithms"] = _joined(base, algorithms)
    return (
        f"auth.jwt.algorithms holds every public key's algorithms, now {jwt['algorithms']} (move them there)"
    )


def _jwks_algorithms(config: Config, algorithms: Any) -> str:
    """`auth.jwt.jwks_algorithms`: `auth.jwt.algorithms`, which static public keys share now."""
    jwt = _jwt(config)
    jwt["algorithms"] = _joined(jwt.get("algorithms") or [], algorithms)
    return f"now auth.jwt.algorithms, for static public keys as well: {jwt['algorithms']} (move it there)"


_BOUNDS = (
    "max_json_depth",
    "max_messages",
    "max_string_chars",
    "max_tools",
    "max_stop",
    "max_stop_chars",
    "max_logit_bias",
    "context_slack",
)


def _bound(field: str) -> Frozen:
    value = getattr(sanitise.BOUNDS, field)
    return Frozen(value, f"always {value!r}: gateway.admission.sanitise.Bounds.{field}")


_AFFINITY_CONSTANTS = {
    "group_min_blocks": "GROUP_MIN_BLOCKS",
    "group_choices": "GROUP_CHOICES",
    "shared_group_choices": "SHARED_GROUP_CHOICES",
    "placement_slack": "PLACEMENT_SLACK",
    "shared_placement_slack": "SHARED_PLACEMENT_SLACK",
    "blocks_per_request": "BLOCKS_PER_REQUEST",
    "tolerance": "TOLERANCE",
    "load_slack": "LOAD_SLACK",
    "warm_slack": "WARM_SLACK",
    "pool_load_factor": "POOL_LOAD_FACTOR",
    "index_entries": "INDEX_ENTRIES",
    "index_max_holders": "INDEX_MAX_HOLDERS",
    "index_stride": "INDEX_STRIDE",
    "working_set_entries": "WORKING_SET_ENTRIES",
    "demand_window": "DEMAND_WINDOW",
    "demand_entries": "DEMAND_ENTRIES",
    "pending_s": "PENDING_S",
    "preamble_weight": "PREAMBLE_WEIGHT",
    "prefill_weight": "PREFILL_WEIGHT",
}
_KV_CONSTANTS = {
    "min_block_tokens": "MIN_BLOCK_TOKENS",
    "scan_stride": "SCAN_STRIDE",
    "silent_requests": "SILENT_REQUESTS",
    "silent_s": "SILENT_S",
    "relearn_s": "RELEARN_S",
    "anchor_prompts": "ANCHOR_PROMPTS",
    "anchor_tokens": "ANCHOR_TOKENS",
}

#: every removed setting by its dotted path
REMOVED: dict[str, Removal] = {
    # the policies' parameters, once an untyped mapping: prefix affinity's few settings are
    # `routing.prefix_affinity`, the rest the policies' constants
    "routing.policy_options": Dissolved(),
    "routing.policy_options.kind": Moved("routing.policy"),
    "routing.policy_options.load_factor": Moved("routing.prefix_affinity.load_factor"),
    "routing.policy_options.warm_spread": constant(affinity, "WARM_SPREAD"),
    "routing.prefix_affinity.warm_spread": constant(affinity, "WARM_SPREAD"),
    "routing.policy_options.block_tokens": constant(features, "BLOCK_TOKENS"),
    "routing.policy_options.session_in_key": Frozen(
        False, "a request's session, when it names one, is its routing key (SESSION_KEYS)"
    ),
    **{f"routing.policy_options.{k}": constant(affinity, name) for k, name in _AFFINITY_CONSTANTS.items()},
    "routing.policy_options.load": Dissolved(),
    **{
        f"routing.policy_options.load.{f}": _load_model(f)
        for f in ("queue_weight", "kv_weight", "queue_high", "kv_high")
    },
    "routing.policy_options.kv": Dissolved(),
    "routing.policy_options.kv.max_blocks": Moved("routing.prefix_affinity.kv_max_blocks"),
    **{f"routing.policy_options.kv.{k}": constant(kv_index, name) for k, name in _KV_CONSTANTS.items()},
    "routing.block_tokens": constant(features, "BLOCK_TOKENS"),
    "routing.scrape_stale_s": Frozen(
        _scrape_stale_s,
        "implied by routing.scrape_interval_s: five intervals, at least 10 s "
        "(gateway.routing.settings.SCRAPE_STALE_SCRAPES)",
    ),
    "routing.shared.placement_ttl_s": constant(shared_load, "PLACEMENT_TTL_S"),
    "routing.shared.placements": constant(policy_shared_load, "PLACEMENTS"),
    "routing.shared.lease_s": constant(shared_load, "LEASE_S"),
    # implementations that are one now
    "upstream.client": Ignored("the gateway has one HTTP client for the engines, gateway/upstream/h1.py"),
    "tracing.exporter": Ignored(
        "spans are exported by the gateway's own OTLP encoder, gateway/observability/otlp.py"
    ),
    # internal bounds and cadences: constants beside the code that uses them
    "server.max_header_bytes": Frozen(
        http_guard.GuardedHttpToolsProtocol.max_header_bytes,
        f"always {http_guard.GuardedHttpToolsProtocol.max_header_bytes}: "
        "gateway.edge.http_guard.GuardedHttpToolsProtocol.max_header_bytes",
    ),
    "redis.max_connections": constant(redis_client, "MAX_CONNECTIONS"),
    "redis.db": Frozen(0, "database 0; standalone takes its database from the url"),
    "redis.pool_wait_s": constant(redis_client, "POOL_WAIT_S"),
    "redis.timeout_s": constant(redis_client, "TIMEOUT_S"),
    "metrics.sample_interval_s": constant(metrics_sampler, "SAMPLE_INTERVAL_S"),
    "apis.responses.memory_max_entries": constant(apis, "MEMORY_MAX_ENTRIES"),
    "apis.responses.max_record_bytes": constant(apis, "MAX_RECORD_BYTES"),
    "limits.window_s": constant(admission, "WINDOW_S"),
    "limits.redis_probe_s": constant(limits, "PROBE_S"),
    "limits.concurrency_lease_s": constant(limits_redis, "LEASE_S"),
    "limits.track_spend": Frozen(
        True, "always on: a limited principal's spend rides in the limiter's calls (GET /admin/spend)"
    ),
    "limits.default_tier": Rewritten(_default_tier),
    "limits.tenant_default": Rewritten(_tenant_default),
    "auth.jwt.secret_algorithms": Frozen(list(jwt_auth.SECRET_ALGORITHMS), "always HS256"),
    "auth.jwt.required_claims": Frozen(
        list(jwt_auth.REQUIRED_CLAIMS), "always exp and sub: gateway.admission.jwt_auth.REQUIRED_CLAIMS"
    ),
    "auth.jwt.leeway_s": constant(jwt_auth, "LEEWAY_S"),
    "auth.jwt.max_token_bytes": constant(jwt_auth, "MAX_TOKEN_BYTES"),
    "auth.jwt.cache_ttl_s": constant(jwt_auth, "CACHE_TTL_S"),
    "auth.jwt.cache_size": constant(jwt_auth, "CACHE_SIZE"),
    "auth.jwt.jwks_refresh_s": constant(jwks, "REFRESH_S"),
    "auth.jwt.jwks_min_refresh_s": constant(jwks, "MIN_REFRESH_S"),
    "auth.jwt.jwks_timeout_s": constant(jwks, "TIMEOUT_S"),
    "auth.jwt.jwks_algorithms": Rewritten(_jwks_algorithms),
    "auth.jwt.public_keys[].algorithms": Rewritten(_key_algorithms),
    "auth.api_keys.cache_ttl_s": constant(api_keys, "CACHE_TTL_S"),
    "auth.api_keys.cache_size": constant(api_keys, "CACHE_SIZE"),
    "auth.api_keys.outage_grace_s": constant(api_keys, "OUTAGE_GRACE_S"),
    "sanitise.media.fetch_timeout_s": constant(media_fetch, "FETCH_TIMEOUT_S"),
    "upstream.keepalive_s": constant(h1, "KEEPALIVE_S"),
    "upstream.timeouts.connect_s": constant(h1, "CONNECT_TIMEOUT_S"),
    "upstream.retries.budget_ratio": constant(retry, "RATIO"),
    "upstream.retries.budget_min_per_s": constant(retry, "MIN_PER_S"),
    "tracing.max_queued_requests": constant(otlp, "MAX_QUEUED"),
    "tracing.export_interval_s": constant(otlp, "EXPORT_INTERVAL_S"),
    "tracing.timeout_s": constant(otlp, "EXPORT_TIMEOUT_S"),
    "metrics.enabled": Frozen(
        True, "/metrics is part of the gateway's API; protect it with metrics.bearer_token"
    ),
    # the request bounds: OpenAI's limits (gateway.admission.sanitise.Bounds)
    **{f"sanitise.{f}": _bound(f) for f in _BOUNDS},
    "sanitise.template_marker_list": Frozen(
        list(sanitise.TEMPLATE_MARKERS),
        "always Jinja's delimiters: gateway.admission.sanitise.TEMPLATE_MARKERS",
    ),
    "sanitise.special_tokens_by_model": Rewritten(_tokens_by_model),
    "server.keepalive_s": constant(edge_settings, "CLIENT_KEEPALIVE_S"),
    "server.header_timeout_s": constant(http_guard, "HEADER_TIMEOUT_S"),
    "models[].owned_by": Frozen("gateway", "always 'gateway': gateway.app.OWNED_BY"),
    "server.limit_concurrency": Frozen(
        0, "always unlimited: overload is the engines', queued by the gateway"
    ),
    "upstream.max_connections_per_backend": constant(h1, "MAX_IDLE_PER_BACKEND"),
}


def migrate(
    config: Config,
    source: str = "<config>",
    removed: Mapping[str, Removal] = REMOVED,
    *,
    line: Callable[[str], int | None] | None = None,
) -> Config:
    """`config` (a parsed config file, not changed) with every setting of `removed` handled as the
    module docstring says; warnings are reported at `source`, at `line(key)` when known. Raises
    `RemovedSettingError` for a removed setting whose value the gateway cannot honour."""
    out = _copy(config)
    handled: list[str] = []
    for path in sorted(removed, key=lambda p: -p.count(".")):  # a mapping's keys before the mapping
        parent, _, key = path.rpartition(".")
        removal = removed[path]
        for where, node in _nodes(out, parent):
            if key not in node:
                continue
            value = node.pop(key)
            at_path = f"{where}.{key}" if where else key  # `models[0].owned_by` for `models[].owned_by`
            if isinstance(removal, Dissolved):
                if not isinstance(value, dict):
                    raise RemovedSettingError(
                        at_path, "no longer a setting (docs/configuration.md); remove it"
                    )
                if value:  # its removed keys are gone already: what is left was never a setting
                    raise RemovedSettingError(
                        f"{at_path}.{sorted(value)[0]}", "not a setting (docs/configuration.md)"
                    )
                if any(h.startswith(at_path + ".") for h in handled):
                    continue  # its keys said what became of them
                message = f"{at_path} is no longer a setting; remove it"
            else:
                message = _apply(out, at_path, value, removal)
            handled.append(at_path)
            at = (line(at_path) if line is not None else None) or 0
            warnings.warn_explicit(message, RemovedSettingWarning, source, at, module="gateway.settings")
    return out


def _apply(config: Config, path: str, value: Any, removal: Moved | Frozen | Rewritten | Ignored) -> str:
    """Handles the removed setting at `path` (taken out of `config`): the warning to give."""
    match removal:
        case Moved(to):
            parent, _, name = to.rpartition(".")
            target = _node(config, parent, create=True)
            if target is None:
                raise RemovedSettingError(path, f"now {to}, and {parent} is not a mapping")
            if name in target:
                raise RemovedSettingError(path, f"now {to}, and both are set: keep {to} only")
            target[name] = value
            return f"{path} is now {to} (move it there)"
        case Frozen():
            used = removal.used(config)
            if not _same(value, used):
                raise RemovedSettingError(
                    path,
                    f"{value!r} is no longer possible, it is not a setting any more ({removal.what}); remove it",
                )
            return f"{path} is no longer a setting ({removal.what}); remove it"
        case Ignored(what):
            return f"{path} is gone and ignored ({what}); remove it"
        case Rewritten(rewrite):
            try:
                return f"{path} is no longer a setting: {rewrite(config, value)}"
            except ValueError as exc:
                raise RemovedSettingError(path, str(exc)) from None


def _same(given: Any, used: object) -> bool:
    if isinstance(given, bool) or isinstance(used, bool):
        return given is used
    if isinstance(given, (list, tuple)) and isinstance(used, (list, tuple)):
        return list(given) == list(used)
    return bool(given == used)


def _nodes(config: Config, path: str) -> list[tuple[str, Config]]:
    """The mappings at the dotted `path`, each with its own path: `name[]` stands for every entry of
    the list `name` (`models[]` -> `models[0]`, `models[1]`, ...)."""
    found: list[tuple[str, Any]] = [("", config)]
    for part in path.split(".") if path else ():
        name, entries = (part[:-2], True) if part.endswith("[]") else (part, False)
        step: list[tuple[str, Any]] = []
        for where, node in found:
            child = node.get(name) if isinstance(node, dict) else None
            at = f"{where}.{name}" if where else name
            if not entries:
                step.append((at, child))
            elif isinstance(child, list):
                step += [(f"{at}[{i}]", entry) for i, entry in enumerate(child)]
        found = step
    return [(where, node) for where, node in found if isinstance(node, dict)]


def _node(config: Config, path: str, create: bool = False) -> Config | None:
    node: Any = config
    for part in path.split(".") if path else ():
        if not isinstance(node, dict):
            return None
        if part not in node and create:
            node[part] = {}
        node = node.get(part)
    return node if isinstance(node, dict) else None


def _copy(config: Config) -> Config:
    return {k: _copy(v) if isinstance(v, dict) else v for k, v in config.items()}
