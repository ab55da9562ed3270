"""Admission assembled from settings (gateway/admission/assembly.py)."""

from __future__ import annotations

import pytest

from gateway.admission.assembly import Admission
from gateway.admission.limits_redis import WireScript
from gateway.core.redis_client import connect_redis
from gateway.observability.metrics import Metrics
from gateway.settings import Settings, parse_settings
from tests.support import RedisServer

pytestmark = pytest.mark.processes


def _settings(redis_url: str) -> Settings:
    return parse_settings(
        {
            "models": [{"name": "m"}],
            "pools": [{"name": "p", "dialect": "vllm", "models": {"m": "m"}, "backends": []}],
            "redis": {"url": redis_url},
            "limits": {"tiers": {"default": {"requests_per_minute": 10}}},
        },
        environ={},
    )


async def test_standalone_redis_limiter_uses_the_pipelining_connection() -> None:
    with RedisServer() as server:
        settings = _settings(server.url)
        s = settings
        admission = Admission(s.auth, s.limits, s.sanitise, s.redis, Metrics())
        redis = connect_redis(settings.redis)
        await admission.start(redis)  # type: ignore[arg-type]
        try:
            limiter = admission._redis_limiter
            assert limiter is not None
            assert isinstance(limiter._acquire, WireScript) and isinstance(limiter._finish, WireScript)
        finally:
            await admission.aclose()
            await redis.aclose()
