"""The gauges that describe state rather than events, sampled in every worker process.

Pool weights, in-flight counts, backend health and circuit states live in the `Fleet` of each worker.
A scrape reaches one worker only, so sampling them when a scrape arrives would leave the other
workers' gauges as old as their last scrape; instead every worker samples its fleet every
`SAMPLE_INTERVAL_S` (and once more when it answers a scrape). Gauge values are therefore at most a
second old; the multiprocess merge then combines the workers' values (gateway/observability/metrics.py).

When Redis is configured, the same loop PINGs it: the round trip goes to
`gateway_redis_latency_seconds{op="ping"}`, a failure to `gateway_redis_failures_total{op="ping"}`,
and `gateway_redis_up` tells whether the last probe answered — so "Redis unreachable" is known even
when no request needs Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from redis.exceptions import RedisError

from gateway.core.fleet import Fleet
from gateway.core.tasks import cancel_and_wait, stop_requested
from gateway.observability.metrics import Metrics

log = logging.getLogger("gateway.metrics")

_CIRCUIT_STATE = {"closed": 0, "half_open": 1, "open": 2}


class KvStreamReport(Protocol):
    """One backend's KV-event stream (gateway/routing/kv_events.py `StreamReport`)."""

    @property
    def connected(self) -> bool: ...
    @property
    def usable(self) -> bool: ...
    @property
    def blocks(self) -> int: ...
    @property
    def events(self) -> int: ...
    @property
    def gaps(self) -> int: ...
    @property
    def restarts(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def anchored(self) -> int: ...
    @property
    def orphans(self) -> int: ...


#: each count of a stream's report and the counter (a `Metrics` attribute) that shows it
_KV_COUNTS = (
    ("events", "kv_events"),
    ("gaps", "kv_event_gaps"),
    ("restarts", "kv_event_restarts"),
    ("errors", "kv_event_errors"),
    ("anchored", "kv_stores_anchored"),
    ("orphans", "kv_stores_orphaned"),
)

#: the streams' reports, by backend name (`KvEventSubscriber.report`)
KvReport = Callable[[], Mapping[str, KvStreamReport]]


class RedisProbe:
    """PING with a timeout through the gateway's Redis client (which it does not own); never raises."""

    def __init__(self, client: Any, metrics: Metrics, timeout_s: float) -> None:
        self._client = client
        self._metrics = metrics
        self._timeout = timeout_s
        self._up: bool | None = None
        metrics.redis_failures.labels("ping")  # the series exists (at 0) from the start

    async def probe(self) -> bool:
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self._timeout):
                await self._client.ping()
        except (RedisError, OSError, TimeoutError):
            ok = False
            self._metrics.redis_failure("ping")
        else:
            ok = True
            self._metrics.observe_redis("ping", time.perf_counter() - started)
        self._metrics.set_redis_up(ok)
        if ok is not self._up:
            if self._up is not None or not ok:
                log.warning("redis is %s", "reachable again" if ok else "unreachable")
            self._up = ok
        return ok


#: the fleet gauges are sampled (and Redis probed) every second in each worker: far finer than any
#: Prometheus scrape interval, so whichever worker a scrape reaches, every worker's gauges are fresh
SAMPLE_INTERVAL_S = 1.0


class MetricsSampler:
    def __init__(
        self,
        fleet: Fleet,
        metrics: Metrics,
        interval_s: float = SAMPLE_INTERVAL_S,
        redis: RedisProbe | None = None,
        kv: KvReport | None = None,
    ) -> None:
        self._fleet = fleet
        self._metrics = metrics
        self._interval = interval_s
        self._redis = redis
        self._kv = kv
        #: the KV streams' counters, in the order of `_KV_COUNTS`
        self._kv_counters = tuple(getattr(metrics, metric) for _, metric in _KV_COUNTS)
        #: each stream's counts at the last sample, to add what they grew by to the metrics
        self._kv_last: dict[str, tuple[int, ...]] = {}
        self._task: asyncio.Task[None] | None = None
        self._seen: set[tuple[str, str]] = set()
        self._pools: set[str] = set()

    def sample(self) -> None:
        """Copy the fleet's state into the gauges (cheap: a few dozen gauge sets)."""
        m = self._metrics
        now = time.monotonic()
        seen: set[tuple[str, str]] = set()
        pools: set[str] = set()
        for pool in self._fleet.pools.values():
            pools.add(pool.name)
            m.pool_weight.labels(pool.name).set(pool.weight)
            total = 0
            for b in pool.backends.values():
                seen.add((pool.name, b.name))
                total += b.in_flight
                state = b.circuit.state
                m.backend_healthy.labels(pool.name, b.name).set(1 if b.healthy else 0)
                m.backend_circuit.labels(pool.name, b.name).set(0 if state == "closed" else 1)
                if state == "open" and not b.circuit.is_open(now):
                    state = "half_open"  # due for its trial: the next request may go through
                m.backend_circuit_state.labels(pool.name, b.name).set(_CIRCUIT_STATE[state])
                m.backend_in_flight.labels(pool.name, b.name).set(b.in_flight)
                m.backend_prefill_tokens.labels(pool.name, b.name).set(b.prefill)
                m.backend_draining.labels(pool.name, b.name).set(1 if b.draining else 0)
            m.in_flight.labels(pool.name).set(total)
        if self._kv is not None:
            self._sample_kv(self._kv())
        # Backends and pools removed at run time: their series go with them.
        backend_gauges = (
            m.backend_healthy,
            m.backend_circuit,
            m.backend_circuit_state,
            m.backend_in_flight,
            m.backend_prefill_tokens,
            m.backend_draining,
            m.kv_stream_connected,
            m.kv_stream_usable,
            m.kv_index_blocks,
            *self._kv_counters,
        )
        for key in self._seen - seen:
            for gauge in backend_gauges:
                with contextlib.suppress(KeyError):
                    gauge.remove(*key)
        for name in self._pools - pools:
            for gauge in (m.pool_weight, m.in_flight):
                with contextlib.suppress(KeyError):
                    gauge.remove(name)
        self._seen = seen
        self._pools = pools

    def _sample_kv(self, report: Mapping[str, KvStreamReport]) -> None:
        m = self._metrics
        counters = self._kv_counters
        last = self._kv_last
        for pool in self._fleet.pools.values():
            for b in pool.backends.values():
                r = report.get(b.name)
                if r is None:
                    continue
                key = (pool.name, b.name)
                m.kv_stream_connected.labels(*key).set(1 if r.connected else 0)
                m.kv_stream_usable.labels(*key).set(1 if r.usable else 0)
                m.kv_index_blocks.labels(*key).set(r.blocks)
                now = tuple(getattr(r, count) for count, _ in _KV_COUNTS)
                before = last.get(b.name, (0,) * len(now))
                for counter, value, previous in zip(counters, now, before, strict=True):
                    # a stream watched anew (its source changed) counts from 0 again
                    grown = value - previous if value >= previous else value
                    child = counter.labels(*key)
                    if grown:
                        child.inc(grown)
                last[b.name] = now
        for name in set(last) - set(report):
            del last[name]

    async def start(self) -> None:
        self.sample()
        if self._redis is not None:
            await self._redis.probe()
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task], within_s=2.0, what="the metrics sampler")
            self._task = None

    async def _run(self) -> None:
        while not stop_requested():
            await asyncio.sleep(self._interval)
            try:
                self.sample()
                if self._redis is not None:
                    await self._redis.probe()
            except Exception:
                if stop_requested():  # the cancel was swallowed on its way (gateway/core/tasks.py)
                    return
                log.exception("metrics sampling failed")
