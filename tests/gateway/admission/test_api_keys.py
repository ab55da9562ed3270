"""API keys: shown once, stored hashed (in memory and in a real Redis), revoked for good."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from engines.errors import ApiError
from gateway.admission.api_keys import ApiKeys, ApiKeySpec, MemoryBackend, RedisBackend
from gateway.admission.auth import Authenticator
from gateway.core.redis_client import open_redis
from tests.support import RedisServer


@pytest.fixture
async def redis(redis_server: RedisServer) -> AsyncIterator[Redis]:
    client = open_redis(redis_server.url)
    await client.delete("gw:{apikeys}:by_digest", "gw:{apikeys}:by_id")
    yield client
    await client.aclose()


async def test_create_resolve_revoke_in_memory() -> None:
    keys = ApiKeys(MemoryBackend())
    record, plaintext = await keys.create(
        ApiKeySpec(user="svc", tenant="acme", roles=("batch",), tier="pro", name="ci")
    )
    assert plaintext.startswith("sk-gw-") and len(plaintext) > 40
    assert plaintext not in repr(record) and record.hint.endswith(plaintext[-4:])
    p = await keys.resolve(plaintext.encode())
    assert p is not None and (p.user, p.tenant, p.roles, p.tier) == (
        "svc",
        "acme",
        frozenset({"batch"}),
        "pro",
    )
    assert [r.id for r in await keys.list()] == [record.id]
    assert await keys.revoke(record.id) is True
    assert await keys.resolve(plaintext.encode()) is None
    assert await keys.revoke(record.id) is False


async def test_redis_stores_only_digests_and_is_shared(redis: Redis) -> None:
    a = ApiKeys(RedisBackend(redis), pepper="pepper-1", cache_ttl_s=0)
    b = ApiKeys(RedisBackend(redis), pepper="pepper-1", cache_ttl_s=0)  # another replica
    record, plaintext = await a.create(ApiKeySpec(user="svc", tier="pro"))
    stored = await redis.hgetall("gw:{apikeys}:by_digest")
    dump = b"".join(k + v for k, v in stored.items())
    assert plaintext.encode() not in dump
    assert hashlib.sha256(plaintext.encode()).hexdigest().encode() not in dump  # peppered
    p = await b.resolve(plaintext.encode())
    assert p is not None and p.user == "svc" and p.tier == "pro"
    assert await a.revoke(record.id)
    assert await b.resolve(plaintext.encode()) is None
    assert await a.list() == []


async def test_another_pepper_cannot_resolve(redis: Redis) -> None:
    a = ApiKeys(RedisBackend(redis), pepper="one")
    _, plaintext = await a.create(ApiKeySpec(user="svc"))
    assert await ApiKeys(RedisBackend(redis), pepper="two").resolve(plaintext.encode()) is None


async def test_authenticator_accepts_keys_and_refuses_unknown_or_revoked() -> None:
    keys = ApiKeys(MemoryBackend())
    record, plaintext = await keys.create(ApiKeySpec(user="svc", roles=("admin",)))
    auth = Authenticator(None, keys)
    p = await auth.authenticate({b"authorization": f"Bearer {plaintext}".encode()})
    assert p.user == "svc" and p.is_admin
    await keys.revoke(record.id)
    with pytest.raises(ApiError) as info:
        await auth.authenticate({b"authorization": f"Bearer {plaintext}".encode()})
    assert info.value.status == 401 and info.value.code == "invalid_api_key"
    assert plaintext[10:-4] not in info.value.message


async def test_redis_down_is_503_not_401(redis_server: RedisServer) -> None:
    dead = open_redis("redis://127.0.0.1:1/0")
    auth = Authenticator(None, ApiKeys(RedisBackend(dead)))
    with pytest.raises(ApiError) as info:
        await auth.authenticate({b"authorization": b"Bearer sk-gw-" + b"x" * 43})
    assert info.value.status == 503
    await dead.aclose()
