"""The batching engine in real time: `step_model.StepEngine` driven on the event loop.

`BatchRunner` runs one step at a time: it asks the model for the next batch, waits the batch's
duration, applies it, wakes the requests that got a token, and starts the next step at once (steps
keep to a grid: the next one is due when the previous one ends, not after the loop has handled it).
It sleeps while the engine is idle. A request's life is a `BatchRun`, the same protocol as the serial
scheduler's (`engine.Run`): `prefill()` waits for the first token, `step()` for the next one,
`decode(n)` until `n` tokens are out. The engine does not wait for a slow client: tokens it has
produced are handed out at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator
from typing import TYPE_CHECKING

from engines.sim.step_model import Batch, BlockEvent, Seq, StepEngine

if TYPE_CHECKING:
    from engines.sim.engine import Engine


class _Done:
    """An awaitable that completes at once."""

    def __await__(self) -> Generator[None, None, None]:
        return
        yield


DONE = _Done()


class Ticket:
    """The runner's handle on one sequence: tokens produced so far, and who waits for more."""

    __slots__ = ("account", "admitted_at", "produced", "seq", "waiter", "want")

    def __init__(self, seq: Seq, account: bool) -> None:
        self.seq = seq
        self.account = account
        self.produced = 0
        self.want = 0
        self.waiter: asyncio.Future[None] | None = None
        self.admitted_at = 0.0  # perf_counter when it was first scheduled

    def wait(self, tokens: int) -> Awaitable[None]:
        """Until `tokens` tokens have been produced (or the sequence ended)."""
        if self.produced >= tokens or self.seq.state in ("finished", "aborted"):
            return DONE
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.waiter, self.want = fut, tokens
        return fut

    def wake(self) -> None:
        fut = self.waiter
        ended = self.seq.state in ("finished", "aborted")
        if fut is not None and (self.produced >= self.want or ended) and not fut.done():
            self.waiter = None
            fut.set_result(None)


class BatchRunner:
    """One step at a time, in real time (see the module docstring)."""

    def __init__(
        self,
        model: StepEngine,
        *,
        on_admit: Callable[[Ticket], None] | None = None,
        on_events: Callable[[list[BlockEvent]], None] | None = None,
    ) -> None:
        self.model = model
        self._on_admit = on_admit
        self._on_events = on_events
        self._busy = False  # a step is scheduled or running
        self._free_at = float("-inf")  # loop time the last step ended (the grid)
        self.last_output = float("-inf")  # perf_counter of the last step that emitted a token
        self._next_id = 0

    def submit(self, prompt: list[int], out_len: int, *, account: bool = True, **kw: object) -> Ticket:
        """Queue a new sequence; `kw` as `Seq` takes it (output_ids, max_new, cache_salt, session_id)."""
        self._next_id += 1
        seq = Seq(self._next_id, prompt, out_len, **kw)  # type: ignore[arg-type]
        ticket = Ticket(seq, account)
        seq.tag = ticket
        self.model.add(seq)
        self._kick()
        return ticket

    def abort(self, ticket: Ticket) -> None:
        """The client went away: drop the sequence (its blocks are freed)."""
        if ticket.seq.state in ("waiting", "running"):
            self.model.abort(ticket.seq)
            self._kick()  # freed blocks may let a waiting request in

    def _kick(self) -> None:
        if not self._busy and self.model.busy:
            self._busy = True
            asyncio.get_running_loop().call_soon(self._run_step)

    def _run_step(self) -> None:
        batch = self.model.schedule()
        if batch is None:
            self._busy = False
            return
        now = time.perf_counter()
        for seq in batch.admitted:
            ticket = seq.tag
            assert isinstance(ticket, Ticket)
            ticket.admitted_at = now
            if self._on_admit is not None:
                self._on_admit(ticket)
        loop = asyncio.get_running_loop()
        start = max(loop.time(), self._free_at)
        self._free_at = start + batch.duration_s
        loop.call_at(self._free_at, self._end_step, batch)

    def _end_step(self, batch: Batch) -> None:
        result = self.model.complete(batch)
        if result.emitted:
            self.last_output = time.perf_counter()
        for seq in result.emitted:
            ticket = seq.tag
            assert isinstance(ticket, Ticket)
            ticket.produced = seq.generated
            ticket.wake()
        if result.events and self._on_events is not None:
            self._on_events(result.events)
        self._busy = False
        if self.model.busy:
            self._busy = True
            self._run_step()

    def flush_events(self) -> None:
        """Publish events recorded outside a step (a cache reset)."""
        events = self.model.take_events()
        if events and self._on_events is not None:
            self._on_events(events)


class BatchRun:
    """One request's life on the batching engine (the protocol of `engine.Run`)."""

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
        self._t0 = time.perf_counter()
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
        self._first = time.perf_counter()

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
