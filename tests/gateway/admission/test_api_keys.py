"""API keys: shown once, stored hashed (in memory and in a real Redis), revoked for good."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from engines.errors import ApiError
from gateway.admission.api_keys import ApiKeyRecord, ApiKeys, ApiKeySpec, MemoryBackend, RedisBackend
from gateway.admission.auth import Authenticator
from gateway.core.redis_client import open_redis
from tests.support import RedisServer

pytestmark = pytest.mark.processes


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


class FlakyBackend(MemoryBackend):
    """A store that can go down: every lookup raises ConnectionError while `down`."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def get(self, digest: str) -> ApiKeyRecord | None:
        if self.down:
            raise ConnectionError("store down")
        return await super().get(digest)


async def test_keys_verified_before_an_outage_keep_working_for_the_grace() -> None:
    now = [0.0]
    backend = FlakyBackend()
    keys = ApiKeys(backend, cache_ttl_s=10, outage_grace_s=600, clock=lambda: now[0])
    _, known = await keys.create(ApiKeySpec(user="svc"))
    _, never_seen = await keys.create(ApiKeySpec(user="other"))
    assert await keys.resolve(known.encode()) is not None  # verified at t=0
    assert await keys.resolve(b"sk-gw-" + b"n" * 43) is None  # the store said: no such key
    backend.down = True
    now[0] = 599.0
    p = await keys.resolve(known.encode())
    assert p is not None and p.user == "svc"
    assert await keys.resolve(b"sk-gw-" + b"n" * 43) is None  # still known to be no key
    with pytest.raises(ConnectionError):
        await keys.resolve(never_seen.encode())  # never verified here: the outage shows
    now[0] = 601.0
    with pytest.raises(ConnectionError):
        await keys.resolve(known.encode())  # past the grace


async def test_a_key_revoked_or_changed_here_is_never_served_from_the_cache() -> None:
    backend = FlakyBackend()
    keys = ApiKeys(backend, cache_ttl_s=10, outage_grace_s=600, clock=lambda: 0.0)
    revoked, revoked_text = await keys.create(ApiKeySpec(user="gone"))
    changed, changed_text = await keys.create(ApiKeySpec(user="narrowed"))
    _, kept_text = await keys.create(ApiKeySpec(user="kept"))
    for text in (revoked_text, changed_text, kept_text):
        assert await keys.resolve(text.encode()) is not None
    assert await keys.revoke(revoked.id)
    assert await keys.update(changed.id, deny_models=("m",)) is not None
    backend.down = True
    with pytest.raises(ConnectionError):
        await keys.resolve(revoked_text.encode())
    with pytest.raises(ConnectionError):
        await keys.resolve(changed_text.encode())
    assert await keys.resolve(kept_text.encode()) is not None  # the others' entries stay
