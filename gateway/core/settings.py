"""Settings types every wing shares: the models, the pools and their backends, health checking, Redis.

Each wing keeps the settings only it reads beside its code (`gateway/<wing>/settings.py`); the root's
`gateway/settings.py` composes them into `Settings` and is the one place that reads files and the
environment. The reference for every field is docs/configuration.md.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from policies.budgets import Price


class SettingsModel(BaseModel):
    """The base of every settings section: unknown keys are errors, values are immutable (a key
    that was a setting once is handled before validation: gateway/removed_settings.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class KvEventsSettings(SettingsModel):
    """Where a backend's engine publishes its KV-cache events (its `--kv-events-config`)."""

    #: the engine's ZMQ PUB address to connect to, e.g. `tcp://vllm-0:5557` (the engine binds `tcp://*:5557`)
    endpoint: str = Field(pattern=r"^(tcp|ipc)://.+")
    #: the engine's `topic` (subscribed as a prefix; "" takes every topic)
    topic: str = ""
    #: the engine's `replay_endpoint` (vLLM): lost or missed batches are asked for there
    replay_endpoint: str | None = Field(None, pattern=r"^(tcp|ipc)://.+")


class EngineKeySource(SettingsModel):
    """Where the bearer key of engines started with `--api-key` comes from: an environment variable
    or a mounted secret file, never the YAML itself (gateway/upstream/credentials.py)."""

    #: the name of an environment variable holding the key
    api_key_env: str | None = Field(None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    #: a file holding the key (a mounted Kubernetes or Docker secret); surrounding whitespace is dropped
    api_key_file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> EngineKeySource:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise ValueError("give the engines' key as api_key_env or api_key_file, not both")
        return self

    @property
    def has_key(self) -> bool:
        return self.api_key_env is not None or self.api_key_file is not None


class BackendSettings(EngineKeySource):
    #: an opaque name shown to operators; never shown to clients
    name: str
    url: str
    #: the engine's KV-cache events, for routing by what it holds (docs/routing.md, *KV events*)
    kv_events: KvEventsSettings | None = None

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("backend url must start with http:// or https://")
        return v.rstrip("/")


class PoolSettings(EngineKeySource):
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
    #: ask each backend without `kv_events` for its publisher (vLLM's `GET /kv_event_sources`)
    kv_event_discovery: bool = False


class PriceSettings(SettingsModel):
    """A model's prices in USD per million tokens (how providers quote them), for money budgets and
    `gateway_spend_usd_total`. Cached prompt tokens cost `prompt` unless `cached_prompt` is set."""

    prompt: float = Field(ge=0, le=1_000_000)
    completion: float = Field(ge=0, le=1_000_000)
    cached_prompt: float | None = Field(None, ge=0, le=1_000_000)

    @model_validator(mode="after")
    def _exact(self) -> PriceSettings:
        self.price()  # more than six decimals is an error, not a silent rounding
        return self

    def price(self) -> Price:
        return Price.per_million(self.prompt, self.completion, self.cached_prompt)


class ModelSettings(SettingsModel):
    #: the public name clients use
    name: str
    context_length: int = Field(8192, ge=16)
    #: max_tokens assumed when the request sets none (for token accounting)
    default_max_tokens: int = Field(1024, ge=1)
    #: the most output tokens anyone's request may ask of this model (`limits.over_max_tokens`)
    max_tokens: int | None = Field(None, ge=1)
    #: what the model does: `generate` (chat, completions, responses, messages), `embed`
    #: (/v1/embeddings), `score` (a cross-encoder: /v1/rerank, /v1/score) or `transcribe` (speech
    #: to text: /v1/audio/*); the other endpoints answer it with a 400 (/tokenize and /detokenize
    #: take every model)
    task: Literal["generate", "embed", "score", "transcribe"] = "generate"
    #: USD per million tokens; absent: the model costs nothing against money budgets
    price: PriceSettings | None = None
    #: the model's tokenizer for KV-event routing: a directory with `tokenizer.json` and
    #: `tokenizer_config.json` (its chat template), or `sim` for the simulators'; None: not tokenized
    tokenizer: str | None = None
    #: models tried, in order, when none of this model's backends can take a request or all fail
    #: before the answer starts (never once a byte went to the client)
    fallbacks: list[str] = Field(default_factory=list)


class HealthSettings(SettingsModel):
    #: seconds between active probes of each backend's health path
    interval_s: float = Field(5.0, gt=0)
    timeout_s: float = Field(3.0, gt=0)
    #: consecutive failures (probes or requests) that open a backend's circuit
    failure_threshold: int = Field(3, ge=1)
    #: seconds a circuit stays open before one trial request is let through
    open_s: float = Field(10.0, gt=0)


class RedisSettings(SettingsModel):
    """Where the shared state lives (limits, API keys, fleet overrides). `gateway/core/redis_client.py`
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
    #: TLS for sentinel and cluster (standalone: use a `rediss://` url); files are PEM
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @model_validator(mode="after")
    def _mode_fields(self) -> RedisSettings:
        if self.mode == "sentinel":
            if not self.sentinels or not self.service_name:
                raise ValueError("redis.mode sentinel needs redis.sentinels and redis.service_name")
            if self.url is not None:
                raise ValueError(
                    "redis.url is not used in sentinel mode (unset REDIS_URL; use redis.sentinels)"
                )
        if self.mode == "cluster" and not self.nodes and self.url is None:
            raise ValueError("redis.mode cluster needs redis.nodes (or one seed in redis.url)")
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
