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
    #: attempts per request, the first included (failover happens only before the first byte);
    #: retries are also held to a budget against retry storms (gateway/upstream/retry.py)
    max_attempts: int = Field(3, ge=1, le=10)


class UpstreamSettings(SettingsModel):
    timeouts: TimeoutSettings = TimeoutSettings()
    retries: RetrySettings = RetrySettings()
    health: HealthSettings = HealthSettings()
