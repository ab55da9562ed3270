"""The Responses store: owner scoping, TTL and bounds, in memory and on a real redis-server."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from gateway.apis.responses_store import MemoryResponseStore, RedisResponseStore, StoredResponse, owner_of
from gateway.core.context import Principal
from tests.support import RedisServer, until

pytestmark = pytest.mark.processes


def _record(id: str, owner: str = "/alice") -> StoredResponse:
    return StoredResponse(owner, {"id": id, "output": []}, [{"id": "msg_1"}], [{"id": "msg_1"}])


def test_owner_is_tenant_and_user() -> None:
    assert owner_of(Principal("alice", tenant="acme")) == "acme/alice"
    assert owner_of(Principal("alice")) != owner_of(Principal("alice", tenant="acme"))


async def test_memory_store_scopes_expires_and_bounds() -> None:
    now = [0.0]
    store = MemoryResponseStore(ttl_s=10, max_entries=2, clock=lambda: now[0])
    await store.put(_record("a"))
    assert await store.get("/bob", "a") is None  # another principal: as if absent
    assert not await store.delete("/bob", "a")
    got = await store.get("/alice", "a")
    assert got is not None and got.context == [{"id": "msg_1"}]
    await store.put(_record("b"))
    await store.get("/alice", "a")  # a is now the most recently used
    await store.put(_record("c"))
    assert len(store) == 2 and await store.get("/alice", "b") is None
    now[0] = 11.0
    assert await store.get("/alice", "a") is None  # expired
    assert await store.delete("/alice", "c") is False


async def test_redis_store(redis_server: RedisServer) -> None:
    redis = Redis.from_url(redis_server.url)
    try:
        store = RedisResponseStore(redis, ttl_s=0.3)
        await store.put(_record("resp_r1"))
        assert await store.get("/bob", "resp_r1") is None
        got = await store.get("/alice", "resp_r1")
        assert got is not None and got.response == {"id": "resp_r1", "output": []}
        assert 0 < await redis.pttl("gw:resp:resp_r1") <= 300
        assert not await store.delete("/bob", "resp_r1")
        assert await store.get("/alice", "resp_r1") is not None
        assert await store.delete("/alice", "resp_r1")
        assert await store.get("/alice", "resp_r1") is None
        await store.put(_record("resp_r2"))

        async def expired() -> bool:  # its TTL (0.3 s) passes on Redis's clock
            return await store.get("/alice", "resp_r2") is None

        await until(expired, what="the stored response's TTL")
        await redis.set("gw:resp:resp_bad", b"not json")
        assert await store.get("/alice", "resp_bad") is None
    finally:
        await redis.aclose()


@pytest.mark.parametrize("raw", [b"{}", b"[]", b'{"owner": "x"}'])
def test_corrupt_records_read_as_absent(raw: bytes) -> None:
    assert StoredResponse.loads(raw) is None
