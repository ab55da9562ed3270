"""Settings of the upstream wing: timeouts, retries, health checks and the connection pool to the engines."""

from __future__ import annotations

from pydantic import Field

from gateway.core.settings import HealthSettings, SettingsModel


class TimeoutSettings(SettingsModel):
    #: until the engine's status line and, for streams, its first event
    first_byte_s: float = Field(60.0, gt=0)
    #: longest silence between two streamed chunks
    idle_s: float = Field(30.0, gt=0)
    #: a whole non-streamed answer
    total_s: float = Field(600.0, gt=0)


class RetrySettings(SettingsModel):
    #: attempts per request, the first included (failover happens only before the first byte)
    max_attempts: int = Field(3, ge=1, le=10)
    #: retries allowed as a fraction of recent requests (a retry budget against retry storms)
    budget_ratio: float = Field(0.2, ge=0, le=1)
    #: retries always allowed per second even when the budget is spent
    budget_min_per_s: float = Field(5.0, ge=0)


class UpstreamSettings(SettingsModel):
    timeouts: TimeoutSettings = TimeoutSettings()
    retries: RetrySettings = RetrySettings()
    health: HealthSettings = HealthSettings()
