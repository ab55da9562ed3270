"""The simulated engine: scheduler, KV cache, metrics, counters, faults and KV-event publisher of one
process.

A request's life is one `Run` (an async context manager), whichever the scheduler:

    async with engine.run(prompt_ids, budget) as run:
        await run.prefill()          # until the first token (queue, prefill)
        await run.step()             # one more output token (streams) ...
        await run.decode(n)          # ... or until n tokens are out (non-streaming)
        run.finish(tokens, "stop")   # what was produced; feeds metrics on a clean exit

`--scheduler batching` (the default): `BatchRun` below, on the step model (`step_model.StepEngine`,
continuous batching) driven in real time by `batch_runner.BatchRunner`. `--scheduler serial`: `SerialRun` below on
`scheduler.Scheduler` (a running slot per request, a FIFO queue, a fixed cost per request).

Leaving the block by cancellation (client gone) counts the request as cancelled; leaving it by another
exception counts an error; either way the request leaves the engine and its blocks are released.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Protocol

from engines.sim.batch_runner import DONE, BatchRunner, Ticket
from engines.sim.config import SimConfig
from engines.sim.faults import FaultState
from engines.sim.kv_events import EventEncoder, KvEventPublisher
from engines.sim.metrics import EngineMetrics, LiveGauges
from engines.sim.prefix_cache import Lease, LoraRequest, PrefixCache, usable_hit
from engines.sim.scheduler import Scheduler
from engines.sim.stats import SimStats
from engines.sim.step_model import BlockEvent, ClearedBlocks, RemovedBlocks, StepEngine, StoredBlocks


class Run(Protocol):
    """One request's life (see the module docstring)."""

    cached_tokens: int

    async def __aenter__(self) -> Run: ...

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...

    async def prefill(self) -> None: ...

    def step(self) -> Awaitable[None]: ...

    async def decode(self, tokens: int) -> None: ...

    def finish(self, generation_tokens: int, finished_reason: str) -> None: ...


