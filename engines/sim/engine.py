"""The simulated engine: scheduler, prefix cache, metrics, counters and faults of one process.

A request's life is one `Run` (an async context manager):

    async with engine.run(prompt_ids, budget) as run:
        await run.prefill()          # queue wait already done; sleeps the time to first token
        await run.step()             # one more output token (streams) ...
        await run.decode(n)          # ... or n tokens at once (non-streaming)
        run.finish(tokens, "stop")   # what was produced; feeds metrics on a clean exit

Leaving the block by cancellation (client gone) counts the request as cancelled; leaving it by another
exception counts an error; either way the running slot and the cache blocks are released.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Generator
from types import TracebackType

from engines.sim.config import SimConfig
from engines.sim.faults import FaultState
from engines.sim.metrics import EngineMetrics, LiveGauges
from engines.sim.prefix_cache import Lease, PrefixCache, usable_hit
from engines.sim.scheduler import Scheduler
from engines.sim.stats import SimStats


class _Done:
    """An awaitable that completes at once (a zero inter-token gap)."""

    def __await__(self) -> Generator[None, None, None]:
        return
        yield


_DONE = _Done()


class Engine:
    """Shared state of one simulator process."""

    def __init__(self, cfg: SimConfig) -> None:
        self.cfg = cfg
        self.scheduler = Scheduler(cfg)
        self.cache = PrefixCache(cfg.block_size, cfg.num_cache_blocks, cfg.prefix_caching)
        self.faults = FaultState.from_config(cfg)
        self.stats = SimStats()
        self.stats.log = type(self.stats.log)(maxlen=cfg.request_log_size)
        self.metrics = EngineMetrics(
            cfg, LiveGauges(running=self._running, waiting=self._waiting, kv_usage=self.kv_usage)
        )
        self.started = time.time()

    def _running(self) -> float:
        return float(self.scheduler.running)

    def _waiting(self) -> float:
        return float(self.scheduler.waiting)

    def kv_usage(self) -> float:
        """Fraction of KV blocks held by running requests (prompt + output budget), 0–1."""
        cap = self.cfg.num_cache_blocks * self.cfg.block_size
        return min(1.0, self.scheduler.running_tokens / cap) if cap else 0.0

    def run(self, prompt_ids: list[int], budget_tokens: int, account: bool = True) -> Run:
        """A new request's life; see the module docstring. `account=False` (health probes) keeps it out
        of `/sim/stats` and the metrics while it still takes a slot and costs time."""
        return Run(self, prompt_ids, budget_tokens, account)

    def sim_stats(self) -> dict[str, object]:
        """Body of `GET /sim/stats`."""
        out: dict[str, object] = dict(self.stats.counters())
        out.update(
            running=self.scheduler.running,
            waiting=self.scheduler.waiting,
            kv_cache_usage=self.kv_usage(),
            prefix_cache={
                "blocks_used": self.cache.used_blocks,
                "capacity_blocks": self.cache.capacity,
                "block_size": self.cache.block_size,
                "queries_tokens": self.cache.queries_tokens,
                "hit_tokens": self.cache.hit_tokens,
                "evictions": self.cache.evictions,
            },
            faults=self.faults.snapshot(),
        )
        return out


class Run:
    """One admitted request; see `Engine` for the protocol."""

    __slots__ = (
        "_account",
        "_budget",
        "_engine",
        "_finish",
        "_first",
        "_gen",
        "_lease",
        "_prompt",
        "_t0",
        "_t_admit",
        "cached_tokens",
    )

    def __init__(
        self, engine: Engine, prompt_ids: list[int], budget_tokens: int, account: bool = True
    ) -> None:
        self._engine = engine
        self._account = account
        self._prompt = prompt_ids
        self._budget = len(prompt_ids) + budget_tokens
        self._lease: Lease | None = None
        self._t0 = time.perf_counter()
        self._t_admit = self._t0
        self._first = self._t0
        self._gen = 0
        self._finish = "abort"
        self.cached_tokens = 0

    async def __aenter__(self) -> Run:
        eng = self._engine
        try:
            await eng.scheduler.admit()
        except asyncio.CancelledError:
            if self._account:
                eng.stats.cancelled_total += 1
            raise
        self._t_admit = time.perf_counter()
        eng.scheduler.running_tokens += self._budget
        lease = eng.cache.acquire(self._prompt) if self._account else Lease([], 0)
        self._lease = lease
        self.cached_tokens = usable_hit(lease.cached_tokens, len(self._prompt), eng.cfg.block_size)
        return self

    async def prefill(self) -> None:
        """Sleep the time to first token for the uncached part of the prompt."""
        delay = self._engine.scheduler.prefill_time(len(self._prompt) - self.cached_tokens)
        if delay > 0:
            await asyncio.sleep(delay)
        self._first = self._engine.scheduler.last_output = time.perf_counter()

    def step(self) -> Awaitable[None]:
        """Wait one inter-token gap (the shared decode tick), plus any injected drip delay."""
        tick = self._engine.scheduler.decode_step()
        drip = self._engine.faults.drip_s
        if drip > 0:
            return self._drip(tick, drip)
        return tick if tick is not None else _DONE

    @staticmethod
    async def _drip(tick: asyncio.Future[None] | None, drip: float) -> None:
        if tick is not None:
            await tick
        await asyncio.sleep(drip)

    async def decode(self, tokens: int) -> None:
        """Sleep the decode time of `tokens` more tokens after the first."""
        if tokens > 1:
            delay = (tokens - 1) * self._engine.scheduler.token_time()
            if delay > 0:
                await asyncio.sleep(delay)

    def finish(self, generation_tokens: int, finished_reason: str) -> None:
        """Record what was produced (call before leaving the block normally)."""
        self._gen = generation_tokens
        self._finish = finished_reason

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        eng = self._engine
        eng.scheduler.running_tokens -= self._budget
        eng.scheduler.finish()
        if self._lease is not None:
            eng.cache.release(self._lease)
        if not self._account:
            return
        stats = eng.stats
        n = len(self._prompt)
        stats.prompt_tokens_total += n
        stats.cached_tokens_total += self.cached_tokens
        stats.generation_tokens_total += self._gen
        if exc_type is None:
            stats.completed_total += 1
            now = time.perf_counter()
            gen = self._gen
            eng.metrics.observe(
                prompt_tokens=n,
                cached_tokens=self.cached_tokens,
                generation_tokens=gen,
                ttft=self._first - self._t0,
                itl=(now - self._first) / (gen - 1) if gen > 1 else 0.0,
                e2e=now - self._t0,
                queue=self._t_admit - self._t0,
                finished_reason=self._finish,
            )
        elif issubclass(exc_type, asyncio.CancelledError):
            stats.cancelled_total += 1
        else:
            stats.errors_total += 1
