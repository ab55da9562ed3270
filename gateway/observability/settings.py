"""Settings of the observability wing: the access log, `GET /metrics` and tracing."""

from __future__ import annotations

from pydantic import Field

from gateway.core.settings import SettingsModel


class AccessLogSettings(SettingsModel):
    enabled: bool = True
    #: include prompt and completion text (off by default: they are the users' data)
    include_text: bool = False


class MetricsSettings(SettingsModel):
    """`GET /metrics` (docs/metrics.md)."""

    #: when set, /metrics answers only requests with `Authorization: Bearer <token>` (401 otherwise)
    bearer_token: str | None = None


class TracingSettings(SettingsModel):
    """OpenTelemetry traces over OTLP/HTTP (docs/tracing.md). Off by default."""

    enabled: bool = False
    #: the OTLP/HTTP traces endpoint, the whole URL (a collector's is `http://HOST:4318/v1/traces`)
    endpoint: str = Field("http://127.0.0.1:4318/v1/traces", pattern=r"^https?://[^\s]+$")
    #: the share of requests without a sampled parent that are traced (0..1); a client's `traceparent`
    #: decides for its own requests (parent-based: its sampled flag is followed)
    sample_ratio: float = Field(1.0, ge=0, le=1)
    #: the `service.name` resource attribute
    service_name: str = Field("llm-gateway", min_length=1, max_length=256)
    #: put the prompt (messages, or the completions prompt) on the request span as
    #: `gen_ai.input.messages`; off by default: prompts are the users' data
    include_prompts: bool = False
    #: extra headers on every export request (a collector's API key, e.g. via
    #: GATEWAY_TRACING__HEADERS='{x-api-key: …}')
    headers: dict[str, str] = Field(default_factory=dict)