class Engine:
    """Shared state of one simulator process."""

    def __init__(self, cfg: SimConfig, clock: Callable[[], float] = time.perf_counter) -> None:
        self.cfg = cfg
        #: what the metrics' latencies and the health check's last output are read on (tests pass
        #: the event loop's own clock)
        self.clock = clock
        self.batching = cfg.scheduler == "batching"
        self.scheduler = Scheduler(cfg, clock)
        self.model: StepEngine | None = None
        self.runner: BatchRunner | None = None
        # batching: the requests inside a Run (queued, running, or still streaming)
        self.open: set[Ticket] = set()
        self.publisher: KvEventPublisher | None = None
        if self.batching:
            self.model = StepEngine(cfg.batch_config())
            self.cache = self.model.cache
            self.runner = BatchRunner(
                self.model,
                clock=clock,
                on_admit=self._admitted,
                on_events=self._publish,
                frozen=lambda: self.faults.freeze,
            )
        else:
            self.cache = PrefixCache(cfg.block_size, cfg.num_cache_blocks, cfg.prefix_caching)
            if cfg.kv_events is not None:
                self.cache.on_evict = lambda key: self._publish([RemovedBlocks([key])])
        self.faults = FaultState.from_config(cfg)
        self.stats = SimStats()
        self.stats.log = type(self.stats.log)(maxlen=cfg.request_log_size)
        self.metrics = EngineMetrics(
            cfg,
            LiveGauges(
                running=lambda: float(self.running),
                waiting=lambda: float(self.waiting),
                kv_usage=self.kv_usage,
                preemptions=lambda: float(self.model.preemptions_total if self.model else 0),
            ),
        )
        self.started = time.time()

    # ---- KV-cache events ---------------------------------------------------------------------
    def start_events(self) -> None:
        """Open the KV-event publisher (`--kv-events-config`); SGLang's radix cache records an
        `AllBlocksCleared` when it starts, which goes out first."""
        cfg = self.cfg
        if cfg.kv_events is None or self.publisher is not None:
            return
        encoder = EventEncoder(cfg.engine, cfg.block_size, cfg.hash_algo, int_hashes=_int_hashes())
        self.publisher = KvEventPublisher(cfg.kv_events, encoder, host=cfg.host)
        if cfg.engine == "sglang":
            self.publisher.publish([ClearedBlocks()])

    def stop_events(self) -> None:
        """Flush and close the publisher."""
        if self.publisher is not None:
            self.publisher.close()
            self.publisher = None

    def _publish(self, events: list[BlockEvent]) -> None:
        if self.publisher is not None:
            self.publisher.publish(events)

    # ---- state -------------------------------------------------------------------------------
    @property
    def running(self) -> int:
        """Requests running (batching: in the running batch, including partial prefills)."""
        return len(self.model.running) if self.model else self.scheduler.running

    @property
    def in_flight(self) -> int:
        """Requests past the queue and not yet answered: running in the engine, or finished there while
        their response is still being sent (a slow reader does not hold the engine back, as in vLLM
        and SGLang, whose API servers buffer the output). Serial: the running slots."""
        if self.model is None:
            return self.scheduler.running
        return sum(1 for t in self.open if t.seq.state != "waiting")

    @property
    def waiting(self) -> int:
        """Requests queued (batching: including preempted ones)."""
        return len(self.model.waiting) if self.model else self.scheduler.waiting

    @property
    def running_tokens(self) -> int:
        """Tokens the running requests hold (batching: computed KV; serial: prompt + output budget)."""
        return self.model.running_tokens if self.model else self.scheduler.running_tokens

    @property
    def last_output(self) -> float:
        """`clock` time of the engine's last token (SGLang's health check looks at it)."""
        return self.runner.last_output if self.runner else self.scheduler.last_output

    def kv_usage(self) -> float:
        """KV cache in use, 0–1. Batching: blocks held by running requests over the pool (vLLM
        `kv_cache_usage_perc`, SGLang `token_usage`); serial: (prompt + output budget of running
        requests) / (blocks × block size)."""
        if self.model is not None:
            return self.model.kv_usage
        cap = self.cfg.num_cache_blocks * self.cfg.block_size
        return min(1.0, self.scheduler.running_tokens / cap) if cap else 0.0

    def reset_cache(self, *, when_busy: bool) -> bool:
        """Reset the prefix cache. Idle: everything goes (`AllBlocksCleared`). Busy: vLLM's
        `/reset_prefix_cache` and SGLang's `/flush_cache` refuse (`when_busy=False`); the sim's
        `/sim/reset` drops what no running request holds (`BlockRemoved`)."""
        if self.model is not None and self.runner is not None:
            if when_busy:
                self.model.drop_unpinned()
                ok = True
            else:
                ok = self.model.reset_cache()
            self.runner.flush_events()
            return ok
        busy = self.scheduler.running > 0 or self.scheduler.waiting > 0
        if busy and not when_busy:
            return False
        dropped = self.cache.clear()
        if self.cfg.kv_events is not None:
            self._publish([RemovedBlocks(dropped)] if busy else [ClearedBlocks()])
        return True

    def run(
        self,
        prompt_ids: list[int],
        budget_tokens: int,
        *,
        account: bool = True,
        extra: dict[str, object] | None = None,
    ) -> Run:
        """A new request's life; see the module docstring. `account=False` (health probes) keeps it out
        of `/sim/stats` and the metrics while it still takes a slot and costs time. `extra`
        (`Prepared.engine_args`): `output_ids`, `max_new`, `cache_salt`, `lora`, `session_id`."""
        kw = extra or {}
        if self.batching:
            return BatchRun(self, prompt_ids, budget_tokens, account, kw)
        salt, lora = kw.get("cache_salt"), kw.get("lora")
        return SerialRun(
            self,
            prompt_ids,
            budget_tokens,
            account,
            salt if isinstance(salt, str) else None,
            lora if isinstance(lora, LoraRequest) else None,
        )

    def _admitted(self, ticket: Ticket) -> None:
        if ticket.account:
            self.metrics.admitted(ticket.seq.prompt_len, ticket.seq.cached_tokens)

    def account(
        self,
        exc_type: type[BaseException] | None,
        *,
        prompt_tokens: int,
        cached_tokens: int,
        generation_tokens: int,
        t0: float,
        first: float,
        admitted: float,
        finished_reason: str,
    ) -> None:
        """Count a request that left the engine in `/sim/stats` and (if it completed) the metrics."""
        stats = self.stats
        stats.prompt_tokens_total += prompt_tokens
        stats.cached_tokens_total += cached_tokens
        stats.generation_tokens_total += generation_tokens
        if exc_type is None:
            stats.completed_total += 1
            now = self.clock()
            gen = generation_tokens
            self.metrics.observe(
                prompt_tokens=prompt_tokens,
                generation_tokens=gen,
                ttft=first - t0,
                itl=(now - first) / (gen - 1) if gen > 1 else 0.0,
                e2e=now - t0,
                queue=admitted - t0,
                finished_reason=finished_reason,
            )
        elif issubclass(exc_type, asyncio.CancelledError):
            stats.cancelled_total += 1
        else:
            stats.errors_total += 1

    def sim_stats(self) -> dict[str, object]:
        """Body of `GET /sim/stats`."""
        out: dict[str, object] = dict(self.stats.counters())
        out.update(
            scheduler=self.cfg.scheduler,
            running=self.in_flight,
            engine_running=self.running,
            waiting=self.waiting,
            kv_cache_usage=self.kv_usage(),
            preemptions_total=self.model.preemptions_total if self.model else 0,
            prefix_cache={
                "blocks_used": self.cache.used_blocks,
                "capacity_blocks": self.cache.capacity,
                "block_size": self.cache.block_size,
                "queries_tokens": self.model.prompt_tokens_queried
                if self.model
                else self.cache.queries_tokens,
                "hit_tokens": self.model.prompt_tokens_hit if self.model else self.cache.hit_tokens,
                "evictions": self.cache.evictions,
            },
            faults=self.faults.snapshot(),
        )
        if self.publisher is not None:
            out["kv_events"] = {"endpoint": self.publisher.endpoint, "batches_sent": self.publisher.sent}
        return out


