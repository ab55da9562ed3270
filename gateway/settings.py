"""The gateway's settings: parsed once from YAML (plus environment overrides) into typed objects.

Nothing else in the gateway reads files or environment variables for configuration; every component
receives the part of `Settings` it needs. The reference for every field is docs/configuration.md.

Environment overrides: `GATEWAY_<SECTION>__<FIELD>=value` (double underscore between levels), e.g.
`GATEWAY_SERVER__PORT=9000`, `GATEWAY_REDIS__URL=redis://127.0.0.1:6379/0`. Values are parsed as YAML
scalars, so `true`, `3`, `0.5` get their natural types. `REDIS_URL` and `GATEWAY_JWT_SECRET` are also
honoured as the conventional short forms.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gateway.admission_settings import AuthSettings, LimitsSettings, SanitiseSettings


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ServerSettings(_Model):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    workers: int = Field(1, ge=1, le=64)
    #: seconds in-flight streams may take to finish on shutdown before they are cancelled
    graceful_shutdown_s: float = Field(30.0, ge=0)
    #: largest request body accepted (413 above)
    max_body_bytes: int = Field(4 * 1024 * 1024, ge=1024)
    #: uvicorn keep-alive for client connections
    keepalive_s: float = Field(75.0, gt=0)
    #: largest number of concurrent client connections (503 above); 0 = unlimited
    limit_concurrency: int = Field(0, ge=0)
    #: largest request head (request line + headers), in bytes (431 above; gateway/http_guard.py)
    max_header_bytes: int = Field(64 * 1024, ge=4096, le=16 * 1024 * 1024)
    #: a request head must be complete this many seconds after the connection opened, or after its
    #: first byte on a kept-alive connection (408 and close otherwise: slow-header attacks)
    header_timeout_s: float = Field(10.0, gt=0)
    #: log level of the gateway's own logger
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class TimeoutSettings(_Model):
    connect_s: float = Field(2.0, gt=0)
    #: until the engine's status line and, for streams, its first event
    first_byte_s: float = Field(60.0, gt=0)
    #: longest silence between two streamed chunks
    idle_s: float = Field(30.0, gt=0)
    #: a whole non-streamed answer
    total_s: float = Field(600.0, gt=0)


class RetrySettings(_Model):
    #: attempts per request, the first included (failover happens only before the first byte)
    max_attempts: int = Field(3, ge=1, le=10)
    #: retries allowed as a fraction of recent requests (a retry budget against retry storms)
    budget_ratio: float = Field(0.2, ge=0, le=1)
    #: retries always allowed per second even when the budget is spent
    budget_min_per_s: float = Field(5.0, ge=0)


class HealthSettings(_Model):
    #: seconds between active probes of each backend's health path
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(3.0, gt=0)
    #: consecutive failures (probes or requests) that open a backend's circuit
    failure_threshold: int = Field(3, ge=1)
    #: seconds a circuit stays open before one trial request is let through
    open_s: float = Field(10.0, gt=0)


class UpstreamSettings(_Model):
    timeouts: TimeoutSettings = TimeoutSettings()
    retries: RetrySettings = RetrySettings()
    health: HealthSettings = HealthSettings()
    #: the HTTP client for the engines (`TRANSPORTS` in gateway/app.py)
    client: Literal["h1", "aiohttp"] = "h1"
    #: h1: idle keep-alive connections kept per backend; aiohttp: concurrent connections per backend
    max_connections_per_backend: int = Field(1024, ge=1)
    keepalive_s: float = Field(30.0, gt=0)


class BackendSettings(_Model):
    #: an opaque name shown to operators; never shown to clients
    name: str
    url: str

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("backend url must start with http:// or https://")
        return v.rstrip("/")


class PoolSettings(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]{1,64}$")
    dialect: Literal["vllm", "sglang"]
    weight: float = Field(1.0, ge=0)
    #: public model name -> the name the engines of this pool serve it under
    models: dict[str, str]
    #: the engines run a tool-call parser (tool requests may go here)
    tool_calling: bool = True
    #: the engines support response_format / structured output
    structured_output: bool = True
    backends: list[BackendSettings] = Field(default_factory=list)


class ModelSettings(_Model):
    #: the public name clients use
    name: str
    context_length: int = Field(8192, ge=16)
    owned_by: str = "gateway"
    #: max_tokens assumed when the request sets none (for token accounting)
    default_max_tokens: int = Field(1024, ge=1)


class RuleSettings(_Model):
    """A pool rule: the first rule whose conditions all hold narrows the candidate pools."""

    name: str
    pools: list[str]
    min_prompt_tokens: int | None = None
    has_tools: bool | None = None
    structured_output: bool | None = None


class RoutingSettings(_Model):
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


class RedisSettings(_Model):
    """Where the shared state lives (limits, API keys, fleet overrides). `gateway/redis_client.py`
    turns this into a client; docs/operations.md ("Redis in production") explains the modes."""

    mode: Literal["standalone", "sentinel", "cluster"] = "standalone"
    #: standalone: the server, `redis://[user:password@]host:port/db`, `rediss://…` (TLS) or
    #: `unix://path`; cluster: one seed node (an alternative to `nodes`); not used by sentinel
    url: str | None = None
    #: sentinel: the Sentinel processes, "host:port" each
    sentinels: list[str] = Field(default_factory=list)
    #: sentinel: the name of the monitored master (`sentinel monitor <name> …`)
    service_name: str | None = None
    #: sentinel: the Sentinels' own password, when they require one (`requirepass` in sentinel.conf)
    sentinel_password: str | None = None
    #: cluster: seed nodes, "host:port" each; any reachable one reveals the rest
    nodes: list[str] = Field(default_factory=list)
    #: ACL user and password (or put them in `url`); `GATEWAY_REDIS__PASSWORD` keeps it out of files
    username: str | None = None
    password: str | None = None
    #: database number (sentinel; standalone takes it from the url; cluster has only 0)
    db: int = Field(0, ge=0)
    #: TLS for sentinel and cluster (standalone: use a `rediss://` url); files are PEM
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    #: connect and read timeout of every command: the request path never waits longer on Redis
    #: (1 s: a burst on a small, busy machine can take Redis half a second to answer)
    timeout_s: float = Field(1.0, gt=0)
    #: connections per process (per node in cluster mode)
    max_connections: int = Field(64, ge=1)
    #: standalone: how long a command waits for a free pooled connection before failing
    pool_wait_s: float = Field(2.0, gt=0)

    @model_validator(mode="after")
    def _mode_fields(self) -> RedisSettings:
        if self.mode == "sentinel":
            if not self.sentinels or not self.service_name:
                raise ValueError("redis.mode sentinel needs redis.sentinels and redis.service_name")
            if self.url is not None:
                raise ValueError(
                    "redis.url is not used in sentinel mode (unset REDIS_URL; use redis.sentinels)"
                )
        if self.mode == "cluster":
            if not self.nodes and self.url is None:
                raise ValueError("redis.mode cluster needs redis.nodes (or one seed in redis.url)")
            if self.db != 0:
                raise ValueError("Redis Cluster has only database 0")
        if self.mode != "sentinel" and (self.sentinels or self.service_name or self.sentinel_password):
            raise ValueError("redis.sentinels / service_name / sentinel_password need redis.mode: sentinel")
        if self.mode != "cluster" and self.nodes:
            raise ValueError("redis.nodes needs redis.mode: cluster")
        if self.mode == "standalone" and self.tls and self.url and not self.url.startswith("rediss://"):
            raise ValueError("standalone TLS: use a rediss:// url")
        for addr in (*self.sentinels, *self.nodes):
            host, sep, port = addr.rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"redis address {addr!r} is not host:port")
        return self

    @property
    def configured(self) -> bool:
        """True when a shared Redis is configured; False: this process keeps its state in memory."""
        if self.mode == "sentinel":
            return True
        if self.mode == "cluster":
            return bool(self.nodes or self.url)
        return self.url is not None


class AccessLogSettings(_Model):
    enabled: bool = True
    #: include prompt and completion text (off by default: they are the users' data)
    include_text: bool = False


class MetricsSettings(_Model):
    """`GET /metrics` (docs/metrics.md)."""

    #: serve /metrics at all (404 when off)
    enabled: bool = True
    #: when set, /metrics answers only requests with `Authorization: Bearer <token>` (401 otherwise)
    bearer_token: str | None = None
    #: seconds between samples of the fleet gauges (weights, in-flight, health, circuits) in each
    #: worker, and between Redis probes when Redis is configured
    sample_interval_s: float = Field(1.0, gt=0, le=60)


class Settings(_Model):
    server: ServerSettings = ServerSettings()
    upstream: UpstreamSettings = UpstreamSettings()
    models: list[ModelSettings]
    pools: list[PoolSettings]
    routing: RoutingSettings = RoutingSettings()
    redis: RedisSettings = RedisSettings()
    access_log: AccessLogSettings = AccessLogSettings()
    metrics: MetricsSettings = MetricsSettings()
    auth: AuthSettings = AuthSettings()
    limits: LimitsSettings = LimitsSettings()
    sanitise: SanitiseSettings = SanitiseSettings()

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
        for rule in self.routing.rules:
            missing = set(rule.pools) - set(names)
            if missing:
                raise ValueError(f"rule {rule.name!r} names unknown pools: {sorted(missing)}")
        return self

    def model(self, name: str) -> ModelSettings | None:
        for m in self.models:
            if m.name == name:
                return m
        return None


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


def parse_settings(data: dict[str, Any], environ: dict[str, str] | None = None) -> Settings:
    """Settings from an already-loaded mapping, with environment overrides applied."""
    env = dict(os.environ) if environ is None else environ
    return Settings.model_validate(_merge(data, _env_overrides(env)))


def load_settings(path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    """Settings from a YAML file, with environment overrides applied."""
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the top level must be a mapping")
    return parse_settings(data, environ)
