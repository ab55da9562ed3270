"""Settings of the observability wing: the access log and `GET /metrics`."""

from __future__ import annotations

from pydantic import Field

from gateway.core.settings import SettingsModel


class AccessLogSettings(SettingsModel):
    enabled: bool = True
    #: include prompt and completion text (off by default: they are the users' data)
    include_text: bool = False


class MetricsSettings(SettingsModel):
    """`GET /metrics` (docs/metrics.md)."""

    #: serve /metrics at all (404 when off)
    enabled: bool = True
    #: when set, /metrics answers only requests with `Authorization: Bearer <token>` (401 otherwise)
    bearer_token: str | None = None
    #: seconds between samples of the fleet gauges (weights, in-flight, health, circuits) in each
    #: worker, and between Redis probes when Redis is configured
    sample_interval_s: float = Field(1.0, gt=0, le=60)
