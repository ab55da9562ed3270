"""Admission assembled from settings (gateway/admission.py)."""

from __future__ import annotations

from gateway.admission import Admission
from gateway.limits_redis import WireScript
from gateway.metrics import Metrics
from gateway.redis_client import connect_redis
from gateway.settings import parse_settings
from tests.support import RedisServer


def _settings(redis_url: str) -> object:
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
        admission = Admission(settings, Metrics())  # type: ignore[arg-type]
        redis = connect_redis(settings.redis)  # type: ignore[attr-defined]
        await admission.start(redis)  # type: ignore[arg-type]
        try:
            limiter = admission._redis_limiter
            assert limiter is not None
            assert isinstance(limiter._acquire, WireScript) and isinstance(limiter._finish, WireScript)
        finally:
            await admission.aclose()
            await redis.aclose()
