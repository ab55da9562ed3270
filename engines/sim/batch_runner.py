"""The batching engine in real time: `step_model.StepEngine` driven on the event loop.

`BatchRunner` runs one step at a time: it asks the model for the next batch, waits the batch's
duration, applies it, wakes the requests that got a token, and starts the next step at once (steps
keep to a grid: the next one is due when the previous one ends, not after the loop has handled it).
It sleeps while the engine is idle, and while `frozen` says so (the `freeze` fault). Each sequence
it runs has a `Ticket`: how many tokens it has produced, and an awaitable for the next ones (the
engine's `BatchRun` waits on it). The engine does not wait for a slow client: tokens it has
produced are handed out at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Generator

from engines.sim.step_model import Batch, BlockEvent, Seq, StepEngine


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
        self.admitted_at = 0.0  # the runner's `clock` when it was first scheduled

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
        clock: Callable[[], float] = time.perf_counter,
        on_admit: Callable[[Ticket], None] | None = None,
        on_events: Callable[[list[BlockEvent]], None] | None = None,
        frozen: Callable[[], bool] = lambda: False,
    ) -> None:
        self.model = model
        self._clock = clock
        self._on_admit = on_admit
        self._on_events = on_events
        self._busy = False  # a step is scheduled or running
        self._free_at = float("-inf")  # loop time the last step ended (the grid)
        self.last_output = float("-inf")  # `clock` time of the last step that emitted a token
        self._next_id = 0
        #: whether to take no step now (the step under way ends); `wake` after it turns false
        self._frozen = frozen

    def wake(self) -> None:
        """Take steps again if there is work (after `frozen` changed)."""
        self._kick()

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
        if not self._busy and self.model.busy and not self._frozen():
            self._busy = True
            asyncio.get_running_loop().call_soon(self._run_step)

    def _run_step(self) -> None:
        batch = self.model.schedule()
        if batch is None:
            self._busy = False
            return
        now = self._clock()
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
            self.last_output = self._clock()
        for seq in result.emitted:
            ticket = seq.tag
            assert isinstance(ticket, Ticket)
            ticket.produced = seq.generated
            ticket.wake()
        if result.events and self._on_events is not None:
            self._on_events(result.events)
        self._busy = False
        if self.model.busy and not self._frozen():
            self._busy = True
            self._run_step()

    def flush_events(self) -> None:
        """Publish events recorded outside a step (a cache reset)."""
        events = self.model.take_events()
        if events and self._on_events is not None:
            self._on_events(events)