class BatchRun:
    """One request's life on the batching engine (a `Run`)."""

    __slots__ = (
        "_account",
        "_engine",
        "_finish",
        "_first",
        "_gen",
        "_kw",
        "_out_len",
        "_prompt",
        "_seen",
        "_t0",
        "_ticket",
        "cached_tokens",
    )

    def __init__(
        self, engine: Engine, prompt_ids: list[int], budget_tokens: int, account: bool, kw: dict[str, object]
    ) -> None:
        self._engine = engine
        self._account = account
        self._prompt = prompt_ids
        self._out_len = max(1, budget_tokens)
        self._kw = kw
        self._ticket: Ticket | None = None
        self._t0 = engine.clock()
        self._first = self._t0
        self._seen = 0
        self._gen = 0
        self._finish = "abort"
        self.cached_tokens = 0

    async def __aenter__(self) -> BatchRun:
        eng = self._engine
        delay = eng.cfg.ttft_s
        if delay > 0:  # the front end's fixed latency, before the request reaches the scheduler
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                if self._account:
                    eng.stats.cancelled_total += 1
                raise
        runner = eng.runner
        assert runner is not None
        self._ticket = runner.submit(self._prompt, self._out_len, account=self._account, **self._kw)
        eng.open.add(self._ticket)
        return self

    def _wait(self, tokens: int) -> Awaitable[None]:
        assert self._ticket is not None
        return self._ticket.wait(tokens)

    async def prefill(self) -> None:
        """Wait in the queue and through the prefill, until the first token."""
        await self._wait(1)
        self._seen = 1
        assert self._ticket is not None
        self.cached_tokens = self._ticket.seq.cached_tokens
        self._first = self._engine.clock()

    def step(self) -> Awaitable[None]:
        """Until the next token (at once if the engine has produced it), plus any drip delay."""
        self._seen += 1
        tick = self._wait(self._seen)
        drip = self._engine.faults.drip_s
        if drip > 0:
            return self._drip(tick, drip)
        return tick

    @staticmethod
    async def _drip(tick: Awaitable[None], drip: float) -> None:
        await tick
        await asyncio.sleep(drip)

    async def decode(self, tokens: int) -> None:
        """Until `tokens` tokens in all are out (non-streaming)."""
        await self._wait(tokens)

    def finish(self, generation_tokens: int, finished_reason: str) -> None:
        """Record what was produced (call before leaving the block normally)."""
        self._gen = generation_tokens
        self._finish = finished_reason

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object
    ) -> None:
        eng = self._engine
        ticket = self._ticket
        if ticket is None:
            return
        runner = eng.runner
        assert runner is not None
        runner.abort(ticket)  # a no-op once the sequence has finished
        eng.open.discard(ticket)
        if not self._account:
            return
        queued_until = ticket.admitted_at or self._t0
        eng.account(
            exc_type,
            prompt_tokens=len(self._prompt),
            cached_tokens=self.cached_tokens,
            generation_tokens=self._gen,
            t0=self._t0,
            first=self._first,
            admitted=queued_until,
            finished_reason=self._finish,
        )


