"""The process's flow queue: where requests wait while the backends they may use are saturated, and
what releases them.

A request the flow stage cannot pass (gateway/flow/stage.py) is `wait`ed here: it joins the queue
(`policies.flow.FlowQueue`: strict priority across classes, fair shares by tokens across tenants within
a class, a deadline, a depth bound) and its coroutine awaits a future until one of

- **release**: a backend can take it (`Pressure.check` answers FREE, and no other routing process
  reports a more urgent class waiting); it is counted on the backend predicted to start it soonest
  until its coroutine runs on (the route stage then routes it among the free backends and the proxy
  opens its lease without yielding), so one pass does not release more than the free backends take;
- **deadline**: its class's `max_queue_s` (or the shorter deadline it asked for) passed: 503
  `fleet_saturated`;
- **disconnect**: the client left: out of the queue at once, nothing is sent to an engine.

A newcomer to a full class is refused at once (429) when its tenant holds its weighted share of the
class's queued tokens; otherwise it takes the place of the last-going request of the tenant furthest
over its share, which is refused (429) instead (503 when no tenant is over its share). Refused or
shed, the request reached no engine, so admission's finalizer releases its whole reservation.

Passes over the queue run when an attempt opens, gets its first token or ends on any backend (the
proxy's `LeaseWatch`), and on a tick of `TICK_S` while anything waits (what other processes finish,
and scrapes, change without an event here); the tick also expires deadlines, and reads the engines'
metrics every `SCRAPE_WHILE_QUEUED_S` (a pass follows each read). While requests wait and
routing state is shared, every `SHARE_REFRESH_S` this process writes its queue's figures (waiting
requests by class) to the store and reads the others' (`refresh`): so a process does not release a
less urgent class while another one has a more urgent class waiting, with that view at most about
half a second old.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Protocol

from engines.base import INPUT_ONLY
from engines.errors import ApiError
from gateway.core.context import RequestContext
from gateway.core.disconnect import ClientWatch
from gateway.core.fleet import Backend
from gateway.core.tasks import cancel_and_wait
from gateway.flow.pressure import FULL, HOLD, Pressure
from policies.admission import completion_budget
from policies.flow import FlowClass, FlowQueue, Waiting

#: seconds between passes while anything waits: other processes' requests ending and fresh scrapes
#: reach this process without an event, and a tick of 50 ms is well inside any class's TTFT target
TICK_S = 0.05
#: seconds between this process's reports of its queue to the shared store while requests wait
SHARE_REFRESH_S = 0.5
#: seconds between reads of the engines' metrics while requests wait: between reads an engine's queue
#: is only estimated (a non-streamed request shows no first token until it ends), and a queue that
#: drained must release the waiting requests within a fraction of any class's TTFT target
SCRAPE_WHILE_QUEUED_S = 0.25
#: the typical wait of a class (what `retry-after` says) follows its released requests with this
#: weight per new one
WAIT_DECAY = 0.9
#: `retry-after` bounds, seconds (OpenAI's SDK honours up to 60 s)
RETRY_MIN_S, RETRY_MAX_S = 1, 60

#: why a queued request left without being served (`gateway_flow_shed_total{reason}`)
SHED_REASONS = ("deadline", "full", "share", "disconnect")

#: the request's tokens for routing, before it waits (the route stage's `prepare`)
Prepare = Callable[[RequestContext], Awaitable[object]]


class FlowObserver(Protocol):
    """Where the queue reports (gateway/observability/metrics.py's `Metrics` is one)."""

    def flow_queued(self, klass: str, waiting: int) -> None: ...

    def flow_waited(self, klass: str, seconds: float) -> None: ...

    def flow_shed(self, klass: str, reason: str) -> None: ...

    def flow_saturated(self, engaged: bool) -> None: ...


class _Ticket:
    """A waiting request's handle (`Waiting.ref`)."""

    __slots__ = ("exclude", "future", "model", "pools", "predicted", "tokens", "transit")

    def __init__(
        self, model: str, tokens: int, future: asyncio.Future[str], pools: frozenset[str] | None
    ) -> None:
        self.model = model
        self.tokens = tokens
        self.future = future
        self.pools = pools
        self.exclude: frozenset[str] | None = None
        self.predicted: dict[str, float] | None = None
        self.transit: str | None = None


class Gate:
    """See the module docstring. Event loop only."""

    def __init__(
        self,
        classes: Mapping[str, FlowClass],
        pressure: Pressure,
        observer: FlowObserver,
        tenant_weights: Mapping[str, float],
    ) -> None:
        self.classes = classes
        self.pressure = pressure
        self.queue = FlowQueue(classes.values())
        self._observer = observer
        self._weights = tenant_weights
        #: the route stage's `prepare` (set by the root): a request's routing tokens before it waits
        self.prepare: Prepare | None = None
        #: the other routing processes' waiting requests by class (`SharedLoad.others_flow`), and
        #: the store's report of this process's figures (`Admission.report_share`); set by the root
        self.others: Callable[[], Mapping[str, int]] | None = None
        self.refresh: Callable[[], Coroutine[Any, Any, bool]] | None = None
        #: reads every backend's metrics now (the health checker's scrape; set by the root when the
        #: engines are scraped)
        self.scrape: Callable[[], Coroutine[Any, Any, None]] | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._refreshing: asyncio.Task[bool] | None = None
        self._scraping: asyncio.Task[None] | None = None
        self._refreshed_at = -math.inf
        self._scraped_at = -math.inf
        self._pass_due = False
        #: requests shed by class and reason since start, and each class's typical wait (seconds)
        self.shed: dict[tuple[str, str], int] = {}
        self._typical: dict[str, float] = {}

    # -- what the stage asks ----------------------------------------------------------------------
    def clear_for(self, klass: FlowClass) -> bool:
        """Nothing as urgent as `klass` waits here, nor anything more urgent elsewhere: a request of
        `klass` may pass if a backend is free (no waiting request would be overtaken)."""
        top = self.queue.top_priority() if len(self.queue) else None
        if top is not None and top <= klass.priority:
            return False
        return self._others_top() >= klass.priority

    def _others_top(self) -> float:
        """The most urgent priority waiting in another routing process (inf: none heard of)."""
        others = self.others() if self.others is not None else None
        if not others:
            return math.inf
        top = math.inf
        for name, n in others.items():
            klass = self.classes.get(name)
            if klass is not None and n > 0 and klass.priority < top:
                top = klass.priority
        return top

    def queued(self) -> dict[str, int]:
        """This process's waiting requests by class (the figures it shares), empty when none."""
        if not len(self.queue):
            return {}
        return {name: n for name in self.classes if (n := self.queue.depth(name))}

    # -- waiting ----------------------------------------------------------------------------------
    async def wait(
        self,
        ctx: RequestContext,
        klass: FlowClass,
        wait_s: float,
        tokens: int,
        pools: frozenset[str] | None = None,
    ) -> None:
        """Hold the request until a backend can take it (then return, with `flow_exclude` set for
        the route stage); ApiError 429 / 503 when it is refused or shed, 499 when the client left."""
        assert ctx.model is not None
        loop = asyncio.get_running_loop()
        now = loop.time()
        if wait_s <= 0:
            self._count_shed(klass.name, "deadline")
            ctx.error_kind = "flow_deadline"
            raise self._saturated(klass, "the request asked not to wait")
        if self.prepare is not None:
            await self.prepare(ctx)  # routing's tokens now: once released, it must not yield
        principal = ctx.principal
        tenant = principal.tenant if principal.tenant else "user:" + principal.user
        cost = tokens
        if ctx.endpoint not in INPUT_ONLY:
            cost += completion_budget(ctx.body, ctx.model.default_max_tokens)
        ticket = _Ticket(ctx.model.name, tokens, loop.create_future(), pools)
        weight = self._weights.get(principal.tenant or "", 1.0)
        item = Waiting(klass.name, tenant, max(1, cost), weight, now + wait_s, ticket, now)
        refusal = self.queue.push(item)
        if refusal == "saturated":
            victim = self.queue.evict_for(item)
            if victim is not None:
                self._count_shed(klass.name, "share")
                victim.ref.future.set_result("share")
                refusal = self.queue.push(item)
        if refusal is not None:
            raise self._refused(ctx, klass, item, refusal)
        self._observer.flow_queued(klass.name, self.queue.depth(klass.name))
        self._engage()
        self._release()
        outcome = ""
        try:
            if not ticket.future.done():
                watch = ClientWatch(ctx, lambda: self._left(item))
                try:
                    outcome = await ticket.future
                finally:
                    watch.stop()
            else:
                outcome = ticket.future.result()
        finally:
            if item.queued:  # cancelled while waiting (the server stops)
                self.queue.remove(item)
                self._observer.flow_queued(klass.name, self.queue.depth(klass.name))
            if ticket.transit is not None:
                self.pressure.drop_transit(ticket.transit, tokens)
            waited = loop.time() - now
            self._observer.flow_waited(klass.name, waited)
            ctx.response_headers.append((b"x-gateway-queue-ms", str(round(waited * 1000)).encode()))
        if outcome == "go":
            typical = self._typical.get(klass.name)
            self._typical[klass.name] = (
                waited if typical is None else typical * WAIT_DECAY + waited * (1 - WAIT_DECAY)
            )
            if ticket.exclude:
                ctx.extras["flow_exclude"] = ticket.exclude
            if ticket.predicted:
                ctx.extras["flow_predicted"] = ticket.predicted
            ctx.extras["flow_waited"] = waited
            return
        if outcome == "gone":
            ctx.error_kind = "client_disconnect"
            raise ApiError(499, "The client closed the connection while its request was queued.")
        if outcome == "share":
            ctx.error_kind = "flow_share"
            raise self._share_used(
                klass,
                "your requests held more than your weighted share of its queued tokens, and a "
                "request of a tenant below its share took this one's place",
            )
        ctx.error_kind = "flow_deadline"
        raise self._saturated(klass, f"it waited {round(waited * 1000)} ms in the {klass.name!r} queue")

    def _left(self, item: Waiting) -> None:
        """The client of a queued request disconnected."""
        if self.queue.remove(item):
            self._observer.flow_queued(item.klass, self.queue.depth(item.klass))
            self._count_shed(item.klass, "disconnect")
            item.ref.future.set_result("gone")

    def _refused(self, ctx: RequestContext, klass: FlowClass, item: Waiting, refusal: str) -> ApiError:
        if refusal == "quota":
            self._count_shed(klass.name, "share")
            ctx.error_kind = "flow_share"
            held, total = self.queue.held(klass.name, item.tenant)
            return self._share_used(
                klass,
                f"your requests hold {held:,} of its {total:,} queued tokens, at least your "
                "weighted share, while the fleet is saturated",
            )
        self._count_shed(klass.name, "full")
        ctx.error_kind = "flow_full"
        return self._saturated(klass, f"the {klass.name!r} queue is full ({klass.max_depth} requests wait)")

    def _share_used(self, klass: FlowClass, why: str) -> ApiError:
        wait = self._retry_after(klass)
        return ApiError(
            429,
            f"Your share of the {klass.name!r} queue is used up: {why}. Please try again in {wait}s.",
            type="requests",
            code="rate_limit_exceeded",
            headers={"retry-after": str(wait)},
        )

    def _saturated(self, klass: FlowClass, why: str) -> ApiError:
        wait = self._retry_after(klass)
        return ApiError(
            503,
            f"The fleet is saturated: no backend can take your request now ({why}). "
            f"Please try again in {wait}s.",
            type="server_error",
            code="fleet_saturated",
            headers={"retry-after": str(wait)},
        )

    def _retry_after(self, klass: FlowClass) -> int:
        """Whole seconds until a retry is likely to be served: the class's typical wait lately."""
        typical = self._typical.get(klass.name, 1.0)
        return max(RETRY_MIN_S, min(RETRY_MAX_S, math.ceil(typical)))

    def _count_shed(self, klass: str, reason: str) -> None:
        key = (klass, reason)
        self.shed[key] = self.shed.get(key, 0) + 1
        self._observer.flow_shed(klass, reason)

    # -- releasing --------------------------------------------------------------------------------
    def wake(self) -> None:
        """Something changed on a backend: a pass over the queue soon (one per loop turn)."""
        if len(self.queue) and not self._pass_due:
            self._pass_due = True
            asyncio.get_running_loop().call_soon(self._release)

    def _release(self) -> None:
        """Release every waiting request a backend can take now, in the queue's order."""
        self._pass_due = False
        queue = self.queue
        if not len(queue):
            return
        now = time.monotonic()
        others_top = self._others_top()
        pressure = self.pressure
        classes = self.classes
        blocked: set[tuple[str, frozenset[str] | None]] = set()

        def can_start(w: Waiting) -> bool:
            klass = classes[w.klass]
            if others_top < klass.priority:
                return False
            ticket: _Ticket = w.ref
            where = (ticket.model, ticket.pools)
            if where in blocked:
                return False
            state, exclude, predicted = pressure.check(ticket.model, ticket.tokens, klass, now, ticket.pools)
            if state in (FULL, HOLD):
                blocked.add(where)  # nothing less urgent for these backends overtakes it
                return False
            ticket.exclude, ticket.predicted = exclude, predicted
            return True

        while True:
            item = queue.pop(can_start)
            if item is None:
                break
            ticket = item.ref
            self._observer.flow_queued(item.klass, queue.depth(item.klass))
            soonest = pressure.soonest(ticket.model, ticket.exclude, now, ticket.pools, classes[item.klass])
            if soonest is not None:
                ticket.transit = soonest.name
                pressure.add_transit(soonest.name, ticket.tokens)
            ticket.future.set_result("go")
            blocked.clear()

    def _expire(self) -> None:
        for item in self.queue.expired(asyncio.get_running_loop().time()):
            self._observer.flow_queued(item.klass, self.queue.depth(item.klass))
            self._count_shed(item.klass, "deadline")
            item.ref.future.set_result("deadline")

    def _engage(self) -> None:
        if self._ticker is None or self._ticker.done():
            self._observer.flow_saturated(True)
            self._ticker = asyncio.get_running_loop().create_task(self._tick())

    async def _tick(self) -> None:
        """While anything waits: expire deadlines, pass over the queue, keep the shared view fresh."""
        loop = asyncio.get_running_loop()
        try:
            while len(self.queue):
                due = loop.time() + TICK_S
                deadline = self.queue.next_deadline()
                if deadline is not None and deadline < due:
                    due = deadline
                await asyncio.sleep(max(0.0, due - loop.time()))
                self._expire()
                self._release()
                self._refresh(loop.time())
                self._rescrape(loop.time())
        finally:
            self._observer.flow_saturated(False)
        if self.refresh is not None:  # the others stop holding for what waited here at once
            self._refreshing = loop.create_task(self.refresh())

    def _refresh(self, now: float) -> None:
        if self.refresh is None or not len(self.queue) or now - self._refreshed_at < SHARE_REFRESH_S:
            return
        if self._refreshing is not None and not self._refreshing.done():
            return
        self._refreshed_at = now
        self._refreshing = asyncio.get_running_loop().create_task(self.refresh())

    def _rescrape(self, now: float) -> None:
        if self.scrape is None or not len(self.queue) or now - self._scraped_at < SCRAPE_WHILE_QUEUED_S:
            return
        if self._scraping is not None and not self._scraping.done():
            return
        self._scraped_at = now
        self._scraping = asyncio.get_running_loop().create_task(self._scraped())

    async def _scraped(self) -> None:
        assert self.scrape is not None
        await self.scrape()
        self.wake()

    async def aclose(self) -> None:
        tasks = [t for t in (self._ticker, self._refreshing, self._scraping) if t is not None]
        if tasks:
            await cancel_and_wait(tasks, within_s=2.0, what="the flow queue's tick")

    # -- the lease watch (gateway/upstream/lease.py) ----------------------------------------------
    def opened(self, backend: Backend) -> int:
        return self.pressure.prefill(backend)

    def first_token(self, backend: Backend, seconds: float, tokens: int) -> None:
        self.pressure.ttft.observe(backend.name, seconds, tokens)
        self.wake()

    def ended(self, backend: Backend) -> None:
        self.wake()
