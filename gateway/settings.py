"""The gateway's settings: parsed once from YAML (plus environment overrides) into typed objects.

Nothing else in the gateway reads files or environment variables for configuration; every component
receives the part of `Settings` it needs. The reference for every field is docs/configuration.md.

Environment overrides: `GATEWAY_<SECTION>__<FIELD>=value` (double underscore between levels), e.g.
`GATEWAY_SERVER__PORT=9000`, `GATEWAY_REDIS__URL=redis://127.0.0.1:6379/0`. Values are parsed as YAML
scalars, so `true`, `3`, `0.5` get their natural types. `REDIS_URL` and `GATEWAY_JWT_SECRET` are also
honoured as the conventional short forms.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Any, Union, get_args, get_origin

import yaml
from pydantic import BaseModel, ValidationError, model_validator

from gateway.admission.settings import AuthSettings, LimitsSettings, SanitiseSettings
from gateway.apis.settings import ApisSettings, ResponsesSettings
from gateway.config_errors import Problem, key_line, problems, yaml_problem
from gateway.core.settings import (
    BackendSettings,
    HealthSettings,
    KvEventsSettings,
    ModelSettings,
    PoolSettings,
    RedisSettings,
    SettingsModel,
)
from gateway.edge.settings import ServerSettings
from gateway.flow.settings import FlowSettings
from gateway.observability.settings import AccessLogSettings, MetricsSettings, TracingSettings
from gateway.removed_settings import RemovedSettingError, migrate
from gateway.routing.settings import RoutingSettings, RuleSettings
from gateway.upstream.settings import RetrySettings, TimeoutSettings, UpstreamSettings

#: the public configuration API: every section type, wherever its wing keeps it
__all__ = [
    "AccessLogSettings",
    "ApisSettings",
    "AuthSettings",
    "BackendSettings",
    "ConfigError",
    "FlowSettings",
    "HealthSettings",
    "KvEventsSettings",
    "LimitsSettings",
    "MetricsSettings",
    "ModelSettings",
    "PoolSettings",
    "RedisSettings",
    "ResponsesSettings",
    "RetrySettings",
    "RoutingSettings",
    "RuleSettings",
    "SanitiseSettings",
    "ServerSettings",
    "Settings",
    "TimeoutSettings",
    "TracingSettings",
    "UpstreamSettings",
    "diff_settings",
    "load_settings",
    "parse_settings",
    "setting_paths",
]


class Settings(SettingsModel):
    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    models: list[ModelSettings]
    pools: list[PoolSettings]
    routing: RoutingSettings = RoutingSettings()
    redis: RedisSettings = RedisSettings()
    access_log: AccessLogSettings = AccessLogSettings()
    metrics: MetricsSettings = MetricsSettings()
    tracing: TracingSettings = TracingSettings()
    auth: AuthSettings = AuthSettings()
    limits: LimitsSettings = LimitsSettings()
    sanitise: SanitiseSettings = SanitiseSettings()
    apis: ApisSettings = ApisSettings()
    flow: FlowSettings = FlowSettings()

    @model_validator(mode="after")
    def _consistent(self) -> Settings:
        names = [p.name for p in self.pools]
        if len(set(names)) != len(names):
            raise ValueError("pool names must be unique")
        model_names = {m.name for m in self.models}
        if len(model_names) != len(self.models):
            raise ValueError("model names must be unique")
        backend_names = [b.name for p in self.pools for b in p.backends]
        if len(set(backend_names)) != len(backend_names):
            raise ValueError("backend names must be unique across pools")
        for pool in self.pools:
            unknown = set(pool.models) - model_names
            if unknown:
                raise ValueError(
                    f"pool {pool.name!r} serves models not listed under models: {sorted(unknown)}"
                )
        for m in self.models:
            strays = [f for f in m.fallbacks if f not in model_names or f == m.name]
            if strays:
                raise ValueError(
                    f"model {m.name!r} falls back to models not listed under models (or itself): {strays}"
                )
        for where, scope in self.limits.scopes():
            unknown = scope.named_models() - model_names
            if unknown:
                raise ValueError(f"{where} names models not listed under models: {sorted(unknown)}")
        for where, scope in self.limits.scopes():
            if scope.priority_class is not None and scope.priority_class not in self.flow.classes:
                raise ValueError(
                    f"{where}.priority_class names the class {scope.priority_class!r}, which flow.classes "
                    f"does not define (defined: {', '.join(self.flow.classes)})"
                )
        for rule in self.routing.rules:
            missing = set(rule.pools) - set(names)
            if missing:
                raise ValueError(f"rule {rule.name!r} names unknown pools: {sorted(missing)}")
        self._auth_has_keys()
        return self

    def _auth_has_keys(self) -> None:
        """Authentication never turns itself off: with an `auth` section, or listening beyond this
        machine, a missing key source is an error. Anonymous serving takes `auth.enabled: false`,
        or a loopback-only gateway without an `auth` section (development)."""
        auth = self.auth
        if auth.enabled is False or auth.jwt.has_keys or (auth.enabled and auth.api_keys.enabled):
            return
        if "auth" in self.model_fields_set:
            why = "the config has an auth section"
        elif not _loopback(self.server.host):
            why = f"server.host {self.server.host} is reachable from other machines"
        else:
            return
        raise ValueError(
            f"auth: authentication has no key source ({why}): set GATEWAY_JWT_SECRET (or auth.jwt.secret), "
            "auth.jwt.public_keys or auth.jwt.jwks_url; to serve every request anonymously, set "
            "auth.enabled: false"
        )

    def model(self, name: str) -> ModelSettings | None:
        for m in self.models:
            if m.name == name:
                return m
        return None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def setting_paths(model: type[BaseModel] | None = None) -> list[str]:
    """Every setting's dotted path, in declaration order: `server.port`, `pools[].backends[].url`
    (`[]`: each entry of a list), `limits.tiers.<name>.budgets[].usd` (`<name>`: a key chosen in the
    config). A field is listed once, where it is first met: another field of the same settings
    class is one setting (`limits.tenants`, a map of the limit sets `limits.tiers` lists), and so
    is a field inherited from a class met before (the engine key source of a pool and of a backend;
    the three limits of a scope and of a scope's model). docs/configuration.md documents these."""
    return _paths(model or Settings, "", set(), set())


def _paths(
    model: type[BaseModel], prefix: str, seen: set[type[BaseModel]], fields: set[tuple[type, str]]
) -> list[str]:
    out: list[str] = []
    for name, field in model.model_fields.items():
        owner = next(c for c in reversed(model.__mro__) if name in getattr(c, "__annotations__", {}))
        if (owner, name) in fields:
            continue  # inherited from a class whose fields are listed already
        fields.add((owner, name))
        section, suffix = _section(field.annotation)
        inner: list[str] = []
        if section is not None and section not in seen:
            seen.add(section)
            inner = _paths(section, f"{prefix}{name}{suffix}.", seen, fields)
        out += inner or [prefix + name]  # a section that adds nothing new is one setting
    return out


def _section(annotation: Any) -> tuple[type[BaseModel] | None, str]:
    """The settings class a field holds (alone, optional, in a list or as a map's values) and the
    path's mark for it (`[]`, `.<name>`); (None, "") for a plain value."""
    origin = get_origin(annotation)
    if origin in (Union, UnionType):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return _section(inner[0]) if len(inner) == 1 else (None, "")
    if origin is list:
        section, suffix = _section(get_args(annotation)[0])
        return (section, "[]" + suffix) if section else (None, "")
    if origin is dict:
        section, suffix = _section(get_args(annotation)[1])
        return (section, ".<name>" + suffix) if section else (None, "")
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation, ""
    return None, ""


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith("GATEWAY_") or "__" not in key:
            continue
        path = key[len("GATEWAY_") :].lower().split("__")
        node = tree
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = yaml.safe_load(raw)
    if environ.get("REDIS_URL"):
        tree.setdefault("redis", {}).setdefault("url", environ["REDIS_URL"])
    if environ.get("GATEWAY_JWT_SECRET"):
        tree.setdefault("auth", {}).setdefault("jwt", {}).setdefault("secret", environ["GATEWAY_JWT_SECRET"])
    return tree


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def parse_settings(
    data: dict[str, Any],
    environ: dict[str, str] | None = None,
    *,
    source: str = "<config>",
    line: Callable[[str], int | None] | None = None,
) -> Settings:
    """Settings from an already-loaded mapping, with environment overrides applied. Removed settings
    are handled as `gateway.removed_settings` says (warnings reported at `source`, at the `line` of
    a dotted key when given); `RemovedSettingError` for one the gateway cannot honour."""
    env = dict(os.environ) if environ is None else environ
    return Settings.model_validate(migrate(_merge(data, _env_overrides(env)), source, line=line))


def diff_settings(old: Settings, new: Settings, limit: int = 100) -> list[str]:
    """The dotted keys whose values differ between two settings (never the values: some are
    secrets), at most `limit` of them."""
    out: list[str] = []
    _diff(old.model_dump(mode="json"), new.model_dump(mode="json"), "", out)
    return out[:limit]


def _diff(a: Any, b: Any, key: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            _diff(a.get(k), b.get(k), f"{key}.{k}" if key else str(k), out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _diff(x, y, f"{key}[{i}]", out)
    elif a != b:
        out.append(key)


class ConfigError(ValueError):
    """A config that cannot be used: `problems` one per error (file, line, key, message); `str()`
    is one line each."""

    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("\n".join(str(p) for p in problems))
        self.problems = problems


def load_settings(path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    """Settings from a YAML file, with environment overrides applied; `ConfigError` when the file
    cannot be read, is not YAML, or does not describe valid settings (gateway/config_errors.py)."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
        data = yaml.safe_load(text) or {}
    except OSError as exc:
        raise ConfigError([Problem(file, None, "", exc.strerror or str(exc))]) from None
    except yaml.YAMLError as exc:
        raise ConfigError([yaml_problem(file, exc)]) from None
    if not isinstance(data, dict):
        raise ConfigError([Problem(file, 1, "", "the top level must be a mapping of sections")])
    try:
        return parse_settings(data, environ, source=file, line=lambda key: key_line(text, key))
    except RemovedSettingError as exc:
        raise ConfigError([Problem(file, key_line(text, exc.key), exc.key, exc.reason)]) from None
    except ValidationError as exc:
        raise ConfigError(problems(file, text, exc, Settings)) from None