def _int_hashes() -> bool:
    """vLLM's `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES` (default 1): int hashes, else the digest bytes."""
    import os

    return os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1").strip() not in ("0", "false", "False")


class SerialRun:
    """One admitted request on the serial scheduler (see `Engine`)."""

    __slots__ = (
        "_account",
        "_budget",
        "_engine",
        "_finish",
        "_first",
        "_gen",
        "_lease",
        "_lora",
        "_prompt",
        "_salt",
        "_t0",
        "_t_admit",
        "cached_tokens",
    )

    def __init__(
        self,
        engine: Engine,
        prompt_ids: list[int],
        budget_tokens: int,
        account: bool,
        salt: str | None,
        lora: LoraRequest | None = None,
    ) -> None:
        self._engine = engine
        self._account = account
        self._prompt = prompt_ids
        self._salt = salt
        self._lora = lora
        self._budget = len(prompt_ids) + budget_tokens
        self._lease: Lease | None = None
        self._t0 = engine.clock()
        self._t_admit = self._t0
        self._first = self._t0
        self._gen = 0
        self._finish = "abort"
        self.cached_tokens = 0

    async def __aenter__(self) -> SerialRun:
        eng = self._engine
        try:
            await eng.scheduler.admit()
        except asyncio.CancelledError:
            if self._account:
                eng.stats.cancelled_total += 1
            raise
        self._t_admit = eng.clock()
        eng.scheduler.running_tokens += self._budget
        lease = eng.cache.acquire(self._prompt, self._salt, self._lora) if self._account else Lease([], 0)
        self._lease = lease
        bs = eng.cfg.block_size
        self.cached_tokens = usable_hit(lease.cached_tokens, len(self._prompt), bs)
        if self._account:
            eng.metrics.admitted(len(self._prompt), self.cached_tokens)
        if eng.cfg.kv_events is not None:
            hit = lease.cached_tokens // bs
            new = lease.keys[hit:]
            if new:
                parent = lease.keys[hit - 1] if hit else None
                tokens = self._prompt[hit * bs : len(lease.keys) * bs]
                eng._publish([StoredBlocks(new, parent, tokens, self._salt, None, self._lora)])
        return self

    async def prefill(self) -> None:
        """Sleep the time to first token for the uncached part of the prompt."""
        delay = self._engine.scheduler.prefill_time(len(self._prompt) - self.cached_tokens)
        if delay > 0:
            await asyncio.sleep(delay)
        self._first = self._engine.scheduler.last_output = self._engine.clock()

    def step(self) -> Awaitable[None]:
        """Wait one inter-token gap (the shared decode tick), plus any injected drip delay."""
        tick = self._engine.scheduler.decode_step()
        drip = self._engine.faults.drip_s
        if drip > 0:
            return self._drip(tick, drip)
        return tick if tick is not None else DONE

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
        eng.account(
            exc_type,
            prompt_tokens=len(self._prompt),
            cached_tokens=self.cached_tokens,
            generation_tokens=self._gen,
            t0=self._t0,
            first=self._first,
            admitted=self._t_admit,
            finished_reason=self._finish,
        )
