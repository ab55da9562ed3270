"""Active health checks and the engine-metrics scrape, one background task each.

Every `interval_s` each backend's dialect health path is probed (200 → healthy, anything else or a
timeout → unhealthy; a failed probe also counts against the circuit breaker). A probe that times out
while the backend completed answers says nothing and changes nothing: an engine whose API server is
busy (vLLM's on a starved CPU) answers its health path late but is serving, and marking the only
backend of a pool unhealthy for that would refuse every request until the next probe. Nor does the
first timed-out probe of a *busy* backend (requests of this process in flight there, or of the
other routing processes as last heard through the shared store - `elsewhere`, which the root hands in
when routing processes share their load -, or its last scrape, since the previous probe, showing
requests running or waiting): SGLang's `/health` is a
one-token generation that waits behind the engine's work, so a long prefill with nothing decoding
(documents arriving cold) times it out while the engine computes, and taking such a backend out
sends its warm documents to cold engines. Only the second timed-out probe in a row (no probe
answered in between) marks it unhealthy. Nor does a probe whose timeout fired more than `held_s`
(1 s) after its deadline: this process itself was held (a VM whose vCPUs the host stopped for
seconds, a long pause of the event loop), so the timeout measured the stall, not the backend, whose
answer may sit unread in the socket; on such a stall every idle backend's probe can time out at
once, and its pool would then refuse every request until the next probe. Every
`scrape_interval_s` each backend's `/metrics` is read and parsed by its dialect into `EngineLoad`,
which routing uses while it is fresher than `scrape_stale_s`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.core.fleet import Backend, Fleet
from gateway.core.stalls import HELD_S, held
from gateway.upstream.transport import Transport, UpstreamError

log = logging.getLogger("gateway.health")


class HealthChecker:
    def __init__(
        self,
        fleet: Fleet,
        transport: Transport,
        *,
        interval_s: float,
        timeout_s: float,
        scrape_interval_s: float,
        on_change: Callable[[Backend], None] | None = None,
        elsewhere: Callable[[str], int] | None = None,
        held_s: float | None = HELD_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._fleet = fleet
        self._transport = transport
        self._interval = interval_s
        self._timeout = timeout_s
        self._scrape_interval = scrape_interval_s
        self._on_change = on_change
        #: requests of the other routing processes in flight on a backend, as last heard (or None)
        self._elsewhere = elsewhere
        self._tasks: list[asyncio.Task[None]] = []
        #: backends whose last probe timed out while they were busy (forgiven once)
        self._timed_out: set[str] = set()
        #: a timeout this late is no verdict (None: every timeout is one)
        self._held = held_s
        #: what a probe's start, its late timeout and a scrape's freshness are read on (the event
        #: loop's own clock in tests)
        self._clock = clock

    async def start(self) -> None:
        """Probe once (so readiness is known at once), then keep probing in the background."""
        await self.probe_all()
        self._tasks.append(asyncio.create_task(self._loop(self.probe_all, self._interval)))
        if self._scrape_interval > 0:
            self._tasks.append(asyncio.create_task(self._loop(self.scrape_all, self._scrape_interval)))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()

    async def _loop(self, step: Callable[[], object], every: float) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await step()  # type: ignore[misc]
            except Exception:
                log.exception("background check failed")

    async def probe_all(self) -> None:
        await asyncio.gather(*(self._probe(b) for b in list(self._fleet.backends.values())))

    async def scrape_all(self) -> None:
        await asyncio.gather(*(self._scrape(b) for b in list(self._fleet.backends.values())))

    async def _probe(self, backend: Backend) -> None:
        dialect = self._fleet.pools[backend.pool].dialect
        ok = False
        answered = backend.circuit.successes
        tic = self._clock()
        try:
            async with asyncio.timeout(self._timeout):
                resp = await self._transport.request("GET", backend.url + dialect.health_path, headers={})
                try:
                    await resp.read()
                finally:
                    resp.close()
                ok = resp.status == 200
        except TimeoutError:
            deadline, now = tic + self._timeout, self._clock()
            if self._held is not None and held(deadline, now, self._held):
                log.info(
                    "backend %s: health probe timed out %.1f s after its deadline: this process was"
                    " held, no verdict",
                    backend.name,
                    now - deadline,
                )
                return
            if backend.circuit.successes != answered:
                self._timed_out.discard(backend.name)
                log.info("backend %s: health probe timed out while it completed answers", backend.name)
                return
            if backend.name not in self._timed_out and self._busy(backend, tic):
                self._timed_out.add(backend.name)
                log.info("backend %s: health probe timed out while it was busy", backend.name)
                return
            ok = False
        except UpstreamError:
            ok = False
            self._timed_out.discard(backend.name)
        else:
            self._timed_out.discard(backend.name)
        now = self._clock()
        if ok and backend.circuit.state == "open" and backend.healthy is False:
            # A backend that comes back is given its trial at once.
            backend.circuit.success()
        if not ok:
            backend.circuit.failure(now)
        if backend.healthy is not ok:
            if backend.healthy is not None or not ok:
                log.warning("backend %s is now %s", backend.name, "healthy" if ok else "unhealthy")
            backend.healthy = ok
            if self._on_change is not None:
                self._on_change(backend)

    def _busy(self, backend: Backend, tic: float) -> bool:
        """Work is under way on `backend`: requests of this process or (as last heard) of the other
        routing processes in flight, or its engine's metrics, scraped since the previous probe,
        report requests running or waiting. (With several processes, the one whose probe times out
        often has nothing of its own there, and SGLang's gauges only move as it decodes.)"""
        if backend.in_flight > 0 or (self._elsewhere is not None and self._elsewhere(backend.name) > 0):
            return True
        load = backend.load
        return (
            load is not None
            and backend.load_at >= tic - self._interval
            and ((load.running or 0.0) > 0 or (load.waiting or 0.0) > 0)
        )

    async def _scrape(self, backend: Backend) -> None:
        dialect = self._fleet.pools[backend.pool].dialect
        try:
            async with asyncio.timeout(self._timeout):
                resp = await self._transport.request("GET", backend.url + dialect.metrics_path, headers={})
                try:
                    text = await resp.read()
                finally:
                    resp.close()
        except (TimeoutError, UpstreamError):
            return
        if resp.status != 200:
            return
        backend.scraped(dialect.parse_metrics(text.decode("utf-8", "replace")), self._clock())
