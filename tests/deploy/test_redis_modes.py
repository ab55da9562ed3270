"""`redis.mode` standalone / sentinel / cluster: settings validation, and `connect_redis` against real
servers — a plain redis-server, a Sentinel-managed master that fails over, and a 3-master Cluster.
The shared fleet state (gateway/control/store.py) runs unchanged on each."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisClusterException, RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from engines.sim.launcher import SimProcess
from gateway.admission.tokens import mint_token
from gateway.control.store import Overrides, RedisStore, audit_entry
from gateway.core.redis_client import TIMEOUT_S, RedisClient, connect_redis, describe
from gateway.demo import SERVED
from gateway.settings import RedisSettings, parse_settings
from tests.conftest import fast_sim
from tests.deploy.redis_topologies import ClusterSetup, SentinelSetup, _Processes
from tests.support import HTTP, WAIT_S, GatewayProcess, Recorder, RedisServer, free_port, until

pytestmark = pytest.mark.processes

# ------------------------------------------------------------------ settings


def test_default_is_no_redis() -> None:
    s = RedisSettings()
    assert s.mode == "standalone" and not s.configured
    assert describe(s) == "none (this process only)"
    with pytest.raises(ValueError):
        connect_redis(s)


@pytest.mark.parametrize(
    "fields",
    [
        {"mode": "sentinel"},
        {"mode": "sentinel", "sentinels": ["s1:26379"]},
        {"mode": "sentinel", "service_name": "m"},
        {"mode": "sentinel", "sentinels": ["s1:26379"], "service_name": "m", "url": "redis://x:6379"},
        {"mode": "sentinel", "sentinels": ["s1"], "service_name": "m"},
        {"mode": "cluster"},
        {"mode": "cluster", "nodes": ["n1:port"]},
        {"mode": "standalone", "nodes": ["n1:6379"]},
        {"mode": "standalone", "sentinels": ["s1:26379"], "url": "redis://x:6379"},
        {"mode": "standalone", "url": "redis://x:6379", "tls": True},
        {"mode": "replicated"},
    ],
)
def test_inconsistent_redis_settings_are_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RedisSettings(**fields)


def test_modes_from_yaml_and_environment() -> None:
    base: dict[str, Any] = {"models": [], "pools": []}
    s = parse_settings(
        base,
        {
            "GATEWAY_REDIS__MODE": "sentinel",
            "GATEWAY_REDIS__SENTINELS": "[s1:26379, s2:26379, s3:26379]",
            "GATEWAY_REDIS__SERVICE_NAME": "gateway",
            "GATEWAY_REDIS__PASSWORD": "hunter2",
        },
    ).redis
    assert s.configured and s.sentinels == ["s1:26379", "s2:26379", "s3:26379"]
    assert s.password == "hunter2"
    assert "hunter2" not in describe(s) and "s3:26379" in describe(s)

    c = parse_settings({**base, "redis": {"mode": "cluster", "nodes": ["n1:6379", "n2:6379"]}}, {}).redis
    assert c.configured and describe(c) == "cluster via n1:6379,n2:6379"
    # REDIS_URL is a standalone URL: with sentinel mode it is refused, not silently ignored
    with pytest.raises(ValidationError):
        parse_settings(
            {**base, "redis": {"mode": "sentinel", "sentinels": ["s:1"], "service_name": "m"}},
            {"REDIS_URL": "redis://x:6379/0"},
        )


def test_describe_never_shows_a_password() -> None:
    s = RedisSettings(url="rediss://gw:s3cret@redis.example:6380/2")
    assert describe(s) == "standalone rediss://***@redis.example:6380/2"


def test_cluster_client_construction_is_lazy() -> None:
    # no server anywhere: constructing must not touch the network
    c = connect_redis(RedisSettings(mode="cluster", nodes=["127.0.0.1:1", "[::1]:2"], password="pw"))
    assert isinstance(c, RedisCluster)
    assert [(n.host, n.port) for n in c.nodes_manager.startup_nodes.values()] == [
        ("127.0.0.1", 1),
        ("::1", 2),
    ]
    s = connect_redis(RedisSettings(mode="sentinel", sentinels=["127.0.0.1:1"], service_name="m"))
    assert isinstance(s, Redis)
    assert s.connection_pool.connection_kwargs["db"] == 0
    assert s.connection_pool.connection_kwargs["socket_timeout"] == TIMEOUT_S


# ------------------------------------------------------------------ helpers


async def _shared_state_roundtrip(a: RedisClient, b: RedisClient) -> None:
    """Two replicas' fleet stores on the same Redis: a change made through one reaches the other
    (pub/sub, or the version poll)."""
    seen: Recorder[Overrides] = Recorder()
    store_a, store_b = RedisStore(a, poll_s=0.2), RedisStore(b, poll_s=0.2)  # type: ignore[arg-type]
    await store_a.start(lambda o: None)
    await store_b.start(seen)
    try:
        weight = round(time.time() % 1, 3)
        await store_a.change({"weight:vllm": weight}, [], audit_entry("test", "weight", "vllm", None, weight))
        await seen.wait_for(lambda seen: bool(seen) and seen[-1].weights.get("vllm") == weight)
        assert (await store_b.audit(1))[0]["after"] == weight
    finally:
        await store_a.stop()
        await store_b.stop()


# A multi-key script like the limiter's: every key of one call shares a hash tag (one slot).
_SCRIPT = "redis.call('INCRBY', KEYS[1], ARGV[1]); return redis.call('INCRBY', KEYS[2], ARGV[1])"


# ------------------------------------------------------------------ standalone


@pytest.fixture
async def standalone(redis_server: RedisServer) -> AsyncIterator[RedisClient]:
    client = connect_redis(RedisSettings(url=redis_server.url))
    yield client
    await client.flushdb()
    await client.aclose()


async def test_standalone(standalone: RedisClient) -> None:
    await standalone.set("gw:test", "1")
    assert await standalone.get("gw:test") == b"1"
    script = standalone.register_script(_SCRIPT)
    assert await script(keys=["gw:{u}:a", "gw:{u}:b"], args=[2]) == 2
    await _shared_state_roundtrip(
        standalone, connect_redis(RedisSettings(url=str(standalone_url(standalone))))
    )


def standalone_url(client: RedisClient) -> str:
    kw = client.connection_pool.connection_kwargs  # type: ignore[union-attr]
    return f"redis://{kw['host']}:{kw['port']}/{kw.get('db', 0)}"


@pytest.fixture(scope="module")
def password_redis() -> Iterator[int]:
    procs = _Processes()
    port = free_port()
    procs.server(port, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--requirepass", "pw1")
    yield port
    procs.stop()


async def test_password_from_the_field_or_the_url(password_redis: int) -> None:
    url = f"redis://127.0.0.1:{password_redis}/0"
    refused = connect_redis(RedisSettings(url=url))
    with pytest.raises(RedisError):
        await refused.ping()
    for settings in (
        RedisSettings(url=url, password="pw1"),
        RedisSettings(url=f"redis://:pw1@127.0.0.1:{password_redis}/0"),
    ):
        client = connect_redis(settings)
        assert await client.ping()
        await client.aclose()
    await refused.aclose()


# ------------------------------------------------------------------ sentinel


@pytest.fixture(scope="module")
def sentinel_setup() -> Iterator[SentinelSetup]:
    with SentinelSetup() as setup:
        yield setup


async def test_sentinel_follows_a_failover(sentinel_setup: SentinelSetup) -> None:
    settings = RedisSettings(
        mode="sentinel", sentinels=sentinel_setup.sentinels, service_name=sentinel_setup.service_name
    )
    client = connect_redis(settings)
    other = connect_redis(settings)
    try:
        await client.set("gw:before", "1")
        await _shared_state_roundtrip(client, other)
        assert await client.wait(1, 2000) == 1  # replicated before the master dies
        sentinel_setup.kill(sentinel_setup.master_port)

        async def written() -> bool:  # the gateway's callers see errors for the failover's duration
            try:
                await client.set("gw:after", "1")
            except (RedisError, OSError):
                return False
            return True

        await until(written, what="a new master")
        assert await client.get("gw:before") == b"1"
        info = await client.info("replication")
        assert info["role"] == "master"
        assert client.connection_pool.connection_kwargs.get("port", None) != sentinel_setup.master_port
    finally:
        await client.aclose()
        await other.aclose()


# ------------------------------------------------------------------ cluster


@pytest.fixture(scope="module")
def cluster_setup() -> Iterator[ClusterSetup]:
    with ClusterSetup() as setup:
        yield setup


async def test_cluster(cluster_setup: ClusterSetup) -> None:
    client = connect_redis(RedisSettings(mode="cluster", nodes=cluster_setup.nodes[:1]))
    other = connect_redis(RedisSettings(mode="cluster", url=f"redis://{cluster_setup.nodes[2]}"))
    assert isinstance(client, RedisCluster) and isinstance(other, RedisCluster)
    try:
        # keys spread over all three masters, each reachable through one seed node
        for i in range(30):
            await client.set(f"gw:spread:{i}", i)
        owners = {client.get_node_from_key(f"gw:spread:{i}").port for i in range(30)}
        assert len(owners) == 3
        assert await other.get("gw:spread:17") == b"17"
        # a multi-key script is fine when its keys share a hash tag …
        script = client.register_script(_SCRIPT)
        assert await script(keys=["gw:rl:{t:acme}:u:a", "gw:rl:{t:acme}:t"], args=[3]) == 3
        # … and refused when they do not (why every gateway script tags its keys)
        with pytest.raises((RedisError, RedisClusterException)):
            await script(keys=["gw:rl:{t:acme}:x", "gw:rl:{t:other}:x"], args=[1])
        await _shared_state_roundtrip(client, other)
    finally:
        await client.aclose()
        await other.aclose()


# ------------------------------------------------------------------ a whole gateway on each mode


SECRET = "redis-modes-secret-" + "r" * 40


def _gateway_on(redis: dict[str, Any], sim_url: str) -> GatewayProcess:
    config: dict[str, Any] = {
        "server": {"graceful_shutdown_s": 2},
        "models": [{"name": "m"}],
        "pools": [
            {
                "name": "vllm",
                "dialect": "vllm",
                "models": {"m": SERVED["vllm"]},
                "backends": [{"name": "vllm-0", "url": sim_url}],
            }
        ],
        "upstream": {"health": {"interval_s": 0.5}},
        "auth": {"jwt": {"secret": SECRET}},
        "limits": {"tiers": {"default": {"requests_per_minute": 2}}},
        "redis": redis,
    }
    return GatewayProcess(config)


def _exercise(gw: GatewayProcess, expect_log: str) -> None:
    """Limits and admin state through the configured mode, and the start-up log says which."""
    user = {"authorization": "Bearer " + mint_token(SECRET, f"u{time.time_ns()}")}
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    codes = [
        HTTP.post(gw.base_url + "/v1/chat/completions", json=body, headers=user, timeout=10).status_code
        for _ in range(3)
    ]
    assert codes == [200, 200, 429]
    admin = {"authorization": "Bearer " + mint_token(SECRET, "ops", roles=["admin"])}
    r = HTTP.put(gw.base_url + "/admin/pools/vllm/weight", json={"weight": 0.25}, headers=admin, timeout=10)
    assert (r.json()["ok"], r.json()["shared"], r.json()["persisted"]) == (True, True, True)
    assert expect_log in gw.log()


@pytest.fixture(scope="module")
def sim() -> Iterator[SimProcess]:
    with fast_sim("vllm") as s:
        yield s


def test_gateway_on_sentinel(sentinel_setup: SentinelSetup, sim: SimProcess) -> None:
    redis = {
        "mode": "sentinel",
        "sentinels": sentinel_setup.sentinels,
        "service_name": sentinel_setup.service_name,
    }
    with _gateway_on(redis, sim.base_url) as gw:
        _exercise(gw, f"shared state: sentinel {sentinel_setup.service_name} via")


def test_gateway_on_cluster(cluster_setup: ClusterSetup, sim: SimProcess) -> None:
    with _gateway_on({"mode": "cluster", "nodes": cluster_setup.nodes[1:]}, sim.base_url) as gw:
        _exercise(gw, "shared state: cluster via")


async def _started(store: RedisStore) -> None:
    """The store started; a first connect that outlasts the client's 1 s timeout (a loaded machine)
    is tried again: what the test is about is the stop."""
    for attempt in range(3):
        try:
            await store.start(lambda o: None)
            return
        except RedisTimeoutError:
            if attempt == 2:
                raise


async def test_stores_on_a_cluster_stop_promptly_every_time(cluster_setup: ClusterSetup) -> None:
    """redis-py's cluster pub/sub swallows a cancel now and then (about one stop in ten, reproduced):
    the stores' tasks must still end, within the stop, every time — else shutdown (or a test's event
    loop) waits for ever."""
    for i in range(20):
        a = connect_redis(RedisSettings(mode="cluster", nodes=cluster_setup.nodes[:1]))
        b = connect_redis(RedisSettings(mode="cluster", url=f"redis://{cluster_setup.nodes[2]}"))
        store_a, store_b = RedisStore(a, poll_s=0.2), RedisStore(b, poll_s=0.2)  # type: ignore[arg-type]
        await _started(store_a)
        await _started(store_b)
        tasks = [*store_a._tasks, *store_b._tasks]
        await store_a.change({"weight:vllm": i}, [], audit_entry("test", "weight", "vllm", None, i))
        await asyncio.sleep(0.05 * (i % 4))  # the stop meets the 0.2 s poll at another point each time
        async with asyncio.timeout(WAIT_S):  # a stop that hangs fails here
            await store_a.stop()
            await store_b.stop()
        assert all(t.done() for t in tasks), f"stop {i} left tasks running"
        await a.aclose()
        await b.aclose()
