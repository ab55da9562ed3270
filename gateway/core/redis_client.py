"""The one Redis client of a gateway process (limits, API keys, shared admin state).

Tuned for a request path that must never hang on Redis: short connect and read timeouts, and a
single immediate retry on a broken connection only (after a Redis restart every pooled connection
is dead; the retry reconnects, and the command had not reached the new server). Timeouts are not
retried: a script that may have run must not run twice. The pool blocks (up to `POOL_WAIT_S`)
rather than failing when every connection is busy, so a burst is never mistaken for an outage.

`connect_redis(settings.redis)` picks the client by `redis.mode` (docs/operations.md):

    standalone  open_redis(url): one server (redis://, rediss:// for TLS, unix://)
    sentinel    a Redis whose pool asks the Sentinels for the current master, and asks again after a
                failover (a connection to a demoted master fails once, then the next goes to the new one)
    cluster     a RedisCluster: commands go to the slot's node; every key a gateway script touches
                at once carries one hash tag (`{fleet}`, `{t:tenant}`), so scripts stay single-slot

All three open their connections lazily: constructing a client never blocks or fails on the network.
"""

from __future__ import annotations

from typing import Any, TypeAlias

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from gateway.core.settings import RedisSettings

#: what `connect_redis` returns; both speak the same command API (scripts, pipelines, pub/sub)
RedisClient: TypeAlias = Redis | RedisCluster

#: connections per process (per node in cluster mode): a request makes one or two pipelined round
#: trips, so 64 in flight outlast any one process's request rate
MAX_CONNECTIONS = 64
#: a command waits this long for a free pooled connection before failing: a burst queues briefly
#: instead of passing for an outage
POOL_WAIT_S = 2.0
#: connect and read timeout of every command: the request path never waits longer on Redis, and a
#: burst on a small, busy machine (which can take Redis half a second to answer) is not an outage
TIMEOUT_S = 1.0


def open_redis(
    url: str,
    *,
    timeout_s: float = TIMEOUT_S,
    max_connections: int = MAX_CONNECTIONS,
    pool_wait_s: float = POOL_WAIT_S,
) -> Redis:
    """A client for `url` (`redis://`, `rediss://`, `unix://`). Connections open lazily."""
    pool = BlockingConnectionPool.from_url(
        url,
        max_connections=max_connections,
        timeout=pool_wait_s,
        socket_timeout=timeout_s,
        socket_connect_timeout=max(timeout_s, 1.0),
        retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
        health_check_interval=0,
    )
    return Redis(connection_pool=pool)


def _address(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)


def _tls_kwargs(settings: RedisSettings) -> dict[str, Any]:
    if not settings.tls:
        return {}
    return {
        "ssl": True,
        "ssl_ca_certs": settings.tls_ca_file,
        "ssl_certfile": settings.tls_cert_file,
        "ssl_keyfile": settings.tls_key_file,
    }


def connect_redis(settings: RedisSettings) -> RedisClient:
    """The client for `settings` (its `configured` must be true). Same timeouts in every mode: a
    command waits at most `TIMEOUT_S` for an answer; a broken connection is retried once, a timeout
    never (a script that may have run must not run twice)."""
    if not settings.configured:
        raise ValueError("no Redis configured (redis.url, redis.sentinels or redis.nodes)")
    timeouts: dict[str, Any] = {"socket_timeout": TIMEOUT_S, "socket_connect_timeout": TIMEOUT_S}
    auth: dict[str, Any] = {}
    if settings.username is not None:
        auth["username"] = settings.username
    if settings.password is not None:
        auth["password"] = settings.password
    if settings.mode == "sentinel":
        sentinel_kwargs: dict[str, Any] = {**timeouts, **_tls_kwargs(settings)}
        if settings.sentinel_password is not None:
            sentinel_kwargs["password"] = settings.sentinel_password
        sentinel = Sentinel(  # type: ignore[no-untyped-call]
            [_address(a) for a in settings.sentinels],
            sentinel_kwargs=sentinel_kwargs,
            db=0,  # standalone takes its database from the url; sentinel and cluster use 0
            retry=Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            health_check_interval=0,
            max_connections=MAX_CONNECTIONS,
            **timeouts,
            **auth,
            **_tls_kwargs(settings),
        )
        assert settings.service_name is not None  # checked by RedisSettings
        master: Redis = sentinel.master_for(settings.service_name, redis_class=Redis)
        return master
    if settings.mode == "cluster":
        seeds = [_address(a) for a in settings.nodes]
        if settings.url is not None:
            return RedisCluster.from_url(settings.url, max_connections=MAX_CONNECTIONS, **timeouts, **auth)
        return RedisCluster(
            startup_nodes=[ClusterNode(host, port) for host, port in seeds],
            max_connections=MAX_CONNECTIONS,
            **timeouts,
            **auth,
            **_tls_kwargs(settings),
        )
    assert settings.url is not None
    client = open_redis(settings.url)
    if auth:
        client.connection_pool.connection_kwargs.update(auth)
    return client


def describe(settings: RedisSettings) -> str:
    """Where the shared state is, for the start-up log: never a password."""
    if not settings.configured:
        return "none (this process only)"
    if settings.mode == "sentinel":
        return f"sentinel {settings.service_name} via {','.join(settings.sentinels)}"
    if settings.mode == "cluster":
        seeds = settings.nodes or [_strip_credentials(settings.url or "")]
        return f"cluster via {','.join(seeds)}"
    return f"standalone {_strip_credentials(settings.url or '')}"


def _strip_credentials(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest.split("/", 1)[0]:
        return url
    return f"{scheme}://***@{rest.split('@', 1)[1]}"
